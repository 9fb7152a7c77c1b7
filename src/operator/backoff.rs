//! How soon a lock whose reconciliation failed is tried again: per lock, the pauses of
//! [`retry::reconcile`] (doubling from 1 s up to 60 s while that lock keeps failing, spread at
//! random so that an etcd or API server outage does not bring every lock back in the same
//! second), from the first again once it was reconciled; sooner if a hold's deadline falls due
//! before (a reconcile that failed after it looked at the deadlines still ends holds on time).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

use crate::lock::LockId;
use crate::retry::{self, Pauses};

/// The run of retries of each lock that is failing, and when a failing lock's next deadline
/// falls due.
#[derive(Default)]
pub struct Backoff {
    failing: Mutex<HashMap<LockId, Pauses>>,
    due: Mutex<HashMap<LockId, Instant>>,
}

impl Backoff {
    /// Counts a failure of `lock`; returns how long to wait before trying it again: its next
    /// pause, or less if a deadline of it falls due sooner ([`Backoff::due_in`]).
    pub fn failed(&self, lock: &LockId) -> Duration {
        let mut failing = self.failing.lock().unwrap();
        let pauses = failing
            .entry(lock.clone())
            .or_insert_with(|| Pauses::new(retry::reconcile()));
        let pause = pauses.next_pause();
        match self.due.lock().unwrap().remove(lock) {
            Some(at) => pause.min(at.saturating_duration_since(Instant::now())),
            None => pause,
        }
    }

    /// A deadline of `lock` falls due in `within`, should this reconcile of it fail.
    pub fn due_in(&self, lock: &LockId, within: Duration) {
        self.due
            .lock()
            .unwrap()
            .insert(lock.clone(), Instant::now() + within);
    }

    /// `lock` was reconciled: its next failure starts from the first delay again.
    pub fn succeeded(&self, lock: &LockId) {
        self.failing.lock().unwrap().remove(lock);
        self.due.lock().unwrap().remove(lock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_back_off_doubling_and_spread_and_success_resets() {
        let (backoff, lock) = (Backoff::default(), LockId::new("ns", "l").unwrap());
        let nominal = [1, 2, 4, 8, 16, 32, 60, 60, 60];
        for (i, secs) in nominal.into_iter().enumerate() {
            let (d, secs) = (backoff.failed(&lock), Duration::from_secs(secs));
            assert!(d >= secs / 2 && d <= secs, "failure {i}: {d:?}");
        }
        backoff.succeeded(&lock);
        assert!(backoff.failed(&lock) <= Duration::from_secs(1));
        backoff.due_in(&lock, Duration::from_millis(300));
        assert!(
            backoff.failed(&lock) <= Duration::from_millis(300),
            "a deadline first"
        );
        assert!(
            backoff.failed(&lock) >= Duration::from_secs(2),
            "then the pauses go on"
        );
        // Spread: a thousand locks failing at once come back over the half second from 0.5 s
        // to 1 s, not in the same 10 ms.
        let spread: std::collections::BTreeSet<u128> = (0..1000)
            .map(|i| {
                Backoff::default()
                    .failed(&LockId::new("ns", &format!("l{i}")).unwrap())
                    .as_millis()
                    / 10
            })
            .collect();
        assert!(spread.len() >= 45, "{spread:?}");
    }
}
