//! The grants against etcd's own log. While the workers run, a watch over every podlock key
//! (from revision 1: the settings and the queues) records each event and when it arrived;
//! afterwards the log is replayed in revision order. At each revision a queue key is admitted
//! when the protocol's rule (`src/lock/protocol/position.rs`) makes it a holder: a shared key once every
//! key ahead of it is shared and has recorded its grant (`acquiredAt`); an exclusive key once
//! its permits and those of the keys ahead of it fit in `maxHolders`, all of them exclusive and
//! granted (a mutex's: none ahead). Admitted keys stay admitted until deleted. The replay checks
//! that
//!
//! * at every revision the admitted keys fit: exclusive ones' permits never more than the
//!   largest `maxHolders` in force since the oldest of them was admitted (a lowering binds new
//!   grants only), and never beside shared ones;
//! * every key that recorded its grant (`acquiredAt`) had been admitted by then, and every key
//!   a release handed its grant to (`handed`, direct handoff) is admitted at that revision;
//! * every token a client was granted is the create revision of a key of its lock and holder
//!   id that was admitted at a revision after the client asked (later than every revision the
//!   watch had delivered by then) and before it was deleted, and whose entry names the
//!   token's epoch.
//!
//! A fault that rebuilds etcd (wiped, or restored from a snapshot) starts a new era of
//! revisions ([`record`]): each era is replayed on its own, a restored one from the keys etcd
//! held when it came back, and a grant must fit a key of one era. A key brought back that the
//! era before had deleted is nobody's hold or wait (its client was told it ended): it admits
//! and counts as no one, as the protocol model's *limit* counts the clients that hold.

use serde_json::Value;
use std::collections::HashSet;

use super::history::{Op, OpKind, Outcome};
use lock::{Era, Key};

mod lock;
mod record;
#[cfg(test)]
mod tests;

pub use record::record;

/// The bits of a fencing token below its epoch (`epoch * 2^40 + revision`).
const REVISION_BITS: u32 = 40;

/// One event of the log.
#[derive(Debug, Clone)]
pub struct Event {
    /// The era of etcd it belongs to: 0 until etcd is first rebuilt.
    pub era: usize,
    /// Its revision.
    pub revision: i64,
    /// The key's create revision (0 for a deletion).
    pub created: i64,
    /// The key.
    pub key: String,
    /// Its value, `None` for a deletion.
    pub value: Option<Value>,
    /// Whether it is a key etcd held when a restored era began, not a change.
    pub seeded: bool,
}

/// When the watch delivered a response, and its newest revision.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    pub at: f64,
    pub era: usize,
    pub revision: i64,
}

/// The log as the watch delivered it, and when each revision arrived.
#[derive(Debug, Default)]
pub struct Log {
    /// Every event.
    pub events: Vec<Event>,
    /// Each response's newest revision, on arrival.
    pub arrivals: Vec<Arrival>,
}

/// The replay: each era's locks as the log left them, and what was wrong on the way.
#[derive(Debug, Default)]
pub struct Replay {
    eras: Vec<Era>,
    /// Violations, in words.
    pub violations: Vec<String>,
    /// Revisions replayed, and keys admitted.
    pub revisions: usize,
    /// Keys admitted.
    pub admitted: usize,
    /// Keys handed their grant by a release.
    pub handed: usize,
    /// Of those, keys of a semaphore (`maxHolders` above 1 when handed): a slot handed on.
    pub handed_slots: usize,
    /// Keys a restore brought back after the era before had deleted them.
    pub brought_back: usize,
    /// Grants that fit no key, asked for before an era ended with a token above its log's
    /// last revision: their events may have gone with a rebuilt etcd.
    pub unverifiable: usize,
}

/// Replays `log`, each era in revision order.
pub fn replay(log: &Log) -> Replay {
    let mut events = log.events.clone();
    events.sort_by_key(|e| (e.era, e.revision));
    events.dedup_by(|a, b| (a.era, a.revision, &a.key) == (b.era, b.revision, &b.key));
    let mut r = Replay::default();
    for era in events.chunk_by(|a, b| a.era == b.era) {
        while r.eras.len() <= era[0].era {
            let next = r.eras.last().map_or_else(Era::default, Era::after);
            r.eras.push(next);
        }
        let locks = r.eras.last_mut().unwrap();
        for same in era.chunk_by(|a, b| a.revision == b.revision) {
            let revision = same[0].revision;
            for e in same {
                let found = locks.apply(e);
                r.violations.extend(found.violation);
                r.handed_slots += usize::from(found.handed_slot);
            }
            for (name, lock) in &mut locks.locks {
                if same[0].seeded {
                    lock.bound_by_seeded_holders(revision);
                }
                lock.admit(revision);
                r.violations.extend(lock.check(name, revision));
                r.violations.extend(lock.unadmitted_handoffs(name, revision));
            }
            r.revisions += 1;
        }
    }
    let keys = || (r.eras.iter()).flat_map(|e| e.locks.values().flat_map(|l| l.keys.values()));
    r.admitted = keys().filter(|k| k.admitted.is_some()).count();
    r.handed = keys().filter(|k| k.was_handed()).count();
    r.brought_back = keys().filter(|k| k.brought_back).count();
    r
}

impl Replay {
    /// One line for the report, of a log of `events` events in which `grants` were found.
    pub fn summary(&self, events: usize, grants: usize) -> String {
        format!(
            "etcd's log: {events} events in {} eras over {} revisions replayed, {} queue keys \
             admitted ({} handed their grant by a release, {} of them a semaphore's slot; {} \
             brought back by a restore after they had ended, holding no one back), {grants} \
             grants found admitted in it ({} more asked for as a rebuilt etcd's log ended, \
             their key or its admission beyond what the watch delivered); violations: {}",
            self.eras.len(),
            self.revisions,
            self.admitted,
            self.handed,
            self.handed_slots,
            self.brought_back,
            self.unverifiable,
            self.violations.len()
        )
    }

    /// Checks every grant of the history against the replay: its token names a key of its
    /// lock, pod, holder id and epoch, in some era, admitted after the newest revision of that
    /// era the watch had delivered when the client asked (for a grant again of a hold, alive
    /// then), before its deletion. A grant that fits no key but may lie in the part of an
    /// era's log that went with its etcd, unsent to the watch, is counted apart (see
    /// [`Delivered::lost_with_its_era`]). Returns the grants checked.
    pub fn check_grants(&mut self, ops: &[Op], arrivals: &[Arrival]) -> usize {
        let delivered = Delivered::new(arrivals);
        let mut seen = HashSet::new();
        let mut checked = 0;
        let grants = (ops.iter()).filter(|o| o.kind == OpKind::Acquire && o.outcome == Outcome::Ok);
        for op in grants {
            let again = !seen.insert((op.lock, op.token));
            let fits = (self.eras.iter().enumerate()).any(|(era, locks)| {
                let asked = delivered.by(era, op.call);
                let key = locks
                    .locks
                    .get(op.lock)
                    .and_then(|l| l.keys.get(&revision(op.token)));
                key.is_some_and(|k| fits(k, op, asked, again))
            });
            if !fits && (delivered.lost_with_its_era(op) || self.admitted_unseen(op, &delivered)) {
                self.unverifiable += 1;
                continue;
            }
            checked += 1;
            if !fits {
                self.violations.push(format!(
                    "{} granted token {} to {}: no key of any era fits it ({})",
                    op.lock,
                    op.token,
                    op.client,
                    self.why_none_fits(op, &delivered, again)
                ));
            }
        }
        checked
    }

    /// Whether `op`'s grant names a key that an era which ended (its etcd wiped or restored)
    /// still shows queued, unadmitted, at its end, the client having asked before the next era's
    /// first delivery: its admission may lie in the part of that era's log that went with its
    /// etcd, unsent to the watch (a release just before a wipe that handed the key its grant).
    fn admitted_unseen(&self, op: &Op, delivered: &Delivered) -> bool {
        (self.eras.iter().enumerate()).any(|(era, locks)| {
            let key = locks
                .locks
                .get(op.lock)
                .and_then(|l| l.keys.get(&revision(op.token)));
            let queued = key.is_some_and(|k| {
                k.admitted.is_none() && k.deleted.is_none() && k.epoch == op.token >> REVISION_BITS
            });
            queued && delivered.ended(era).is_some_and(|end| op.call < end)
        })
    }

    /// Why no era's key fits `op`'s grant: in each era that has a key at its token's revision,
    /// the facts [`fits`] weighs (owner, epoch, admission, deletion, what the watch had
    /// delivered when the client asked), so that a failure says which one failed.
    fn why_none_fits(&self, op: &Op, delivered: &Delivered, again: bool) -> String {
        let mut out = vec![];
        for (era, locks) in self.eras.iter().enumerate() {
            let asked = delivered.by(era, op.call);
            let Some(k) = locks
                .locks
                .get(op.lock)
                .and_then(|l| l.keys.get(&revision(op.token)))
            else {
                continue;
            };
            out.push(format!(
                "era {era}: key of {}/{} epoch {}, admitted {:?}, deleted {:?}; the watch had \
                 delivered revision {asked} when the client asked{}",
                k.pod,
                k.holder,
                k.epoch,
                k.admitted,
                k.deleted,
                if again { ", a grant again" } else { "" }
            ));
        }
        if out.is_empty() {
            return format!("no era has a key created at revision {}", revision(op.token));
        }
        out.join("; ")
    }
}

/// The revision part of a fencing token.
fn revision(token: i64) -> i64 {
    token & ((1 << REVISION_BITS) - 1)
}

/// The newest revision of each era the watch had delivered, over time.
struct Delivered {
    /// Per era: arrival times, and the newest revision delivered by each.
    eras: Vec<(Vec<f64>, Vec<i64>)>,
}

impl Delivered {
    fn new(arrivals: &[Arrival]) -> Self {
        let mut eras: Vec<(Vec<f64>, Vec<i64>)> = vec![];
        for a in arrivals {
            eras.resize_with(eras.len().max(a.era + 1), Default::default);
            let (times, newest) = &mut eras[a.era];
            let top = newest.last().copied().unwrap_or(0).max(a.revision);
            times.push(a.at);
            newest.push(top);
        }
        Delivered { eras }
    }

    /// Whether `op`'s grant may lie beyond what the watch delivered of an era that ended (its
    /// etcd wiped or restored): asked for before the next era's first delivery, its token's
    /// revision above the era's last one delivered.
    fn lost_with_its_era(&self, op: &Op) -> bool {
        (self.eras.windows(2)).any(|pair| {
            let ((_, newest), (next, _)) = (&pair[0], &pair[1]);
            let ended = next.first().copied().unwrap_or(f64::INFINITY);
            let top = newest.last().copied().unwrap_or(0);
            op.call < ended && revision(op.token) > top
        })
    }

    /// When `era` ended: the next era's first delivery (none for the last one).
    fn ended(&self, era: usize) -> Option<f64> {
        self.eras
            .get(era + 1)
            .and_then(|(times, _)| times.first())
            .copied()
    }

    /// The newest revision of `era` delivered by `t` (0: none).
    fn by(&self, era: usize, t: f64) -> i64 {
        let Some((times, newest)) = self.eras.get(era) else {
            return 0;
        };
        let n = times.partition_point(|at| *at <= t);
        n.checked_sub(1).map_or(0, |i| newest[i])
    }
}

/// Whether `key` can be the one `op` was granted, the client having asked once the watch had
/// delivered revision `asked` of its era.
fn fits(key: &Key, op: &Op, asked: i64, again: bool) -> bool {
    let (pod, holder) = op.client.split_once('/').unwrap_or_default();
    let alive = key.deleted.is_none_or(|d| d > asked);
    key.holder == holder
        && key.pod == pod
        && key.epoch == op.token >> REVISION_BITS
        && alive
        && (again || revision(op.token) > asked)
        && key.admitted.is_some()
}
