//! How soon a lock whose reconciliation failed is tried again: doubling from 1 s up to 60 s per
//! consecutive failure of that lock, each delay spread by ±50%, so that an etcd or API server
//! outage does not bring every lock back in the same second (10,000 locks retried in lockstep
//! are an outage of their own).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::Duration;

use crate::lock::LockId;

/// The first retry's delay, and the longest.
const FIRST: Duration = Duration::from_secs(1);
const LONGEST: Duration = Duration::from_secs(60);

/// Consecutive failures per lock.
#[derive(Default)]
pub struct Backoff(Mutex<HashMap<LockId, u32>>);

impl Backoff {
    /// Counts a failure of `lock`; returns how long to wait before trying it again.
    pub fn failed(&self, lock: &LockId) -> Duration {
        let mut failures = self.0.lock().unwrap();
        let n = failures.entry(lock.clone()).or_default();
        *n = n.saturating_add(1);
        let delay = FIRST.saturating_mul(1 << (*n - 1).min(6)).min(LONGEST);
        delay.mul_f64(0.5 + jitter())
    }

    /// `lock` was reconciled: its next failure starts from the first delay again.
    pub fn succeeded(&self, lock: &LockId) {
        self.0.lock().unwrap().remove(lock);
    }
}

/// A number in [0, 1), different on every call (the standard library's per-instance random
/// hash keys; no generator is needed for spreading retries).
fn jitter() -> f64 {
    let random = std::collections::hash_map::RandomState::new().hash_one(0u8);
    (random >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_back_off_doubling_and_spread_and_success_resets() {
        let (backoff, lock) = (Backoff::default(), LockId::new("ns", "l").unwrap());
        let delays: Vec<Duration> = (0..9).map(|_| backoff.failed(&lock)).collect();
        for (i, d) in delays.iter().enumerate() {
            let nominal = FIRST.saturating_mul(1 << i.min(6)).min(LONGEST);
            assert!(
                *d >= nominal / 2 && *d < nominal.mul_f64(1.5),
                "failure {i}: {d:?}"
            );
        }
        backoff.succeeded(&lock);
        assert!(backoff.failed(&lock) < FIRST.mul_f64(1.5));
        // Spread: a thousand locks failing at once do not all come back in the same 100 ms.
        let spread: std::collections::BTreeSet<u128> = (0..1000)
            .map(|i| {
                Backoff::default()
                    .failed(&LockId::new("ns", &format!("l{i}")).unwrap())
                    .as_millis()
                    / 100
            })
            .collect();
        assert!(spread.len() >= 8, "{spread:?}");
    }
}
