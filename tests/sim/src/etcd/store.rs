//! The multi-version key space: every key's history by revision, the event log watches read,
//! and compaction, as etcd's mvcc package keeps them.

use super::errors::EtcdError;
use etcd_client::proto::{PbEvent, PbKeyValue};
use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;

/// One version of a key: its value then, or its deletion at `mod_revision`.
#[derive(Clone, Debug)]
enum Version {
    Live(PbKeyValue),
    Deleted { mod_revision: i64 },
}

impl Version {
    fn mod_revision(&self) -> i64 {
        match self {
            Version::Live(kv) => kv.mod_revision,
            Version::Deleted { mod_revision } => *mod_revision,
        }
    }
}

/// A key range as etcd reads one: `end` empty is the key alone; `end` `\0` is every key from
/// `key` on (etcd's `mkGteRange`); otherwise `[key, end)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    /// The first key.
    pub key: Vec<u8>,
    /// The end, as sent.
    pub end: Vec<u8>,
}

impl KeyRange {
    /// The range `key`..`end` with etcd's meaning of `end`.
    pub fn new(key: &[u8], end: &[u8]) -> Self {
        KeyRange {
            key: key.to_vec(),
            end: end.to_vec(),
        }
    }

    /// Whether `k` is in the range.
    pub fn contains(&self, k: &[u8]) -> bool {
        match self.end.as_slice() {
            [] => k == self.key.as_slice(),
            [0] => k >= self.key.as_slice(),
            end => k >= self.key.as_slice() && k < end,
        }
    }

    fn bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        let start = Bound::Included(self.key.as_slice());
        match self.end.as_slice() {
            [] => (start, Bound::Included(self.key.as_slice())),
            [0] => (start, Bound::Unbounded),
            // An end at or before the start is an empty range (BTreeMap::range would panic).
            end if end <= self.key.as_slice() => (start, Bound::Excluded(self.key.as_slice())),
            end => (start, Bound::Excluded(end)),
        }
    }
}

/// The key space: histories, the current and compacted revisions, and the event log.
#[derive(Clone, Debug)]
pub struct Store {
    keys: BTreeMap<Vec<u8>, Vec<Version>>,
    revision: i64,
    compacted: i64,
    /// Every event at a revision a watch may still start from, oldest first, without prev_kv
    /// (etcd reads that at send time, from the revision before the event).
    events: VecDeque<PbEvent>,
}

impl Default for Store {
    fn default() -> Self {
        // A new etcd is at revision 1 with nothing in it.
        Store {
            keys: BTreeMap::new(),
            revision: 1,
            // etcd's compactMainRev starts at -1: a first compaction at 0 succeeds.
            compacted: -1,
            events: VecDeque::new(),
        }
    }
}

impl Store {
    /// The current revision.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The revision the store was last compacted at (-1: never).
    pub fn compacted(&self) -> i64 {
        self.compacted
    }

    /// Checks that `revision` (0: the current one) can be read: not in the future, not compacted.
    pub fn check_readable(&self, revision: i64) -> Result<(), EtcdError> {
        if revision > self.revision {
            Err(EtcdError::FutureRevision)
        } else if revision > 0 && revision < self.compacted {
            Err(EtcdError::Compacted)
        } else {
            Ok(())
        }
    }

    /// The live key-values in `range` at `revision` (≤ 0: the current one), in key order.
    pub fn range_at(&self, range: &KeyRange, revision: i64) -> Vec<PbKeyValue> {
        let at = if revision <= 0 { self.revision } else { revision };
        (self.keys.range::<[u8], _>(range.bounds()))
            .filter_map(|(_, history)| Self::version_at(history, at))
            .collect()
    }

    /// The key-value of `key` at `revision`, if it was live then.
    pub fn get_at(&self, key: &[u8], revision: i64) -> Option<PbKeyValue> {
        Self::version_at(self.keys.get(key)?, revision)
    }

    fn version_at(history: &[Version], at: i64) -> Option<PbKeyValue> {
        let n = history.partition_point(|v| v.mod_revision() <= at);
        match history.get(n.checked_sub(1)?)? {
            Version::Live(kv) => Some(kv.clone()),
            Version::Deleted { .. } => None,
        }
    }

    /// Starts a write at the next revision; [`Store::commit`] ends it.
    pub fn begin(&self) -> Write {
        Write {
            revision: self.revision + 1,
            changes: Vec::new(),
        }
    }

    /// Applies `write`: its revision becomes the current one if it changed anything.
    pub fn commit(&mut self, write: Write) {
        if write.changes.is_empty() {
            return;
        }
        for change in write.changes {
            let kv = change.kv.clone();
            let (version, kind) = match change.kind {
                Kind::Put => (Version::Live(kv.clone()), etcd_client::EventType::Put),
                Kind::Delete => (
                    Version::Deleted {
                        mod_revision: write.revision,
                    },
                    etcd_client::EventType::Delete,
                ),
            };
            self.keys.entry(kv.key.clone()).or_default().push(version);
            self.events.push_back(PbEvent {
                r#type: kind as i32,
                kv: Some(kv),
                prev_kv: None,
            });
        }
        self.revision = write.revision;
    }

    /// The events at revisions from `from` on, oldest first.
    pub fn events_from(&self, from: i64) -> impl Iterator<Item = &PbEvent> {
        let start = self
            .events
            .partition_point(|e| e.kv.as_ref().is_some_and(|kv| kv.mod_revision < from));
        self.events.range(start..)
    }

    /// Compacts at `revision`: reads before it fail, histories keep only what a read at it or
    /// later needs, and the event log drops what a watch may no longer start from.
    pub fn compact(&mut self, revision: i64) -> Result<(), EtcdError> {
        if revision <= self.compacted {
            return Err(EtcdError::Compacted);
        }
        if revision > self.revision {
            return Err(EtcdError::FutureRevision);
        }
        self.compact_unchecked(revision);
        Ok(())
    }

    fn compact_unchecked(&mut self, revision: i64) {
        self.compacted = revision;
        self.keys.retain(|_, history| {
            let n = history.partition_point(|v| v.mod_revision() <= revision);
            // The newest version at or before the compaction stays unless it is a deletion,
            // which a read at `revision` or later does not see anyway.
            let keep_from = match history.get(n.wrapping_sub(1)) {
                Some(Version::Live(_)) => n - 1,
                _ => n,
            };
            history.drain(..keep_from);
            !history.is_empty()
        });
        // A watch from the compacted revision still gets its events, deletions included
        // (checked against etcd by the `sim` test).
        self.events
            .retain(|e| e.kv.as_ref().is_some_and(|kv| kv.mod_revision >= revision));
    }

    /// Moves the current revision on by `by` and, if `mark_compacted`, compacts at the result:
    /// `etcdutl snapshot restore --bump-revision N --mark-compacted`.
    pub fn bump(&mut self, by: i64, mark_compacted: bool) {
        self.revision += by;
        if mark_compacted {
            self.compact_unchecked(self.revision);
        }
    }
}

/// What a change does to its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Put,
    Delete,
}

#[derive(Clone, Debug)]
struct Change {
    kind: Kind,
    kv: PbKeyValue,
}

/// The changes of one write (a put, a delete, a transaction, a lease's revocation), all at one
/// revision; reads through it see its own changes, as a write transaction of etcd does.
#[derive(Debug)]
pub struct Write {
    revision: i64,
    changes: Vec<Change>,
}

impl Write {
    /// The revision a read within this write answers with: the next one once it changed
    /// something, else the current one (etcd's storeTxnWrite.Range).
    pub fn read_revision(&self) -> i64 {
        if self.changes.is_empty() {
            self.revision - 1
        } else {
            self.revision
        }
    }

    /// The live key-values in `range` as this write sees them.
    pub fn range(&self, store: &Store, range: &KeyRange) -> Vec<PbKeyValue> {
        let mut seen: BTreeMap<Vec<u8>, Option<PbKeyValue>> = (store.range_at(range, 0).into_iter())
            .map(|kv| (kv.key.clone(), Some(kv)))
            .collect();
        for c in self.changes.iter().filter(|c| range.contains(&c.kv.key)) {
            let now = (c.kind == Kind::Put).then(|| c.kv.clone());
            seen.insert(c.kv.key.clone(), now);
        }
        seen.into_values().flatten().collect()
    }

    /// Each changed key with its new lease (`None`: deleted), in the order of the changes.
    pub fn changes(&self) -> impl Iterator<Item = (&[u8], Option<i64>)> {
        (self.changes.iter()).map(|c| (c.kv.key.as_slice(), (c.kind == Kind::Put).then_some(c.kv.lease)))
    }

    /// Puts `value` with `lease` at `key`; returns the previous key-value.
    pub fn put(&mut self, store: &Store, key: &[u8], value: Vec<u8>, lease: i64) -> Option<PbKeyValue> {
        let prev = self.range(store, &KeyRange::new(key, &[])).pop();
        let kv = PbKeyValue {
            key: key.to_vec(),
            create_revision: prev.as_ref().map_or(self.revision, |p| p.create_revision),
            mod_revision: self.revision,
            version: prev.as_ref().map_or(1, |p| p.version + 1),
            value,
            lease,
        };
        self.changes.push(Change { kind: Kind::Put, kv });
        prev
    }

    /// Deletes every live key in `range`; returns what was deleted, in key order.
    pub fn delete(&mut self, store: &Store, range: &KeyRange) -> Vec<PbKeyValue> {
        let gone = self.range(store, range);
        for kv in &gone {
            let tombstone = PbKeyValue {
                key: kv.key.clone(),
                mod_revision: self.revision,
                ..PbKeyValue::default()
            };
            self.changes.push(Change {
                kind: Kind::Delete,
                kv: tombstone,
            });
        }
        gone
    }
}
