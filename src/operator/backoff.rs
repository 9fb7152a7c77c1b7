//! How soon a lock whose reconciliation failed is tried again: per lock, the pauses of
//! [`retry::reconcile`] (doubling from 1 s up to 60 s while that lock keeps failing, spread at
//! random so that an etcd or API server outage does not bring every lock back in the same
//! second), from the first again once it was reconciled.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::lock::LockId;
use crate::retry::{self, Pauses};

/// The run of retries of each lock that is failing.
#[derive(Default)]
pub struct Backoff(Mutex<HashMap<LockId, Pauses>>);

impl Backoff {
    /// Counts a failure of `lock`; returns how long to wait before trying it again.
    pub fn failed(&self, lock: &LockId) -> Duration {
        let mut failing = self.0.lock().unwrap();
        let pauses = failing
            .entry(lock.clone())
            .or_insert_with(|| Pauses::new(retry::reconcile()));
        pauses.next_pause()
    }

    /// `lock` was reconciled: its next failure starts from the first delay again.
    pub fn succeeded(&self, lock: &LockId) {
        self.0.lock().unwrap().remove(lock);
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
