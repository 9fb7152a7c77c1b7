//! When the holds with a maximum hold time began, as the operator reckons them (the
//! reconciler's `deadline` ends a hold past it): kept in the operator's context, which every
//! wing of the operator shares.
//!
//! A hold begins when its holder learns of its grant, never earlier: its sidecar stamps that
//! moment as `acquiredAt`, starts its own deadline from it, and records it in the entry within
//! milliseconds (`MARK_DELAY` for a mutex). Until that record lands, the operator cannot know
//! the moment: it sees a grant as soon as etcd makes it (a handoff's write, the deletion of the
//! key ahead), and the holder may learn of it much later (its sidecar stalled, its watch
//! behind). So an unrecorded grant begins, for the operator, a lease TTL after it first saw it
//! hold: a sidecar that has not learned of its grant by then has not kept its lease alive
//! either (a stalled process), or cannot read etcd at all, and then holds nothing its app was
//! told of. Issue #54, finding 8: starting at first sight ended holds before their holders had
//! learned of them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::lock::{Entry, LockId, QueueEntry};

/// When each held entry with a maximum hold time began, as this operator reckons it, by lock
/// and create revision.
#[derive(Default)]
pub struct Clocks(Mutex<HashMap<LockId, HashMap<i64, SystemTime>>>);

impl Clocks {
    /// When each of `held` (the lock's timed holders, read `now`) began: its recorded grant,
    /// else a lease TTL after this operator first saw it hold (see the module's doc). Forgets
    /// the lock's holds that are gone. Public for the seeded world (tests/sim), whose operator
    /// ends holds past their deadline by this clock, on its own simulated time.
    pub fn started(&self, lock: &LockId, held: &[QueueEntry], now: SystemTime) -> Vec<SystemTime> {
        let mut all = self.0.lock().unwrap();
        let seen = all.remove(lock).unwrap_or_default();
        let firsts: HashMap<i64, SystemTime> = (held.iter())
            .map(|e| (e.revision, seen.get(&e.revision).copied().unwrap_or(now)))
            .collect();
        let started = (held.iter())
            .map(|e| began(e.entry.as_ref(), firsts[&e.revision]))
            .collect();
        if !firsts.is_empty() {
            all.insert(lock.clone(), firsts);
        }
        started
    }

    /// Forgets a lock (deleted).
    pub fn forget(&self, lock: &LockId) {
        self.0.lock().unwrap().remove(lock);
    }
}

/// When a hold with `entry`, first seen holding at `first_seen`, began: the grant its entry
/// records (`acquiredAt`), else the latest moment its holder can have learned of it.
fn began(entry: Option<&Entry>, first_seen: SystemTime) -> SystemTime {
    let recorded = entry
        .and_then(|e| e.acquired_at.as_deref())
        .and_then(|at| humantime::parse_rfc3339(at).ok());
    let ttl = entry.map_or(0, |e| e.ttl_seconds);
    recorded.unwrap_or(first_seen + Duration::from_secs(ttl.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(acquired_at: Option<&str>) -> Entry {
        let json = serde_json::json!({
            "holderId": "b", "pod": {"namespace": "ns", "name": "pod-b"},
            "requestedAt": "2026-12-07T10:00:00.000Z", "acquiredAt": acquired_at,
            "ttlSeconds": 60, "heartbeatTimeoutSeconds": 0, "maxHoldSeconds": 1,
        });
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_hold_begins_at_its_recorded_grant_else_a_ttl_after_it_was_first_seen() {
        let seen = humantime::parse_rfc3339("2026-12-07T10:00:05Z").unwrap();
        let recorded = entry(Some("2026-12-07T10:00:09.500Z"));
        let at = humantime::parse_rfc3339("2026-12-07T10:00:09.500Z").unwrap();
        assert_eq!(began(Some(&recorded), seen), at, "learned 4.5 s after first seen");
        // Not recorded: the holder may not know yet; it would by the lease's TTL.
        assert_eq!(began(Some(&entry(None)), seen), seen + Duration::from_secs(60));
    }
}
