//! One lock's keys as the replay of an era leaves them, and the protocol's admission rule.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::Event;
use crate::objects::NAMESPACE;

/// A queue key of the replay.
#[derive(Debug, Clone)]
pub struct Key {
    pub holder: String,
    pub pod: String,
    /// The token epoch it was enqueued under (its entry's `epoch`, absent while 0).
    pub epoch: i64,
    shared: bool,
    /// How many of the lock's slots it takes (its entry's `permits`, absent while 1).
    permits: u32,
    granted: bool,
    /// The revision at which a release handed it its grant.
    handed: Option<i64>,
    pub admitted: Option<i64>,
    pub deleted: Option<i64>,
    /// Brought back by a restore after the era before had deleted it: nobody's hold or wait
    /// (its client was told it ended), until its sidecar or the operator removes it.
    pub brought_back: bool,
}

impl Key {
    /// Whether it was handed its grant by a release.
    pub fn was_handed(&self) -> bool {
        self.handed.is_some()
    }

    /// Whether a client stands behind it: alive, and not brought back after it ended.
    fn live(&self) -> bool {
        self.deleted.is_none() && !self.brought_back
    }
}

/// One lock's state at a revision: its `maxHolders` (none while undeclared), the values it took
/// (revision, value), and its keys by create revision.
#[derive(Debug, Default)]
pub struct Lock {
    limit: Option<u32>,
    limits: Vec<(i64, u32)>,
    pub keys: BTreeMap<i64, Key>,
}

impl Lock {
    /// Admits the keys the rule makes holders now.
    pub fn admit(&mut self, revision: i64) {
        let Some(limit) = self.limit else { return };
        let live: Vec<i64> = (self.keys.iter())
            .filter(|(_, k)| k.live())
            .map(|(c, _)| *c)
            .collect();
        for (i, c) in live.iter().enumerate() {
            let ahead: Vec<&Key> = live[..i].iter().map(|a| &self.keys[a]).collect();
            let k = &self.keys[c];
            let holder = if k.shared {
                ahead.iter().all(|a| a.shared && a.granted)
            } else {
                permits(&ahead) + k.permits <= limit && ahead.iter().all(|a| !a.shared && a.granted)
            };
            if holder && k.admitted.is_none() {
                self.keys.get_mut(c).unwrap().admitted = Some(revision);
            }
        }
    }

    /// At a restored era's first revision: the holders etcd brought back were admitted under
    /// limits this era never saw (holders stay when `maxHolders` is lowered), so they bound it
    /// as a limit in force would.
    pub fn bound_by_seeded_holders(&mut self, revision: i64) {
        let held: Vec<&Key> = (self.keys.values())
            .filter(|k| k.live() && k.admitted.is_some() && !k.shared)
            .collect();
        let held = permits(&held);
        if self.limit.is_some_and(|l| held > l) {
            self.limits.push((revision, held));
        }
    }

    /// The keys handed their grant at `revision` that the rule does not admit.
    pub fn unadmitted_handoffs(&self, name: &str, revision: i64) -> Vec<String> {
        (self.keys.iter())
            .filter(|(_, k)| k.handed == Some(revision) && k.admitted.is_none())
            .map(|(c, _)| format!("{name}: key {c} handed its grant at revision {revision} unadmitted"))
            .collect()
    }

    /// What is wrong with the admitted keys at `revision`, if anything.
    pub fn check(&self, name: &str, revision: i64) -> Option<String> {
        let admitted: Vec<(&i64, &Key)> = (self.keys.iter())
            .filter(|(_, k)| k.live() && k.admitted.is_some())
            .collect();
        let oldest = admitted.iter().filter_map(|(_, k)| k.admitted).min()?;
        let before = self.limits.iter().rev().find(|(r, _)| *r <= oldest);
        let since = self.limits.iter().filter(|(r, _)| *r > oldest);
        let bound = before
            .into_iter()
            .chain(since)
            .map(|(_, l)| *l)
            .max()
            .unwrap_or(1);
        // Shared keys share, however many; exclusive ones, while their permits fit in
        // maxHolders; never both.
        let exclusive: Vec<&Key> = admitted.iter().map(|(_, k)| *k).filter(|k| !k.shared).collect();
        let mixed = !exclusive.is_empty() && exclusive.len() < admitted.len();
        let over = permits(&exclusive) > bound || mixed;
        over.then(|| {
            let tokens: Vec<&i64> = admitted.iter().map(|(c, _)| *c).collect();
            let slots = permits(&exclusive);
            format!(
                "{name} at revision {revision}: keys {tokens:?} admitted together (maxHolders {bound}, \
                 {slots} permits exclusive)"
            )
        })
    }
}

/// How many slots `keys` take together.
fn permits(keys: &[&Key]) -> u32 {
    keys.iter().map(|k| k.permits).sum()
}

/// The lock and the rest of a key of the checker's namespace: `config`, or the queue's
/// `{lease}/{holder}`.
fn parse(key: &str) -> Option<(&str, &str, Option<&str>)> {
    let rest = key.strip_prefix("/podlock/v1/")?;
    let (kind, rest) = rest.split_once('/')?;
    let rest = rest.strip_prefix(NAMESPACE)?.strip_prefix('/')?;
    match kind {
        // A lock's settings key; not a force release's note (`config/{ns}/.released/...`).
        "config" if !rest.contains('/') => Some((rest, "config", None)),
        "queue" => {
            let (lock, tail) = rest.split_once('/')?;
            Some((lock, "queue", tail.split_once('/').map(|(_, holder)| holder)))
        }
        _ => None,
    }
}

/// What applying an event found.
#[derive(Debug, Default)]
pub struct Applied {
    /// A violation, in words.
    pub violation: Option<String>,
    /// Whether a release handed a semaphore's slot to the key.
    pub handed_slot: bool,
}

/// The locks of one era, and the create revision of each key alive in it.
#[derive(Debug, Default)]
pub struct Era {
    pub locks: HashMap<String, Lock>,
    created: HashMap<String, i64>,
    /// The keys (lock, create revision) that held when the era before ended.
    held_before: HashSet<(String, i64)>,
    /// The keys (lock, create revision) the era before deleted.
    ended_before: HashSet<(String, i64)>,
}

impl Era {
    /// An era that follows `before`. A restore brings back keys `before` deleted after the
    /// snapshot (holds released, waits given up): nobody's, they hold no one back here
    /// ([`Key::brought_back`]), as the holds of clients; a release whose hold goes on from
    /// `before` hands its grant past them by the chain it read there. And it may bring back a
    /// key that waited when the snapshot was taken and held when `before` ended, its client
    /// granted there: the grant record its sidecar sent then can land in this era (sent again
    /// after the restore, its guards met by the keys the snapshot brought back). Its admission
    /// is the earlier era's: the record is no violation here.
    pub fn after(before: &Era) -> Era {
        let held = before.locks.iter().flat_map(|(name, lock)| {
            let live = lock
                .keys
                .iter()
                .filter(|(_, k)| k.admitted.is_some() && k.deleted.is_none());
            live.map(|(c, _)| (name.clone(), *c))
        });
        let ended = before.locks.iter().flat_map(|(name, lock)| {
            let gone = lock.keys.iter().filter(|(_, k)| k.deleted.is_some());
            gone.map(|(c, _)| (name.clone(), *c))
        });
        Era {
            held_before: held.collect(),
            ended_before: ended.collect(),
            ..Era::default()
        }
    }

    /// Applies one event. A grant recorded by a key not admitted is a violation, unless the
    /// key was seeded: the state an era starts from is checked as a whole, once applied.
    pub fn apply(&mut self, e: &Event) -> Applied {
        let mut found = Applied::default();
        let Some((name, kind, holder)) = parse(&e.key) else {
            return found;
        };
        let lock = self.locks.entry(name.into()).or_default();
        if kind == "config" {
            lock.limit = (e.value.as_ref())
                .and_then(|v| v["maxHolders"].as_u64())
                .map(|l| l as u32);
            lock.limits.extend(lock.limit.map(|l| (e.revision, l)));
            return found;
        }
        let Some(v) = &e.value else {
            if let Some(k) = self.created.remove(&e.key).and_then(|c| lock.keys.get_mut(&c)) {
                k.deleted = Some(e.revision);
            }
            return found;
        };
        let c = *self.created.entry(e.key.clone()).or_insert(e.created);
        let k = lock.keys.entry(c).or_insert_with(|| Key {
            holder: holder.unwrap_or_default().into(),
            pod: v["pod"]["name"].as_str().unwrap_or_default().into(),
            epoch: v["epoch"].as_i64().unwrap_or(0),
            shared: v["mode"] == "shared",
            permits: v["permits"].as_u64().map_or(1, |p| p as u32),
            granted: false,
            handed: None,
            admitted: None,
            deleted: None,
            brought_back: false,
        });
        if e.seeded && self.ended_before.contains(&(name.to_string(), c)) {
            k.brought_back = true;
        }
        if v["handed"] == true && k.handed.is_none() && !e.seeded {
            k.handed = Some(e.revision);
            found.handed_slot = lock.limit.is_some_and(|l| l > 1);
        }
        k.granted = v["acquiredAt"].is_string();
        if e.seeded && (k.granted || v["handed"] == true) {
            // Brought back as it was: it held when the snapshot was taken, admitted in the
            // era it comes from (and checked there).
            k.admitted.get_or_insert(e.revision);
        }
        // A record decided in the era before lands here; it is no admission in this one,
        // where the key waits behind the holds the restore brought back.
        let decided_before = self.held_before.contains(&(name.to_string(), c));
        if k.granted && k.admitted.is_none() && !e.seeded && !decided_before {
            found.violation = Some(format!(
                "{name}: key {c} recorded its grant at revision {} unadmitted",
                e.revision
            ));
        }
        found
    }
}
