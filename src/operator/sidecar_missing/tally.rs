//! The pods judged so far, by uid: which of them run without the sidecar they asked for, and
//! so how many each namespace has. A pod's containers cannot change once it is created, so a
//! verdict holds for the pod's life: each pod is read and warned about once.

use std::collections::{BTreeMap, BTreeSet};

/// The verdicts, and the uids a re-list has named so far.
#[derive(Default)]
pub struct Tally {
    /// By uid: the pod's namespace, and whether it runs without its sidecar.
    judged: BTreeMap<String, (String, bool)>,
    /// While the watch re-lists: the uids it has named (those it does not name are gone).
    relisted: Option<BTreeSet<String>>,
}

impl Tally {
    /// Whether `uid` was judged already; during a re-list, notes that the pod is still there.
    pub fn knows(&mut self, uid: &str) -> bool {
        if let Some(seen) = &mut self.relisted {
            seen.insert(uid.to_string());
        }
        self.judged.contains_key(uid)
    }

    /// Records the verdict on pod `uid` of `namespace`.
    pub fn judge(&mut self, uid: &str, namespace: &str, missing: bool) {
        self.judged
            .insert(uid.to_string(), (namespace.to_string(), missing));
    }

    /// Forgets pod `uid` (deleted, or no longer asking); the namespace whose count fell, if any.
    pub fn forget(&mut self, uid: &str) -> Option<String> {
        match self.judged.remove(uid) {
            Some((namespace, true)) => Some(namespace),
            _ => None,
        }
    }

    /// The watch starts listing every pod again.
    pub fn relisting(&mut self) {
        self.relisted = Some(BTreeSet::new());
    }

    /// The re-list is done: forgets the pods it did not name (deleted meanwhile); the
    /// namespaces whose count fell.
    pub fn relisted(&mut self) -> BTreeSet<String> {
        let seen = self.relisted.take().unwrap_or_default();
        let gone: Vec<String> = (self.judged.keys())
            .filter(|uid| !seen.contains(*uid))
            .cloned()
            .collect();
        gone.iter().filter_map(|uid| self.forget(uid)).collect()
    }

    /// How many pods of `namespace` run without their sidecar.
    pub fn missing_in(&self, namespace: &str) -> usize {
        (self.judged.values())
            .filter(|(ns, missing)| *missing && ns == namespace)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_counts_its_pods_without_sidecar_until_they_go() {
        let mut t = Tally::default();
        t.judge("a", "x", true);
        t.judge("b", "x", true);
        t.judge("c", "x", false);
        t.judge("d", "y", true);
        assert_eq!((t.missing_in("x"), t.missing_in("y")), (2, 1));
        assert!(t.knows("c"), "a pod with its sidecar is judged once too");
        assert_eq!(t.forget("a"), Some("x".into()));
        assert_eq!(t.forget("c"), None, "had its sidecar: no count fell");
        assert_eq!(t.forget("zz"), None);
        assert_eq!(t.missing_in("x"), 1);
    }

    #[test]
    fn a_relist_forgets_the_pods_it_does_not_name() {
        let mut t = Tally::default();
        t.judge("a", "x", true);
        t.judge("b", "y", true);
        t.judge("c", "y", false);
        t.relisting();
        assert!(t.knows("a"));
        assert!(!t.knows("new"));
        assert_eq!(t.relisted(), BTreeSet::from(["y".to_string()]));
        assert_eq!((t.missing_in("x"), t.missing_in("y")), (1, 0));
        assert!(!t.knows("c"), "forgotten");
    }
}
