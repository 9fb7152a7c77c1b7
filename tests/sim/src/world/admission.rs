//! Admission, checked on etcd itself at every change (#54 item 4; the safety run's etcd log
//! check, `tests/safety/eventlog`, on the simulated etcd): a key is *admitted* once the queue's
//! rule lets it in by its position (`protocol::holders`, the keys ahead of it as they are, its
//! own grant record and handoff left out), and stays admitted until deleted. A key that
//! records its grant (`acquiredAt`) or is handed one by a release must be admitted by then: a
//! grant the rule did not make is what a handoff under changed settings, or a read that counts
//! a handed grant as recorded, hands out. The world's other checks see grants when their
//! answers come; this one sees the revision each was decided at.
//!
//! A restore brings back keys the member had deleted since the snapshot (holds released,
//! waits given up): nobody's, they let the keys behind them in as if gone, and a key admitted
//! before the restore stays admitted (its record may land after it).

use super::check::QUEUE_PREFIX;
use super::{LOCKS, NAMESPACE};
use crate::etcd::State;
use podlock::lock::protocol::{self, Queued};
use podlock::lock::{Entry, Settings};
use std::collections::{BTreeMap, BTreeSet};

/// A queue key as the checker follows it.
#[derive(Clone, Copy)]
struct Key {
    queued: Queued,
    admitted: bool,
    /// Brought back by a restore after it was deleted: nobody's.
    brought_back: bool,
}

/// What the admission checker follows: each lock's keys by create revision.
#[derive(Default)]
pub struct Admission {
    locks: Vec<BTreeMap<i64, Key>>,
    /// The keys deleted since the member's data was last wiped, by lock and create revision.
    deleted: BTreeSet<(usize, i64)>,
    /// The member's revision at the last change.
    revision: i64,
    /// The first grant found unadmitted.
    pub failure: Option<String>,
}

impl Admission {
    /// Follows the member's `state` after a change (`rebuilt`: its data was replaced).
    pub fn changed(&mut self, state: &State, rebuilt: bool) {
        let revision = state.store.revision();
        if !rebuilt && revision == self.revision {
            return; // a lease's keepalive, a watch: no key changed
        }
        if rebuilt && revision < self.revision {
            // Wiped (or restored without a bump): revisions start again, and old ones mean
            // nothing any more.
            self.locks.clear();
            self.deleted.clear();
        }
        self.locks.resize_with(LOCKS.len(), BTreeMap::new);
        for (lock, spec) in LOCKS.iter().enumerate() {
            let (max_holders, queue) = read(state, lock);
            let found = self.follow(lock, queue, rebuilt);
            if let Some(max_holders) = max_holders {
                admit(&mut self.locks[lock], max_holders);
            }
            for (created, what) in found.into_iter().filter(|_| max_holders.is_some()) {
                if !self.locks[lock][&created].admitted && self.failure.is_none() {
                    self.failure = Some(format!(
                        "admission: {}'s key {created} {what} at revision {revision}, not admitted \
                         by the queue's rule",
                        spec.name
                    ));
                }
            }
        }
        self.revision = revision;
    }

    /// Takes `queue` as `lock`'s keys now; returns the keys that recorded or were handed a
    /// grant in this change (a rebuilt member's keys are where it starts from: none).
    fn follow(&mut self, lock: usize, queue: Vec<(i64, Queued)>, rebuilt: bool) -> Vec<(i64, &'static str)> {
        let before = std::mem::take(&mut self.locks[lock]);
        let mut found = Vec::new();
        for (created, queued) in queue {
            let was = before.get(&created);
            let key = Key {
                queued,
                admitted: was.is_some_and(|k| k.admitted),
                brought_back: (rebuilt && self.deleted.contains(&(lock, created)))
                    || was.is_some_and(|k| k.brought_back),
            };
            if !rebuilt && !key.brought_back {
                if queued.recorded && !was.is_some_and(|k| k.queued.recorded) {
                    found.push((created, "recorded its grant"));
                } else if queued.handed && !was.is_some_and(|k| k.queued.handed) {
                    found.push((created, "was handed its grant"));
                }
            }
            self.locks[lock].insert(created, key);
        }
        let gone = before.keys().filter(|c| !self.locks[lock].contains_key(c));
        self.deleted.extend(gone.map(|c| (lock, *c)));
        found
    }
}

/// Admits the keys of `keys` that the queue's rule lets in now under `max_holders`.
fn admit(keys: &mut BTreeMap<i64, Key>, max_holders: u32) {
    let live: Vec<i64> = (keys.iter())
        .filter(|(_, k)| !k.brought_back)
        .map(|(c, _)| *c)
        .collect();
    let queue: Vec<Queued> = live.iter().map(|c| keys[c].queued).collect();
    for (i, created) in live.iter().enumerate() {
        let mut own = queue[..=i].to_vec();
        // By its position alone: its own record, handoff and set left out.
        own[i] = Queued {
            recorded: false,
            handed: false,
            set: false,
            ..own[i]
        };
        if protocol::holders(&own, max_holders) > i {
            keys.get_mut(created).expect("a live key").admitted = true;
        }
    }
}

/// `LOCKS[lock]`'s `maxHolders` in `state` (`None` while undeclared) and its queue: each key's
/// create revision and what the rule reads of it.
fn read(state: &State, lock: usize) -> (Option<u32>, Vec<(i64, Queued)>) {
    let config = format!("/podlock/v1/config/{NAMESPACE}/{}", LOCKS[lock].name); // protocol/keys.rs
    let prefix = format!("{QUEUE_PREFIX}{NAMESPACE}/{}/", LOCKS[lock].name);
    let settings = (state.keys_under(config.as_bytes()).iter())
        .find(|kv| kv.key == config.as_bytes())
        .and_then(|kv| serde_json::from_slice::<Settings>(&kv.value).ok());
    let queue = (state.keys_under(prefix.as_bytes()).iter())
        .filter(|kv| !String::from_utf8_lossy(&kv.key).contains("/.released/"))
        .map(|kv| (kv.create_revision, Queued::of(Entry::decode(&kv.value).as_ref())))
        .collect();
    (settings.map(|s| s.max_holders), queue)
}
