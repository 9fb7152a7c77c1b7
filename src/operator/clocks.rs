//! When the holds with a maximum hold time began, as the operator reckons them (the
//! reconciler's `deadline` ends a hold past it): kept in the operator's context, which every
//! wing of the operator shares.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::SystemTime;

use crate::lock::{Entry, LockId, QueueEntry};

/// When each held entry with a maximum hold time began, as this operator reckons it, by lock
/// and create revision.
#[derive(Default)]
pub struct Clocks(Mutex<HashMap<LockId, HashMap<i64, SystemTime>>>);

impl Clocks {
    /// When each of `held` (the lock's timed holders now) began: its recorded grant, else
    /// when this operator first saw it hold. Forgets the lock's holds that are gone.
    pub(crate) fn started(&self, lock: &LockId, held: &[QueueEntry]) -> Vec<SystemTime> {
        let mut all = self.0.lock().unwrap();
        let seen = all.remove(lock).unwrap_or_default();
        let now = SystemTime::now();
        let firsts: HashMap<i64, SystemTime> = (held.iter())
            .map(|e| (e.revision, seen.get(&e.revision).copied().unwrap_or(now)))
            .collect();
        let started = (held.iter())
            .map(|e| recorded(e.entry.as_ref()).unwrap_or(firsts[&e.revision]))
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

/// The grant an entry records (`acquiredAt`), if it does.
fn recorded(entry: Option<&Entry>) -> Option<SystemTime> {
    humantime::parse_rfc3339(entry?.acquired_at.as_deref()?).ok()
}
