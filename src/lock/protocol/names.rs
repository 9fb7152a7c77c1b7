//! The names podlock checks before anything reaches etcd: a lock's identity (namespace and
//! name), container names and holder ids, and unique holder ids. Its errors are [`InvalidName`]
//! (a [`LockError::Invalid`](crate::lock::LockError::Invalid) to callers), so that the error type can
//! name a [`LockId`] without this module depending on it.

use std::fmt;

/// A name that breaks its rule; the message says the rule.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InvalidName(String);

/// A lock's identity: its namespace and name (in the API's JSON, `namespace` and `lock`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct LockId {
    /// The Kubernetes namespace the lock belongs to.
    pub namespace: String,
    /// The lock's name (a DNS-1123 subdomain).
    #[serde(rename = "lock")]
    pub name: String,
}

impl fmt::Display for LockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl LockId {
    /// Builds a lock id, checking both parts are valid Kubernetes names.
    pub fn new(namespace: &str, name: &str) -> Result<Self, InvalidName> {
        check_dns_subdomain("lock name", name)?;
        check_dns_subdomain("namespace", namespace)?;
        Ok(LockId {
            namespace: namespace.into(),
            name: name.into(),
        })
    }
}

/// A Kubernetes name rule: DNS-1123 subdomains (lock names, namespaces) and labels
/// (container names) differ only in their length and in allowing '.'.
struct Rule {
    max: usize,
    dots: bool,
}

impl Rule {
    fn allows(&self, value: &str) -> bool {
        let ok_char =
            |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (self.dots && c == '.');
        let ok_end = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        !value.is_empty()
            && value.len() <= self.max
            && value.chars().all(ok_char)
            && ok_end(value.chars().next())
            && ok_end(value.chars().last())
    }
}

const SUBDOMAIN: Rule = Rule { max: 253, dots: true };
const LABEL: Rule = Rule { max: 63, dots: false };

/// Checks `value` is a DNS-1123 subdomain: at most 253 characters of lower-case letters,
/// digits, '-' and '.', starting and ending with a letter or digit.
pub fn check_dns_subdomain(what: &str, value: &str) -> Result<(), InvalidName> {
    if SUBDOMAIN.allows(value) {
        return Ok(());
    }
    Err(InvalidName(format!(
        "{what} {value:?} is not a valid Kubernetes name: use 1 to 253 lower-case letters, \
         digits, '-' or '.', starting and ending with a letter or digit"
    )))
}

/// Checks a container name: a DNS-1123 label (1 to 63 lower-case letters, digits and '-',
/// starting and ending with a letter or digit), as Kubernetes requires of container names.
pub fn check_container(value: &str) -> Result<(), InvalidName> {
    if LABEL.allows(value) {
        return Ok(());
    }
    Err(InvalidName(format!(
        "container {value:?} is not a Kubernetes container name: use 1 to 63 lower-case \
         letters, digits or '-', starting and ending with a letter or digit (pass \
         $PODLOCK_CONTAINER, which the injector sets)"
    )))
}

/// Parses a cluster name (`--cluster-name`, `PODLOCK_CLUSTER`): empty (the only cluster), or a
/// DNS-1123 label, as the status and the logs show it.
pub fn cluster_name(value: &str) -> Result<String, InvalidName> {
    if value.is_empty() || LABEL.allows(value) {
        return Ok(value.to_string());
    }
    Err(InvalidName(format!(
        "cluster name {value:?} is not a DNS-1123 label: use 1 to 63 lower-case letters, \
         digits or '-', starting and ending with a letter or digit"
    )))
}

/// Whether `c` may appear in a holder id.
fn holder_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')
}

/// Checks a holder id: 1 to 253 characters of letters, digits, '-', '_', '.' and ':'.
pub fn check_holder_id(value: &str) -> Result<(), InvalidName> {
    if value.is_empty() || value.len() > 253 || !value.chars().all(holder_char) {
        return Err(InvalidName(format!(
            "holderId {value:?} is invalid: use 1 to 253 letters, digits, '-', '_', '.' or ':'"
        )));
    }
    Ok(())
}

/// `base` made unique to one connection or process: `base:` and 16 random hex digits, `base`
/// cut short (and stripped of characters a holder id may not have) to keep the id valid.
/// Containers of one pod share a hostname and may share PIDs, so neither alone is unique.
pub fn unique_holder_id(base: &str) -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the OS random source works");
    let suffix: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let base: String = base.chars().filter(|c| holder_char(*c)).take(253 - 17).collect();
    format!("{base}:{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_dns_1123() {
        assert!(LockId::new("default", "db-migration.v2").is_ok());
        for bad in [
            "",
            "Upper",
            "-lead",
            "trail-",
            "has/slash",
            "sp ace",
            &"a".repeat(254),
        ] {
            assert!(LockId::new("default", bad).is_err(), "{bad:?} accepted");
        }
        assert!(LockId::new("Bad_NS", "x").is_err());
    }

    #[test]
    fn holder_ids_are_restricted() {
        assert!(check_holder_id("web-7d9f:worker_1.a").is_ok());
        assert!(check_holder_id("a/b").is_err());
        assert!(check_holder_id("").is_err());
        assert!(check_container("istio-proxy").is_ok());
        for bad in ["", "App", "a.b", "-a", &"a".repeat(64)] {
            assert!(check_container(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn unique_ids_are_valid_and_differ() {
        let (a, b) = (unique_holder_id("web/1 x"), unique_holder_id("web/1 x"));
        assert_ne!(a, b);
        assert!(check_holder_id(&a).is_ok(), "{a}");
        assert!(a.starts_with("web1x:"), "{a}");
        assert!(check_holder_id(&unique_holder_id(&"a".repeat(400))).is_ok());
    }
}
