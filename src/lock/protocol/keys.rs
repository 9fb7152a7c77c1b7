//! The etcd key layout. Only the engine and its [`Store`](crate::lock::Store) know it.
//!
//! ```text
//! /podlock/v1/config/{namespace}/{lock}                     Settings (JSON), no lease
//! /podlock/v1/queue/{namespace}/{lock}/{lease:016x}/{holder} Entry (JSON), bound to the lease
//! /podlock/v1/queue/{namespace}/.released/{lock}/{lease:016x}/{slot}
//!                                                           the key a release there deleted
//!                                                           (see `receipt`), bound to the lease
//! /podlock/v1/credentials/{namespace}                       the namespace's etcd password
//! /podlock/v1/secrets/{namespace}[/{cluster}]               what its credentials Secret holds
//! /podlock/v1/config/{namespace}/.released/{lock}/{lease:016x}/{holder}
//!                                                           why the operator ended that hold
//! /podlock/v1/declared/{namespace}/{lock}/{cluster}          a named cluster declares the lock
//! /podlock/v1/retired/{namespace}/{lock}                    the token epoch of a removed lock
//! ```
//!
//! Settings and queues live under separate prefixes so that a role can be granted read-only
//! access to one namespace's settings and read-write access to its queues. A queue key's
//! create revision orders the queue and is the holder's fencing token.

use super::names::LockId;

const ROOT: &str = "/podlock/v1";

impl LockId {
    /// The key holding this lock's settings.
    pub(in crate::lock) fn config_key(&self) -> String {
        format!("{ROOT}/config/{}/{}", self.namespace, self.name)
    }

    /// The prefix under which contenders queue.
    pub(in crate::lock) fn queue_prefix(&self) -> String {
        format!("{ROOT}/queue/{}/{}/", self.namespace, self.name)
    }

    /// The prefix of the clusters' declarations of this lock (see `shared`).
    pub(in crate::lock) fn declared_prefix(&self) -> String {
        format!("{ROOT}/declared/{}/{}/", self.namespace, self.name)
    }

    /// The key that keeps the token epoch of this lock while it is removed (see
    /// `settings::retire`): outside the settings prefix, so no namespace's role reads it.
    pub(in crate::lock) fn retired_key(&self) -> String {
        format!("{ROOT}/retired/{}/{}", self.namespace, self.name)
    }

    /// The key of the release receipt at `slot` of `lease` in this lock (see `receipt`):
    /// under the namespace's queues, which its role may write, and in no lock's queue, since a
    /// lock name cannot start with '.'.
    pub(in crate::lock) fn receipt_key(&self, lease: i64, slot: u32) -> String {
        format!("{}{lease:016x}/{slot}", self.receipts_prefix())
    }

    /// The prefix of every release receipt of this lock: its removal removes them with it,
    /// rather than leave them for their leases to end.
    pub(in crate::lock) fn receipts_prefix(&self) -> String {
        format!("{ROOT}/queue/{}/.released/{}/", self.namespace, self.name)
    }

    /// The queue key of one holder id under one lease.
    pub(in crate::lock) fn entry_key(&self, lease: i64, holder_id: &str) -> String {
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

/// Whether `key` is a queue key (else a settings key).
pub fn is_queue_key(key: &[u8]) -> bool {
    // Read for every key the operator's watch reports: no allocation.
    key.strip_prefix(ROOT.as_bytes())
        .is_some_and(|rest| rest.starts_with(b"/queue/"))
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

/// The note beside an administrator's release of the hold of `holder` on `lease` in `lock`'s
/// queue (see `released`): under the namespace's settings prefix, which its role may read but
/// not write, and never a lock's settings key (a lock name cannot start with '.').
pub fn release_note_key(lock: &LockId, lease: i64, holder: &str) -> String {
    format!("{}{lease:016x}/{holder}", release_notes_prefix(lock))
}

/// The prefix of every release note of `lock`: its removal removes them with it, rather than
/// leave them for their leases to end.
pub fn release_notes_prefix(lock: &LockId) -> String {
    format!("{ROOT}/config/{}/.released/{}/", lock.namespace, lock.name)
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

/// Where the operator of `cluster` (empty: unnamed) records what it last wrote into a
/// namespace's credentials Secret (see `operator::isolation`): as unreadable to namespaces as
/// the password. One per cluster, as each cluster has a Secret of its own.
pub fn secret_record_key(namespace: &str, cluster: &str) -> String {
    match cluster {
        "" => format!("{ROOT}/secrets/{namespace}"),
        cluster => format!("{ROOT}/secrets/{namespace}/{cluster}"),
    }
}

/// The prefix of every lock's queue in a namespace (all namespaces when `None`).
pub fn queue_root(namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("{ROOT}/queue/{ns}/"),
        None => format!("{ROOT}/queue/"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_their_lock() {
        let lock = |k: &str| lock_of_key(k.as_bytes()).map(|l| l.to_string());
        assert_eq!(lock("/podlock/v1/config/ns/a").as_deref(), Some("ns/a"));
        assert_eq!(lock("/podlock/v1/queue/ns/a/00000001/h").as_deref(), Some("ns/a"));
        assert_eq!(lock("/podlock/v1/queue/ns/"), None);
        assert_eq!(lock("/other/v1/config/ns/a"), None);
        assert_eq!(lock(&readiness_key()), None);
        assert!(is_queue_key(b"/podlock/v1/queue/ns/a/00000001/h"));
        assert!(!is_queue_key(b"/podlock/v1/config/ns/a"));
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
}
