//! Queue keys an etcd restore brought back (issue #40, finding 2).
//!
//! A restore from a snapshot brings back the holds and waits of the snapshot's moment, among
//! them holds released since. With `--bump-revision` etcd's revisions go on above every earlier
//! one, so nothing in etcd says that it went back: the brought-back key of a released hold sits
//! at the head of its queue, on its sidecar's live lease, and every view of the lock (status,
//! `GET`, the holder Service, the fence check) names it as holding until its sidecar's orphan
//! sweep removes it.
//!
//! The operator's etcd watch can tell. It follows every queue key, so it knows which keys are
//! alive as far as it has followed etcd: up to a revision (`Known`'s `upto`) below which no key
//! can be created any more. When the watch breaks (as it does when etcd restarts) it reads every
//! queue again. A key read then whose create revision lies at or below `upto` and which it did
//! not know alive had ended before, and etcd has no way to create it again: etcd went back. Its
//! lock is marked ([`Returned`]), and the next reconcile publishes the lock under a new epoch,
//! which removes its queue (`protocol::epoch::Renewal::Returned`). A re-read at a revision below `upto`
//! (a wipe, a restore without a bump) marks nothing: those have their own renewals, and keys
//! created since would look brought back.
//!
//! What it cannot see: a restore while no operator leads (a new leader knows nothing yet), and a
//! key created between the operator's last event and the snapshot, if its watch lagged.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use tracing::warn;

use crate::lock::{LockId, QueueEntry};

/// The locks with keys a restore brought back, until they are published under a new epoch.
#[derive(Debug, Default)]
pub struct Returned(Mutex<HashSet<LockId>>);

impl Returned {
    /// Whether `lock` must move to a new epoch.
    pub fn pending(&self, lock: &LockId) -> bool {
        self.0.lock().unwrap().contains(lock)
    }

    /// `lock` was published under a new epoch (or by another cluster, which sees for itself).
    pub fn done(&self, lock: &LockId) {
        self.0.lock().unwrap().remove(lock);
    }

    fn mark(&self, lock: LockId) {
        self.0.lock().unwrap().insert(lock);
    }
}

/// The queue keys alive as far as the operator's watch has followed etcd.
#[derive(Debug, Default)]
pub struct Known {
    /// Each key's create revision.
    keys: HashMap<String, i64>,
    /// Every key created at or below this revision is in `keys` if it is alive.
    upto: i64,
}

impl Known {
    /// A key put (created, or rewritten).
    pub fn put(&mut self, entry: &QueueEntry) {
        self.keys.insert(entry.key.clone(), entry.revision);
        self.upto = self.upto.max(entry.revision);
    }

    /// A key deleted.
    pub fn remove(&mut self, key: &str) {
        self.keys.remove(key);
    }

    /// Every queue read again at `revision`: marks in `returned` the locks of keys that had
    /// ended before and came back, then knows exactly `entries`.
    pub fn reread(&mut self, entries: &[QueueEntry], revision: i64, returned: &Returned) {
        if self.upto > 0 && revision >= self.upto {
            for e in entries.iter().filter(|e| self.came_back(e)) {
                warn!(lock = %e.lock, key = e.key, revision = e.revision, "etcd brought back a queue key that had ended (restored from an older snapshot): the lock moves to a new token epoch");
                returned.mark(e.lock.clone());
            }
        }
        self.keys = (entries.iter()).map(|e| (e.key.clone(), e.revision)).collect();
        self.upto = revision;
    }

    fn came_back(&self, entry: &QueueEntry) -> bool {
        entry.revision <= self.upto && self.keys.get(&entry.key) != Some(&entry.revision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, revision: i64) -> QueueEntry {
        QueueEntry {
            lock: LockId::new("ns", "l").unwrap(),
            key: format!("/podlock/v1/queue/ns/l/00ff/{name}"),
            revision,
            lease: 255,
            entry: None,
        }
    }

    #[test]
    fn a_key_that_ended_and_came_back_marks_its_lock() {
        let (mut known, returned) = (Known::default(), Returned::default());
        known.reread(&[entry("a", 5)], 6, &returned);
        known.put(&entry("b", 7));
        known.remove(&entry("a", 5).key);
        let lock = LockId::new("ns", "l").unwrap();
        known.reread(&[entry("b", 7), entry("c", 9)], 1_000_010, &returned);
        assert!(!returned.pending(&lock), "b is alive, c is new");
        known.reread(&[entry("a", 5), entry("b", 7)], 1_000_020, &returned);
        assert!(returned.pending(&lock), "a had ended");
        returned.done(&lock);
        assert!(!returned.pending(&lock));
    }

    #[test]
    fn a_reread_below_what_was_followed_marks_nothing() {
        let (mut known, returned) = (Known::default(), Returned::default());
        known.reread(&[], 50, &returned);
        known.reread(&[entry("a", 3)], 4, &returned);
        assert!(
            !returned.pending(&LockId::new("ns", "l").unwrap()),
            "a wipe's new key"
        );
    }
}
