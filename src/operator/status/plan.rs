//! Which status write goes next, as a policy without I/O. Each lock has one slot holding the
//! latest status to write: a newer one replaces it (pending writes never outnumber the locks,
//! and a lock that changed ten times while waiting is written once, as it is now). Slots whose
//! holders changed are served before those that only count waiters, then the longest waiting
//! first. Two writes of one lock are at least an interval apart that grows with the measured
//! PATCH time, so that a slow API server gets fewer, newer patches instead of a backlog;
//! a new holder waits only for the lock's write under way, not for the interval.

use k8s_openapi::api::core::v1::ObjectReference;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use crate::crd::DistributedLockStatus;
use crate::lock::LockId;

/// Between two writes of one lock, at least this many times the PATCH time measured ...
const INTERVAL_PER_LATENCY: u32 = 4;
/// ... and at most this long: the most a lock's own interval adds to its status lag.
const MAX_INTERVAL: Duration = Duration::from_millis(500);
/// A write of waiter counts only that has waited this long is served like a holder change,
/// so that a stream of holder changes on other locks cannot starve it.
const STARVED: Duration = Duration::from_secs(2);
/// The weight of the newest PATCH time in the moving average.
const SMOOTHING: f64 = 0.2;

/// The least time between two status writes of one lock when a PATCH takes `latency`.
pub fn interval(latency: Duration) -> Duration {
    (latency * INTERVAL_PER_LATENCY).min(MAX_INTERVAL)
}

/// The moving average of PATCH times after one that took `took`.
fn smoothed(average: Option<Duration>, took: Duration) -> Duration {
    average.map_or(took, |a| a.mul_f64(1.0 - SMOOTHING) + took.mul_f64(SMOOTHING))
}

/// A status waiting to be written.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// The latest status of the lock.
    pub status: DistributedLockStatus,
    /// The DistributedLock, for the `HolderChanged` Event.
    pub object: ObjectReference,
    /// Its first holder differs from the one shown: a `HolderChanged` Event is due.
    pub first_changed: bool,
    /// Its holders (by token) differ from those shown, or its fencing epoch rose: served
    /// first, without the interval. An epoch another cluster published is one this cluster's
    /// operator must know before etcd may be wiped again (docs/operator.md, "Locks shared by
    /// several clusters").
    prompt: bool,
    /// When the lock first had something to write since it was last written.
    since: Instant,
}

/// What is known of a lock's status as the operator last wrote it.
#[derive(Debug, Default)]
struct Shown {
    /// The fingerprint of the status written, unless the last write failed.
    fingerprint: Option<u64>,
    /// The holders' tokens written or being written, unless a write failed.
    holders: Option<Vec<i64>>,
    /// When its last write started.
    last: Option<Instant>,
    /// Not before this again (after a failed write).
    retry_at: Option<Instant>,
    /// The highest `fencingEpoch` and `fencingToken` written: never written lower again (a
    /// slot filled before a new epoch was recorded must not take it back).
    epoch: Option<u32>,
    token: Option<i64>,
}

/// How a write ended.
pub enum Outcome {
    /// The API server has it.
    Written,
    /// The DistributedLock is gone: nothing more to write.
    Gone,
    /// Failed: try the latest status again after this long.
    Failed(Duration),
}

/// When and how long a write took, and what to write again if it failed.
pub struct Ended {
    /// How long the PATCH took.
    pub took: Duration,
    /// When it ended.
    pub now: Instant,
    /// The write taken from the slots, to try again if it failed.
    pub retry: Option<Pending>,
}

/// The slots of every lock.
#[derive(Default)]
pub struct Writes {
    pending: HashMap<LockId, Pending>,
    in_flight: HashMap<LockId, u64>,
    shown: HashMap<LockId, Shown>,
    latency: Option<Duration>,
}

impl Writes {
    /// Offers the latest status of `id`, computed against `cached` (the status the
    /// controller's cache shows). Returns whether a write is now pending.
    pub fn offer(
        &mut self,
        id: &LockId,
        object: ObjectReference,
        cached: &DistributedLockStatus,
        status: DistributedLockStatus,
        now: Instant,
    ) -> bool {
        if self.shows_already(id, cached, &status) {
            self.pending.remove(id);
            return false;
        }
        let first = |s: &DistributedLockStatus| s.holders.first().map(|h| h.pod.clone());
        // Against the holders last written: the cache lags the operator's own writes, and a
        // waiter count offered just after a holder's write is not a holder change.
        let shown = self.shown.get(id);
        let holders_changed = match shown.and_then(|s| s.holders.as_ref()) {
            Some(written) => *written != tokens(&status),
            None => tokens(&status) != tokens(cached),
        };
        let known_epoch = shown.and_then(|s| s.epoch).max(cached.fencing_epoch);
        let epoch_rose = status.fencing_epoch > known_epoch;
        let earlier = self.pending.remove(id);
        let pending = Pending {
            first_changed: first(&status) != first(cached)
                || earlier.as_ref().is_some_and(|p| p.first_changed),
            prompt: holders_changed || epoch_rose || earlier.as_ref().is_some_and(|p| p.prompt),
            since: earlier.map_or(now, |p| p.since),
            status,
            object,
        };
        self.pending.insert(id.clone(), pending);
        true
    }

    /// Whether `status` is what the API server has, or will have once the write of `id` under
    /// way lands. Both the cache and the last write must say so: the cache may lag the
    /// operator's own writes, and someone else may have written since (then the latest state
    /// is written again, over theirs).
    fn shows_already(
        &self,
        id: &LockId,
        cached: &DistributedLockStatus,
        status: &DistributedLockStatus,
    ) -> bool {
        let fp = fingerprint(status);
        if let Some(writing) = self.in_flight.get(id) {
            return *writing == fp;
        }
        let written = self.shown.get(id).and_then(|s| s.fingerprint);
        fp == fingerprint(cached) && written.is_none_or(|w| w == fp)
    }

    /// Takes the write to make now, its fencing fields raised to those already written; else
    /// says when one may be due (`None`: only when something new is offered).
    pub fn take(&mut self, now: Instant) -> Result<(LockId, Pending), Option<Instant>> {
        let interval = interval(self.latency.unwrap_or_default());
        let mut best: Option<(&LockId, (bool, Instant))> = None;
        let mut wake: Option<Instant> = None;
        for (id, p) in &self.pending {
            if self.in_flight.contains_key(id) {
                continue;
            }
            // A new holder is written as soon as the lock's last write has landed: the
            // interval would add to the status lag it is measured by. Other changes wait for
            // it, and a backlog (the line, behind older changes) paces every lock alike.
            let interval = if p.prompt { Duration::ZERO } else { interval };
            let ready_at = self.shown.get(id).map_or(now, |s| s.ready_at(interval, now));
            if ready_at > now {
                wake = Some(wake.map_or(ready_at, |w| w.min(ready_at)));
                continue;
            }
            let key = (!p.urgent(now), p.since);
            if best.as_ref().is_none_or(|(_, k)| key < *k) {
                best = Some((id, key));
            }
        }
        let Some((id, _)) = best else { return Err(wake) };
        let id = id.clone();
        let mut p = self.pending.remove(&id).expect("picked from the slots");
        self.start(&id, &mut p.status, now);
        Ok((id, p))
    }

    /// Marks the write of `status` to `id` under way, its fencing fields raised to those
    /// already written.
    fn start(&mut self, id: &LockId, status: &mut DistributedLockStatus, now: Instant) {
        let shown = self.shown.entry(id.clone()).or_default();
        status.fencing_epoch = status.fencing_epoch.max(shown.epoch);
        status.fencing_token = status.fencing_token.max(shown.token);
        shown.last = Some(now);
        shown.holders = Some(tokens(status));
        self.in_flight.insert(id.clone(), fingerprint(status));
    }

    /// Starts a write of `status` outside the slots (one that must land before the
    /// reconciliation goes on), unless one of `id` is under way (then `false`: wait for it).
    pub fn begin(&mut self, id: &LockId, status: &mut DistributedLockStatus, now: Instant) -> bool {
        if self.in_flight.contains_key(id) {
            return false;
        }
        self.start(id, status, now);
        true
    }

    /// Records how the write of `id` begun with [`take`](Self::take) or
    /// [`begin`](Self::begin) ended after `took`; a failed one from the slots comes back as
    /// `retry` unless a newer status was offered meanwhile.
    pub fn done(&mut self, id: &LockId, written: &DistributedLockStatus, outcome: Outcome, ended: Ended) {
        let Some(fp) = self.in_flight.remove(id) else {
            return;
        };
        let Ended { took, now, retry } = ended;
        self.latency = Some(smoothed(self.latency, took));
        match outcome {
            Outcome::Gone => self.forget(id),
            Outcome::Written => {
                let shown = self.shown.entry(id.clone()).or_default();
                shown.fingerprint = Some(fp);
                shown.retry_at = None;
                shown.epoch = shown.epoch.max(written.fencing_epoch);
                shown.token = shown.token.max(written.fencing_token);
                if self.pending.get(id).is_some_and(|p| fingerprint(&p.status) == fp) {
                    self.pending.remove(id);
                }
            }
            Outcome::Failed(after) => {
                let shown = self.shown.entry(id.clone()).or_default();
                shown.fingerprint = None;
                shown.holders = None;
                shown.retry_at = Some(now + after);
                if let Some(p) = retry {
                    self.pending.entry(id.clone()).or_insert(p);
                }
            }
        }
    }

    /// Forgets a lock whose DistributedLock is gone.
    pub fn forget(&mut self, id: &LockId) {
        self.pending.remove(id);
        self.shown.remove(id);
    }

    /// How many locks have a status write pending.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

impl Shown {
    fn ready_at(&self, interval: Duration, now: Instant) -> Instant {
        let after_last = self.last.map_or(now, |l| l + interval);
        self.retry_at.map_or(after_last, |r| r.max(after_last))
    }
}

impl Pending {
    /// How long it has waited at `now`, since first offered.
    pub fn waited(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.since)
    }

    fn urgent(&self, now: Instant) -> bool {
        self.prompt || now.duration_since(self.since) >= STARVED
    }
}

/// Who holds, by fencing token: a new holder is a change served first; a holder's
/// `acquiredAt` recorded a moment after its grant is not.
fn tokens(status: &DistributedLockStatus) -> Vec<i64> {
    status.holders.iter().map(|h| h.fencing_token).collect()
}

/// A hash of a status, to tell whether the one shown is already the latest.
fn fingerprint(status: &DistributedLockStatus) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_vec(status)
        .expect("a status serializes")
        .hash(&mut h);
    h.finish()
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
