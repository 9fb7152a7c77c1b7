//! The etcd key layout and the records stored under it.
//!
//! ```text
//! /podlock/v1/config/{namespace}/{lock}                     Settings (JSON), no lease
//! /podlock/v1/queue/{namespace}/{lock}/{lease:016x}/{holder} Entry (JSON), bound to the lease
//! ```
//!
//! Settings and queues live under separate prefixes so that a role can be granted read-only
//! access to one namespace's settings and read-write access to its queues. A queue key's
//! create revision orders the queue and is the holder's fencing token.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::SystemTime;

use super::LockError;

const ROOT: &str = "/podlock/v1";

/// A lock's identity: its namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockId {
    /// The Kubernetes namespace the lock belongs to.
    pub namespace: String,
    /// The lock's name (a DNS-1123 subdomain).
    pub name: String,
}

impl fmt::Display for LockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl LockId {
    /// Builds a lock id, checking both parts are valid Kubernetes names.
    pub fn new(namespace: &str, name: &str) -> Result<Self, LockError> {
        check_dns_subdomain("lock name", name)?;
        check_dns_subdomain("namespace", namespace)?;
        Ok(LockId {
            namespace: namespace.into(),
            name: name.into(),
        })
    }

    /// The key holding this lock's settings.
    pub fn config_key(&self) -> String {
        format!("{ROOT}/config/{}/{}", self.namespace, self.name)
    }

    /// The prefix under which contenders queue.
    pub fn queue_prefix(&self) -> String {
        format!("{ROOT}/queue/{}/{}/", self.namespace, self.name)
    }

    /// The queue key of one holder id under one lease.
    pub fn entry_key(&self, lease: i64, holder_id: &str) -> String {
        format!("{}{lease:016x}/{holder_id}", self.queue_prefix())
    }
}

/// The lock a settings or queue key belongs to.
pub fn lock_of_key(key: &[u8]) -> Option<LockId> {
    let rest = std::str::from_utf8(key).ok()?.strip_prefix(ROOT)?;
    let mut parts = rest.strip_prefix('/')?.split('/');
    match (parts.next()?, parts.next(), parts.next()) {
        ("config" | "queue", Some(ns), Some(name)) => LockId::new(ns, name).ok(),
        _ => None,
    }
}

/// A key nobody writes, read to see whether etcd answers.
pub fn readiness_key() -> String {
    format!("{ROOT}/readyz")
}

/// The key of the operator's etcd round trip on `lease` (see `Store::round_trip`).
pub fn check_key(lease: i64) -> String {
    format!("{ROOT}/check/{lease:016x}")
}

/// The lock and holder id of a queue key written by [`LockId::entry_key`].
pub fn parse_entry_key(key: &str) -> Option<(LockId, String)> {
    let rest = key.strip_prefix(ROOT)?.strip_prefix("/queue/")?;
    let mut parts = rest.split('/');
    let (ns, name, _lease, holder) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let lock = LockId::new(ns, name).ok()?;
    Some((lock, holder.to_string()))
}

/// The prefix of every lock's settings in a namespace (all namespaces when `None`).
pub fn config_prefix(namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("{ROOT}/config/{ns}/"),
        None => format!("{ROOT}/config/"),
    }
}

/// Where the operator records a namespace's etcd password: outside the config and queue
/// prefixes, so no namespace's role can read it.
pub fn credentials_key(namespace: &str) -> String {
    format!("{ROOT}/credentials/{namespace}")
}

/// The prefix of every lock's queue in a namespace (all namespaces when `None`).
pub fn queue_root(namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("{ROOT}/queue/{ns}/"),
        None => format!("{ROOT}/queue/"),
    }
}

/// Checks `value` is a DNS-1123 subdomain: at most 253 characters of lower-case letters,
/// digits, '-' and '.', starting and ending with a letter or digit.
pub fn check_dns_subdomain(what: &str, value: &str) -> Result<(), LockError> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let ok_end = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if value.is_empty()
        || value.len() > 253
        || !value.chars().all(ok_char)
        || !ok_end(value.chars().next())
        || !ok_end(value.chars().last())
    {
        return Err(LockError::Invalid(format!(
            "{what} {value:?} is not a valid Kubernetes name: use 1 to 253 lower-case letters, \
             digits, '-' or '.', starting and ending with a letter or digit"
        )));
    }
    Ok(())
}

/// Checks a container name: a DNS-1123 label (1 to 63 lower-case letters, digits and '-',
/// starting and ending with a letter or digit), as Kubernetes requires of container names.
pub fn check_container(value: &str) -> Result<(), LockError> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    let ok_end = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if value.is_empty()
        || value.len() > 63
        || !value.chars().all(ok_char)
        || !ok_end(value.chars().next())
        || !ok_end(value.chars().last())
    {
        return Err(LockError::Invalid(format!(
            "container {value:?} is not a Kubernetes container name: use 1 to 63 lower-case \
             letters, digits or '-', starting and ending with a letter or digit (pass \
             $PODLOCK_CONTAINER, which the injector sets)"
        )));
    }
    Ok(())
}

/// Checks a holder id: 1 to 253 characters of letters, digits, '-', '_', '.' and ':'.
pub fn check_holder_id(value: &str) -> Result<(), LockError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
    if value.is_empty() || value.len() > 253 || !value.chars().all(ok_char) {
        return Err(LockError::Invalid(format!(
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
    let ok_char = |c: &char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
    let base: String = base.chars().filter(ok_char).take(253 - 17).collect();
    format!("{base}:{suffix}")
}

/// A lock's settings, as declared by a DistributedLock or `podlock declare`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// etcd lease TTL behind every holder and waiter.
    pub ttl_seconds: u32,
    /// 1 for a mutex, N for a counting semaphore.
    pub max_holders: u32,
    /// 0: a hold lives as long as its pod; >0: the app must heartbeat within this window.
    pub heartbeat_timeout_seconds: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ttl_seconds: TTL.default,
            max_holders: MAX_HOLDERS.default,
            heartbeat_timeout_seconds: HEARTBEAT.default,
        }
    }
}

/// A setting's name, bounds and default: the one place they are written. The engine, the
/// sidecar's request parsing and flags, `podlock declare` and the CRD's schema all take them
/// from here.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// The field's name in the API and the CRD.
    pub field: &'static str,
    /// The smallest value allowed.
    pub min: u32,
    /// The largest value allowed.
    pub max: u32,
    /// The value when none is given.
    pub default: u32,
}

/// `ttlSeconds`: the etcd lease TTL behind every holder and waiter.
pub const TTL: Bound = Bound {
    field: "ttlSeconds",
    min: 2,
    max: 3600,
    default: 15,
};
/// `maxHolders`: 1 for a mutex, N for a semaphore.
pub const MAX_HOLDERS: Bound = Bound {
    field: "maxHolders",
    min: 1,
    max: 10000,
    default: 1,
};
/// `heartbeatTimeoutSeconds`: 0 for none.
pub const HEARTBEAT: Bound = Bound {
    field: "heartbeatTimeoutSeconds",
    min: 0,
    max: 3600,
    default: 0,
};

impl Bound {
    /// `value` if it lies within the bounds; else an error naming the field and the bounds.
    pub fn check(&self, value: u32) -> Result<u32, LockError> {
        if value < self.min || value > self.max {
            return Err(LockError::Invalid(format!(
                "{} must be between {} and {}, got {value}",
                self.field, self.min, self.max
            )));
        }
        Ok(value)
    }

    /// The bounds as a range, for a command-line flag's parser.
    pub fn range(&self) -> std::ops::RangeInclusive<i64> {
        i64::from(self.min)..=i64::from(self.max)
    }
}

impl Settings {
    /// Checks every field against the contract's bounds.
    pub fn validate(&self) -> Result<(), LockError> {
        TTL.check(self.ttl_seconds)?;
        MAX_HOLDERS.check(self.max_holders)?;
        HEARTBEAT.check(self.heartbeat_timeout_seconds)?;
        Ok(())
    }
}

/// The pod a sidecar serves, recorded in every entry so the operator can revoke a dead pod's
/// holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid (empty outside Kubernetes).
    #[serde(default)]
    pub uid: String,
}

/// How a hold shares its lock (a lock with `maxHolders` 1: a reader-writer lock).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Alone: no other holder while it holds.
    #[default]
    Exclusive,
    /// With the other shared holders ahead of it, but never beside an exclusive one.
    Shared,
}

impl Mode {
    /// Whether this is the default, exclusive mode.
    pub fn is_exclusive(&self) -> bool {
        *self == Mode::Exclusive
    }

    /// How the API and the status name it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
        }
    }
}

/// The value of a queue key: who asked, for which pod, and when.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// The holder id the app chose (default: the pod name).
    pub holder_id: String,
    /// The pod whose sidecar wrote the entry.
    pub pod: PodRef,
    /// When the acquire request was made (RFC 3339).
    pub requested_at: String,
    /// When a waiter became a holder; absent for a hold granted at once (then it equals
    /// `requested_at`) and for a waiter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<String>,
    /// The lease TTL of this hold.
    pub ttl_seconds: u32,
    /// The heartbeat window of this hold (0: none).
    pub heartbeat_timeout_seconds: u32,
    /// The app container that asked, if the app named it (`PODLOCK_CONTAINER`): the operator
    /// then judges restarts of that container only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// How the hold shares the lock (absent: exclusive).
    #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
    pub mode: Mode,
}

/// One holder of a lock, as reported by the API and mirrored into a DistributedLock's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HolderInfo {
    /// The holder id.
    pub holder_id: String,
    /// The holder's pod name.
    pub pod: String,
    /// The holder's fencing token (create revision of its queue key).
    pub fencing_token: i64,
    /// When the hold began (RFC 3339).
    pub acquired_at: String,
    /// How it shares the lock.
    pub mode: Mode,
}

impl HolderInfo {
    /// Reads a holder from a queue key-value pair; `None` when the value is not an entry.
    pub fn from_kv(kv: &etcd_client::KeyValue) -> Option<Self> {
        let entry: Entry = serde_json::from_slice(kv.value()).ok()?;
        Some(HolderInfo {
            fencing_token: kv.create_revision(),
            acquired_at: entry.acquired_at.unwrap_or(entry.requested_at),
            holder_id: entry.holder_id,
            pod: entry.pod.name,
            mode: entry.mode,
        })
    }
}

/// Formats a time as RFC 3339 with milliseconds, in UTC.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
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
    fn keys_map_to_their_lock() {
        let lock = |k: &str| lock_of_key(k.as_bytes()).map(|l| l.to_string());
        assert_eq!(lock("/podlock/v1/config/ns/a").as_deref(), Some("ns/a"));
        assert_eq!(lock("/podlock/v1/queue/ns/a/00000001/h").as_deref(), Some("ns/a"));
        assert_eq!(lock("/podlock/v1/queue/ns/"), None);
        assert_eq!(lock("/other/v1/config/ns/a"), None);
        assert_eq!(lock(&readiness_key()), None);
    }

    #[test]
    fn entry_keys_parse_back() {
        let lock = LockId::new("ns-a", "db.migration").unwrap();
        let key = lock.entry_key(0x1f, "web-1:42");
        assert_eq!(parse_entry_key(&key), Some((lock.clone(), "web-1:42".into())));
        assert_eq!(parse_entry_key(&lock.config_key()), None);
        assert_eq!(parse_entry_key(&format!("{key}/extra")), None);
    }

    #[test]
    fn keys_do_not_collide_across_prefixes() {
        let a = LockId::new("ns", "a").unwrap();
        let ab = LockId::new("ns", "ab").unwrap();
        assert!(!ab.queue_prefix().starts_with(&a.queue_prefix()));
        assert_eq!(a.entry_key(255, "h"), "/podlock/v1/queue/ns/a/00000000000000ff/h");
        assert_eq!(a.config_key(), "/podlock/v1/config/ns/a");
    }

    #[test]
    fn settings_bounds() {
        assert!(Settings::default().validate().is_ok());
        let bad = Settings {
            ttl_seconds: 1,
            ..Settings::default()
        };
        let msg = bad.validate().unwrap_err().to_string();
        assert!(msg.contains("ttlSeconds"), "{msg}");
        let bad = Settings {
            max_holders: 0,
            ..Settings::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("maxHolders"));
    }
}
