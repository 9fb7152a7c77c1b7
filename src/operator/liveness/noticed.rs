//! When the operator first noticed an etcd change of each lock that no reconciliation has read
//! yet: where a lock's status lag starts inside the operator. The reconciliation that reads
//! the change takes the mark and observes the time since in
//! `podlock_operator_status_trigger_seconds` (the etcd watch's coalescing, the controller's
//! debounce and its queue).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::lock::LockId;

/// The earliest unread change of each lock.
#[derive(Default)]
pub struct Noticed(Mutex<HashMap<LockId, Instant>>);

impl Noticed {
    /// Notes a change of `id` at `at`, unless an earlier one is still unread.
    pub fn mark(&self, id: &LockId, at: Instant) {
        let mut marks = self.0.lock().unwrap();
        if !marks.contains_key(id) {
            marks.insert(id.clone(), at);
        }
    }

    /// Takes the mark of `id`, before the reconciliation reads etcd: a change noticed after
    /// this may be missed by that read, and is marked again for the next one.
    pub fn take(&self, id: &LockId) -> Option<Instant> {
        self.0.lock().unwrap().remove(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_earliest_unread_change_is_kept_until_taken() {
        let (noticed, id, t0) = (
            Noticed::default(),
            LockId::new("ns", "l").unwrap(),
            Instant::now(),
        );
        noticed.mark(&id, t0);
        noticed.mark(&id, t0 + Duration::from_millis(5));
        assert_eq!(noticed.take(&id), Some(t0));
        assert_eq!(noticed.take(&id), None, "taken once");
        noticed.mark(&id, t0 + Duration::from_millis(9));
        assert_eq!(noticed.take(&id), Some(t0 + Duration::from_millis(9)));
    }
}
