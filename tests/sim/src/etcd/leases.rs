//! Leases on the simulated clock, as etcd's lessor keeps them on its leader: a TTL, an expiry
//! that a keepalive moves, the keys attached, and the lease checkpoints a new leader starts
//! from (etcd 3.6 with `--feature-gates=LeaseCheckpoint=true,LeaseCheckpointPersist=true`, as
//! the chart runs it).

use super::errors::EtcdError;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::time::Instant;

/// etcd's `MaxLeaseTTL`: a grant beyond it is refused.
const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// etcd's lease checkpoint interval (`defaultLeaseCheckpointInterval`, no flag sets it): a lease
/// with more than this left is checkpointed this long after its last refresh, and again while
/// it has more left.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(300);

/// One lease.
#[derive(Clone, Debug)]
pub struct Lease {
    /// Its TTL in seconds, as granted (raised to the minimum).
    pub ttl: i64,
    expiry: Instant,
    /// When it was last granted, renewed or given its TTL by a new leader.
    refreshed: Instant,
    /// The keys attached to it.
    pub keys: BTreeSet<Vec<u8>>,
}

impl Lease {
    /// Whole seconds left before it expires, truncated, as etcd's `TimeToLive` answers.
    pub fn remaining(&self, now: Instant) -> i64 {
        self.expiry.saturating_duration_since(now).as_secs() as i64
    }

    fn refresh(&mut self, now: Instant, extend: Duration) {
        self.refresh_for(now, extend, Duration::from_secs(self.ttl as u64));
    }

    fn refresh_for(&mut self, now: Instant, extend: Duration, left: Duration) {
        (self.expiry, self.refreshed) = (now + extend + left, now);
    }

    /// What a new leader at `now` gives it: the time left at its latest checkpoint, or, never
    /// checkpointed (a TTL of at most [`CHECKPOINT_INTERVAL`], as podlock's), its whole TTL.
    fn promoted(&self, now: Instant) -> Duration {
        let (mut left, mut at) = (Duration::from_secs(self.ttl as u64), self.refreshed);
        // A checkpoint is scheduled only while more than the interval is left.
        while self.expiry.saturating_duration_since(at) > CHECKPOINT_INTERVAL
            && at + CHECKPOINT_INTERVAL <= now
        {
            at += CHECKPOINT_INTERVAL;
            left = self.expiry.saturating_duration_since(at);
        }
        left
    }
}

/// How far a restarted member's lease ids lie past the ones given before.
const RESTART_GAP: i64 = 1 << 32;

/// Every lease, by id.
#[derive(Clone, Debug)]
pub struct Leases {
    map: BTreeMap<i64, Lease>,
    /// The id the next grant without one gets (etcd draws it from its request id generator).
    next_id: i64,
    /// The smallest TTL granted: etcd's is 1.5 election timeouts, rounded up to whole seconds.
    min_ttl: i64,
}

impl Leases {
    /// No leases; ids given by the server start at `first_id`; TTLs are at least `min_ttl`.
    pub fn new(first_id: i64, min_ttl: i64) -> Self {
        Leases {
            map: BTreeMap::new(),
            next_id: first_id,
            min_ttl,
        }
    }

    /// After the member restarted from a snapshot or empty, its ids go on past every id
    /// `before` gave: etcd's generator starts from the new process's start time, so a
    /// restarted etcd never gives an id again (a lease of a session that lived through the
    /// restart may be granted to no one else).
    pub fn restarted_after(&mut self, before: &Leases) {
        self.next_id = self
            .next_id
            .max(before.next_id.wrapping_add(RESTART_GAP) & i64::MAX);
    }

    /// Grants lease `id` (0: one the server picks) for `ttl` seconds; returns its id and TTL.
    pub fn grant(&mut self, id: i64, ttl: i64, now: Instant) -> Result<(i64, i64), EtcdError> {
        if ttl > MAX_LEASE_TTL {
            return Err(EtcdError::LeaseTtlTooLarge);
        }
        let id = match id {
            0 => self.fresh_id(),
            id if self.map.contains_key(&id) => return Err(EtcdError::LeaseExists),
            id => id,
        };
        let mut lease = Lease {
            ttl: ttl.max(self.min_ttl),
            expiry: now,
            refreshed: now,
            keys: BTreeSet::new(),
        };
        lease.refresh(now, Duration::ZERO);
        let ttl = lease.ttl;
        self.map.insert(id, lease);
        Ok((id, ttl))
    }

    fn fresh_id(&mut self) -> i64 {
        while self.next_id == 0 || self.map.contains_key(&self.next_id) {
            self.next_id = self.next_id.wrapping_add(1) & i64::MAX;
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1) & i64::MAX;
        id
    }

    /// Removes lease `id`; returns it (its keys are the caller's to delete).
    pub fn revoke(&mut self, id: i64) -> Result<Lease, EtcdError> {
        self.map.remove(&id).ok_or(EtcdError::LeaseNotFound)
    }

    /// Renews lease `id` for its TTL from `now`; `None` if it does not exist or has expired.
    pub fn renew(&mut self, id: i64, now: Instant) -> Option<i64> {
        let lease = self.map.get_mut(&id).filter(|l| l.expiry > now)?;
        lease.refresh(now, Duration::ZERO);
        Some(lease.ttl)
    }

    /// Lease `id`, if it exists.
    pub fn get(&self, id: i64) -> Option<&Lease> {
        self.map.get(&id)
    }

    /// Every lease id, ascending.
    pub fn ids(&self) -> impl Iterator<Item = i64> + '_ {
        self.map.keys().copied()
    }

    /// Records that `key` now belongs to lease `id` (0: none).
    pub fn attach(&mut self, id: i64, key: &[u8]) {
        if let Some(l) = self.map.get_mut(&id) {
            l.keys.insert(key.to_vec());
        }
    }

    /// Records that `key` no longer belongs to lease `id`.
    pub fn detach(&mut self, id: i64, key: &[u8]) {
        if let Some(l) = self.map.get_mut(&id) {
            l.keys.remove(key);
        }
    }

    /// When the next lease expires, if any lease exists.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.map.values().map(|l| l.expiry).min()
    }

    /// The ids of the leases expired at `now`, ascending.
    pub fn expired(&self, now: Instant) -> Vec<i64> {
        (self.map.iter())
            .filter(|(_, l)| l.expiry <= now)
            .map(|(&id, _)| id)
            .collect()
    }

    /// A new leader's lessor: every lease gets what was left at its latest checkpoint, else its
    /// whole TTL, plus `extend` (etcd's `Promote` with the election timeout).
    pub fn promote(&mut self, now: Instant, extend: Duration) {
        for lease in self.map.values_mut() {
            let left = lease.promoted(now);
            lease.refresh_for(now, extend, left);
        }
    }
}
