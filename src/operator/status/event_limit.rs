//! How often a lock gets a `HolderChanged` Event: at most once an interval.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::lock::LockId;

/// At most one `HolderChanged` Event per lock in this long. A busy lock changes hands many
/// times a second; its status always says who holds it now, and an Event per handoff would
/// flood the API server (the scale benchmark saw 76 Events/s at 95 handoffs/s).
pub const HOLDER_EVENT_EVERY: Duration = Duration::from_secs(10);

/// When each lock last got a `HolderChanged` Event.
#[derive(Default)]
pub struct EventLimit(Mutex<HashMap<LockId, Instant>>);

impl EventLimit {
    /// Whether `lock` may have an Event now (and if so, counts it as had).
    pub fn allow(&self, lock: &LockId) -> bool {
        let mut last = self.0.lock().unwrap();
        let now = Instant::now();
        match last.get(lock) {
            Some(at) if now.duration_since(*at) < HOLDER_EVENT_EVERY => false,
            _ => {
                last.insert(lock.clone(), now);
                true
            }
        }
    }

    /// Forgets a deleted lock.
    pub fn forget(&self, lock: &LockId) {
        self.0.lock().unwrap().remove(lock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_lock_gets_one_holder_event_per_interval() {
        let limit = EventLimit::default();
        let (busy, quiet) = (
            LockId::new("ns", "busy").unwrap(),
            LockId::new("ns", "quiet").unwrap(),
        );
        assert!(limit.allow(&busy));
        assert!(!limit.allow(&busy), "a second handoff within the interval");
        assert!(limit.allow(&quiet), "another lock has its own interval");
        limit.forget(&busy);
        assert!(limit.allow(&busy), "a lock made again starts afresh");
    }
}
