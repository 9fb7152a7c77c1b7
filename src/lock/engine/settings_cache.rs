//! The engine's cache of locks' settings, bounded: it keeps the [`CAPACITY`] locks used last
//! and forgets the others (issue #54, F9: a `--standalone` sidecar cached the defaults of every
//! name it was ever asked about, so its memory grew with every name touched). A lock forgotten
//! costs one read of its settings when next used; nothing else depends on an entry being
//! there. Eviction goes by use, in ordered maps, so the engine's requests stay the same for the
//! same history (the seeded world replays them).

use std::collections::BTreeMap;

use crate::lock::protocol::names::LockId;
use crate::lock::txn::settings::Declared;

/// How many locks' settings a sidecar keeps: far more than the locks one pod uses at a time.
pub(crate) const CAPACITY: usize = 4096;

/// Settings by lock, the least recently used forgotten past the capacity.
pub(crate) struct SettingsCache {
    capacity: usize,
    /// Each lock's settings and when it was last used.
    entries: BTreeMap<LockId, (Declared, u64)>,
    /// The locks by when they were last used.
    by_use: BTreeMap<u64, LockId>,
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

    /// Keeps `declared` as `lock`'s settings, forgetting the lock used longest ago if the
    /// cache is full.
    pub fn insert(&mut self, lock: LockId, declared: Declared) {
        let stamp = self.stamp();
        if let Some((_, used)) = self.entries.insert(lock.clone(), (declared, stamp)) {
            self.by_use.remove(&used);
        }
        self.by_use.insert(stamp, lock);
        while self.entries.len() > self.capacity {
            let (_, oldest) = self.by_use.pop_first().expect("an entry per lock");
            self.entries.remove(&oldest);
        }
    }

    /// Forgets `lock`'s settings.
    pub fn remove(&mut self, lock: &LockId) {
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
