//! podlock's one retry policy, for the engine and the operator alike: after a failure, wait a
//! pause that doubles from a first value up to a longest one, and never give up by itself (the
//! caller says when to stop: its hold ended, its request's budget is spent, the error is not
//! transient). Each pause is drawn at random between half its nominal value and the whole of
//! it: processes that failed together (every sidecar when etcd went down, every lock when the
//! API server did) come back spread out, not in one burst, and the nominal value is the longest
//! wait, which is what a lease's TTL or a request's budget is measured against.
//!
//! The named policies below say why their numbers are what they are. They are `backon`'s
//! exponential backoff (the crate kube-runtime retries with), whose jitter adds to each pause a
//! random fraction of it (`fastrand`, seeded from the OS for every run of retries): so the
//! nominal values are given to it halved. Retrying one call: `call.retry(retry::etcd())` with
//! [`backon::Retryable`]; its sleeps are tokio's (backon's default sleeper), which tests pause.
//! A loop that paces itself draws its pauses from [`Pauses`].

use backon::{BackoffBuilder, ExponentialBuilder};
use std::time::Duration;

/// A retry policy: hand it to [`backon::Retryable::retry`], or draw its pauses from [`Pauses`].
pub type Policy = ExponentialBuilder;

/// Pauses doubling from `first` to `longest`, never ending, each drawn between half its
/// nominal value and the whole.
fn doubling(first: Duration, longest: Duration) -> Policy {
    ExponentialBuilder::new()
        .with_min_delay(first / 2)
        .with_max_delay(longest / 2)
        .with_jitter()
        .without_max_times()
}

/// An engine write to etcd that must land past one request's budget (a grant's record, a key's
/// removal), sent again after a failure: from 100 ms up to 2 s. Each attempt has already waited
/// up to its 5 s budget (`lock::etcd`, which retries within it after a fixed 50 ms, see there):
/// 2 s between attempts keeps every sidecar from asking an etcd that is coming back at once.
pub fn etcd() -> Policy {
    doubling(Duration::from_millis(100), Duration::from_secs(2))
}

/// A keepalive sent again, on a new stream, after it failed or went unanswered: every pause at
/// most an eighth of the lease's `ttl` (seconds), and at most 500 ms, not doubling. The lease
/// runs out a TTL after the last confirmed keepalive, and each try may take a quarter of it
/// before it is given up: short pauses leave room for more tries, on other members, before
/// then; a long TTL's session has no reason to wait longer than a short one's.
pub fn keepalive(ttl: u32) -> Policy {
    let pause = (Duration::from_millis(125) * ttl).min(Duration::from_millis(500));
    doubling(pause, pause)
}

/// A lock whose reconciliation failed, tried again: from 1 s, up to 60 s while it keeps
/// failing. A minute bounds how long a lock's status stays stale after an outage ends; spread,
/// 10,000 locks failing at once do not all come back in the same second (in lockstep they would
/// be an outage of their own).
pub fn reconcile() -> Policy {
    doubling(Duration::from_secs(1), Duration::from_secs(60))
}

/// A watch that broke, listed and watched again: from 200 ms, up to 5 s while re-listing keeps
/// failing. A re-list reads every key watched, so an etcd that keeps failing is not asked
/// five times a second; a few seconds bound how long after it comes back changes go unseen.
/// Start a new run of pauses once a watch has served, so that an occasional break waits the
/// first pause, not the longest.
pub fn rewatch() -> Policy {
    doubling(Duration::from_millis(200), Duration::from_secs(5))
}

/// A sidecar connecting anew after etcd refused its clients (its password or etcd's CA
/// changed, see `sidecar::reconnect`): from 1 s, up to 30 s while etcd keeps refusing. The new
/// credentials reach the pod's files within a minute or so of the operator writing them, and
/// each try costs etcd a password check (bcrypt, milliseconds of CPU): with every pod of a
/// cluster trying at once, 30 s keeps that load low and the wait after the files change short.
pub fn reconnect() -> Policy {
    doubling(Duration::from_secs(1), Duration::from_secs(30))
}

/// One run of retries under a policy, for a loop that paces itself rather than retrying one
/// call (a keepalive, a lock's requeue, a re-list); a new run starts from the first
/// pause again.
#[derive(Debug)]
pub struct Pauses(<Policy as BackoffBuilder>::Backoff);

impl Pauses {
    /// A run of retries under `policy`.
    pub fn new(policy: Policy) -> Self {
        Pauses(policy.build())
    }

    /// The pause before the next try.
    pub fn next_pause(&mut self) -> Duration {
        self.0.next().expect("podlock's policies never end")
    }
}

/// Asserts that the pauses of a run of `policy` are drawn within their `nominal` values (in
/// milliseconds): at least half, at most the whole (give or take the microsecond that
/// backon's f32 arithmetic may round by).
#[cfg(test)]
pub(crate) fn assert_pauses(policy: Policy, nominal: &[u64]) {
    let mut pauses = Pauses::new(policy);
    for (i, &ms) in nominal.iter().enumerate() {
        let (pause, ms) = (pauses.next_pause(), Duration::from_millis(ms));
        let slack = Duration::from_micros(1);
        assert!(
            pause + slack >= ms / 2 && pause <= ms + slack,
            "pause {i}: {pause:?}, nominal {ms:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_requests_double_from_100_ms_to_2_s() {
        assert_pauses(etcd(), &[100, 200, 400, 800, 1600, 2000, 2000]);
    }

    #[test]
    fn reconnects_double_from_1_s_to_30_s() {
        assert_pauses(reconnect(), &[1000, 2000, 4000, 8000, 16000, 30000, 30000]);
    }

    #[test]
    fn watches_double_from_200_ms_to_5_s() {
        assert_pauses(rewatch(), &[200, 400, 800, 1600, 3200, 5000, 5000]);
    }

    #[test]
    fn pauses_are_spread_between_half_and_the_whole() {
        let mut pauses = Pauses::new(keepalive(3600));
        let drawn: Vec<Duration> = (0..1000).map(|_| pauses.next_pause()).collect();
        // 1,000 draws from [250 ms, 500 ms): some fall in each of its quarters.
        for quarter in 0..4 {
            let from = Duration::from_millis(250 + quarter * 62);
            let to = from + Duration::from_millis(62);
            assert!(
                drawn.iter().any(|d| (from..to).contains(d)),
                "none in {from:?}..{to:?}"
            );
        }
    }
}
