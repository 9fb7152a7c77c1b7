//! The engine's cache of locks' settings, bounded: it keeps the [`CAPACITY`] locks used last
//! and forgets the others (issue #54, F9: a `--standalone` sidecar cached the defaults of every
//! name it was ever asked about, so its memory grew with every name touched). A lock forgotten
//! costs one read of its settings when next used; nothing else depends on an entry being
//! there. Eviction goes by use, in ordered maps, so the engine's requests stay the same for the
//! same history (the seeded world replays them).
//!
//! A kept lock's token epoch is also a floor (issue #54, F11): settings read under a lower
//! epoch are refused, since etcd restored from a snapshot taken before the lock's latest epoch
//! would have the sidecar grant below tokens it handed out before; the operator publishes the
//! lock under a new epoch within moments. Only a lower epoch that stays [`FLOOR_PATIENCE`] is
//! taken: a lock deleted while etcd was wiped and declared again has lost its history (no
//! rule can help there, docs/design.md, "Fencing"), and refusing it for good would stop it.

use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

use crate::lock::protocol::names::LockId;
use crate::lock::txn::settings::Declared;

/// How many locks' settings a sidecar keeps: far more than the locks one pod uses at a time.
pub(crate) const CAPACITY: usize = 4096;

/// How long settings under a lower token epoch than a kept lock's are refused before they are
/// taken: far longer than the operator takes to publish a restored lock anew.
pub(crate) const FLOOR_PATIENCE: Duration = Duration::from_secs(60);

/// What became of settings read from etcd.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// Kept.
    Kept,
    /// Refused: under a lower epoch than the lock's kept settings, `seen`.
    WentBack { seen: u32 },
    /// Kept although under a lower epoch than `seen`, refused for [`FLOOR_PATIENCE`] already.
    GaveUp { seen: u32 },
}

/// Settings by lock, the least recently used forgotten past the capacity.
pub(crate) struct SettingsCache {
    capacity: usize,
    /// Each lock's settings and when it was last used.
    entries: BTreeMap<LockId, (Declared, u64)>,
    /// The locks by when they were last used.
    by_use: BTreeMap<u64, LockId>,
    /// Locks whose settings were refused for a lower epoch, since when.
    went_back: BTreeMap<LockId, Instant>,
    /// The count of uses so far: the next use's stamp.
    uses: u64,
}

impl Default for SettingsCache {
    fn default() -> Self {
        SettingsCache::with_capacity(CAPACITY)
    }
}

impl SettingsCache {
    /// An empty cache that keeps at most `capacity` locks.
    pub fn with_capacity(capacity: usize) -> Self {
        SettingsCache {
            capacity: capacity.max(1),
            entries: BTreeMap::new(),
            by_use: BTreeMap::new(),
            went_back: BTreeMap::new(),
            uses: 0,
        }
    }

    /// The settings of `lock`, if kept (a use of it).
    pub fn get(&mut self, lock: &LockId) -> Option<&Declared> {
        let stamp = self.stamp();
        let (_, used) = self.entries.get_mut(lock)?;
        self.by_use.remove(used);
        *used = stamp;
        self.by_use.insert(stamp, lock.clone());
        self.entries.get(lock).map(|(d, _)| d)
    }

    /// The settings of `lock`, if kept, without counting it as a use.
    pub fn peek(&self, lock: &LockId) -> Option<&Declared> {
        self.entries.get(lock).map(|(d, _)| d)
    }

    /// Keeps `found` as `lock`'s settings, unless they are under a lower token epoch than the
    /// kept ones and have not been for [`FLOOR_PATIENCE`] (see the module's comment).
    pub fn admit(&mut self, lock: &LockId, found: &Declared) -> Admitted {
        let seen = self.peek(lock).map_or(0, |d| d.settings.epoch);
        if seen <= found.settings.epoch {
            self.insert(lock.clone(), found.clone());
            return Admitted::Kept;
        }
        let since = *self.went_back.entry(lock.clone()).or_insert_with(Instant::now);
        if since.elapsed() < FLOOR_PATIENCE {
            return Admitted::WentBack { seen };
        }
        self.insert(lock.clone(), found.clone());
        Admitted::GaveUp { seen }
    }

    /// Keeps `declared` as `lock`'s settings, forgetting the lock used longest ago if the
    /// cache is full.
    pub fn insert(&mut self, lock: LockId, declared: Declared) {
        self.went_back.remove(&lock);
        let stamp = self.stamp();
        if let Some((_, used)) = self.entries.insert(lock.clone(), (declared, stamp)) {
            self.by_use.remove(&used);
        }
        self.by_use.insert(stamp, lock);
        while self.entries.len() > self.capacity {
            let (_, oldest) = self.by_use.pop_first().expect("an entry per lock");
            self.entries.remove(&oldest);
            self.went_back.remove(&oldest);
        }
    }

    /// Forgets `lock`'s settings.
    pub fn remove(&mut self, lock: &LockId) {
        self.went_back.remove(lock);
        if let Some((_, used)) = self.entries.remove(lock) {
            self.by_use.remove(&used);
        }
    }

    /// How many locks it keeps.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    fn stamp(&mut self) -> u64 {
        self.uses += 1;
        self.uses
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(i: usize) -> LockId {
        LockId::new("ns", &format!("name-{i}")).unwrap()
    }

    #[test]
    fn it_keeps_the_locks_used_last_and_no_more() {
        let mut cache = SettingsCache::with_capacity(3);
        for i in 0..3 {
            cache.insert(lock(i), Declared::undeclared());
        }
        assert!(cache.get(&lock(0)).is_some(), "lock 0 used again");
        cache.insert(lock(3), Declared::undeclared());
        assert_eq!(cache.len(), 3);
        assert!(
            cache.peek(&lock(1)).is_none(),
            "the one used longest ago is forgotten"
        );
        assert!(cache.peek(&lock(0)).is_some() && cache.peek(&lock(3)).is_some());
        cache.remove(&lock(0));
        assert!(cache.get(&lock(0)).is_none());
        assert_eq!((cache.len(), cache.by_use.len()), (2, 2));
    }

    fn under(epoch: u32) -> Declared {
        let mut d = Declared::undeclared();
        d.settings.epoch = epoch;
        d
    }

    /// Finding F11 of issue #54: etcd restored from a snapshot older than a lock's epoch.
    #[tokio::test(start_paused = true)]
    async fn settings_under_a_lower_epoch_are_refused_until_a_higher_one_or_a_minute() {
        let mut cache = SettingsCache::default();
        assert_eq!(cache.admit(&lock(0), &under(2)), Admitted::Kept);
        assert_eq!(cache.admit(&lock(0), &under(1)), Admitted::WentBack { seen: 2 });
        tokio::time::advance(FLOOR_PATIENCE / 2).await;
        assert_eq!(cache.admit(&lock(0), &under(1)), Admitted::WentBack { seen: 2 });
        assert_eq!(cache.admit(&lock(0), &under(3)), Admitted::Kept, "published anew");
        assert_eq!(cache.admit(&lock(0), &under(0)), Admitted::WentBack { seen: 3 });
        tokio::time::advance(FLOOR_PATIENCE).await;
        assert_eq!(cache.admit(&lock(0), &under(0)), Admitted::GaveUp { seen: 3 });
        assert_eq!(cache.peek(&lock(0)).map(|d| d.settings.epoch), Some(0));
        cache.remove(&lock(0));
        assert!(cache.went_back.is_empty());
    }

    /// Finding F9 of issue #54: a standalone sidecar kept the defaults of every name touched.
    #[test]
    fn a_stream_of_new_names_keeps_the_cache_bounded() {
        let mut cache = SettingsCache::default();
        for i in 0..3 * CAPACITY {
            cache.insert(lock(i), Declared::undeclared());
            assert!(cache.get(&lock(i)).is_some());
        }
        assert_eq!((cache.len(), cache.by_use.len()), (CAPACITY, CAPACITY));
        assert!(cache.peek(&lock(3 * CAPACITY - 1)).is_some());
    }
}
