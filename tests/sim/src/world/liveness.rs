//! Waiter liveness (#54, item 4): a waiter that a free slot would admit is granted within a
//! bound. Judged from etcd itself, by the engine's own rule of who holds
//! (`protocol::holders`), so that it cannot blame the engine for what a fault did: every
//! [`SAMPLE`] the checker reads each lock's settings and queue in the simulated etcd; a key
//! that the rule says holds, whose grant is not recorded, and whose client's acquire (the one
//! that wrote it: requested no earlier than that acquire was asked) is still unanswered is
//! *due*. A key due in every sample for [`BOUND`], counted from when it was first due or, if
//! a fault touched its pod or etcd meanwhile, from [`SETTLE`] after that fault ended, must have
//! been answered granted: an acquire still waiting then, or refused, breaks the rule. The
//! bound is the contract's handoff bound (1 s) with headroom for the sampling.

use super::check::QUEUE_PREFIX;
use super::shared::Shared;
use super::{LOCKS, NAMESPACE, World};
use crate::etcd::Etcd;
use podlock::lock::protocol::{self, Queued};
use podlock::lock::{Entry, Settings, clock, rfc3339};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep};

/// How often the checker reads etcd while some acquire waits for its answer.
const SAMPLE: Duration = Duration::from_millis(100);
/// How long a due waiter may go unanswered: the contract's 1 s handoff bound and a sample.
pub const BOUND: Duration = Duration::from_millis(1_100);
/// How long after a fault its pod (or, for a fault of etcd, every pod) is left alone: the
/// engine's first pause before it reads or watches again after a broken watch is 200 ms.
const SETTLE: Duration = Duration::from_secs(2);

/// An acquire waiting for its answer.
struct Asked {
    /// When it was asked, by the engine's clock, as entries stamp `requestedAt`.
    wall: String,
}

/// A key seen due: whose, and since when.
struct Due {
    holder: String,
    since: Instant,
}

/// What the liveness checker follows.
#[derive(Default)]
pub struct Waits {
    /// Per holder id, its acquire waiting for an answer.
    asked: BTreeMap<String, Asked>,
    /// Faults begun: until when they may disturb which pod (`None`: etcd, so every pod).
    faults: Vec<(Instant, Option<usize>)>,
    /// The keys due in the last sample, by lock and create revision.
    due: BTreeMap<(usize, i64), Due>,
}

impl Waits {
    /// `holder`'s acquire was answered, `granted` or not: refused while its key had been due
    /// for the bound, undisturbed, breaks the rule.
    pub fn answered(&mut self, holder: &str, granted: bool) -> Result<(), String> {
        self.asked.remove(holder);
        let Some((&key, due)) = self.due.iter().find(|(_, d)| d.holder == holder) else {
            return Ok(());
        };
        let (late, since) = (!granted && self.overdue(due), due.since);
        self.due.remove(&key);
        match late {
            true => Err(format!(
                "liveness: {holder} refused, its key of {} due since {:?} ago",
                LOCKS[key.0].name,
                since.elapsed()
            )),
            false => Ok(()),
        }
    }

    /// Whether `due` has been due for the bound (see [`Waits::overdue_since`]).
    fn overdue(&self, due: &Due) -> bool {
        self.overdue_since(pod_of(&due.holder), due.since)
    }

    /// Whether something wrong at `pod` since `since` has been so for [`BOUND`] past the later
    /// of `since` and the settling of the last fault that touched that pod or etcd meanwhile:
    /// a fault excuses what it causes for as long as it lasts and [`SETTLE`] after, no longer.
    pub fn overdue_since(&self, pod: usize, since: Instant) -> bool {
        let near = |&&(end, p): &&(Instant, Option<usize>)| (p.is_none() || p == Some(pod)) && end >= since;
        let settled = self.faults.iter().filter(near).map(|(end, _)| *end).max();
        Instant::now() >= settled.unwrap_or(since).max(since) + BOUND
    }

    /// Follows the keys due in `etcd` now; the first overdue one breaks the rule.
    fn sample(&mut self, etcd: &Etcd) -> Result<(), String> {
        let mut due = BTreeMap::new();
        for lock in 0..LOCKS.len() {
            for (revision, holder) in self.due_in(etcd, lock) {
                let since = (self.due.remove(&(lock, revision))).map_or(Instant::now(), |d| d.since);
                due.insert((lock, revision), Due { holder, since });
            }
        }
        self.due = due;
        match self.due.iter().find(|(_, d)| self.overdue(d)) {
            Some(((lock, _), d)) => Err(format!(
                "liveness: {}'s key of {} due since {:?} ago (by the queue's rule it holds) \
                 and its acquire not answered",
                d.holder,
                LOCKS[*lock].name,
                d.since.elapsed()
            )),
            None => Ok(()),
        }
    }

    /// The keys of `LOCKS[lock]` due now (see the module's doc), by create revision, with their
    /// holder ids.
    fn due_in(&self, etcd: &Etcd, lock: usize) -> Vec<(i64, String)> {
        let (max_holders, queue) = read(etcd, lock);
        let queued: Vec<Queued> = queue.iter().map(|(_, e)| Queued::of(e.as_ref())).collect();
        let holders = protocol::holders(&queued, max_holders);
        (queue.into_iter().take(holders))
            .filter_map(|(revision, e)| Some((revision, e?)))
            .filter(|(_, e)| !e.is_granted() && self.waits_for(e))
            .map(|(revision, e)| (revision, e.holder_id))
            .collect()
    }

    /// Whether `e` is the key of its holder's acquire waiting now.
    pub fn waits_for(&self, e: &Entry) -> bool {
        // RFC 3339 with milliseconds, in UTC: the strings order as the times do.
        (self.asked.get(&e.holder_id)).is_some_and(|a| a.wall <= e.requested_at)
    }
}

/// `LOCKS[lock]`'s `maxHolders` in etcd (0 if not declared) and its queue in order: each key's
/// create revision and entry (`None`: not an entry).
pub fn read(etcd: &Etcd, lock: usize) -> (u32, Vec<(i64, Option<Entry>)>) {
    let config = format!("/podlock/v1/config/{NAMESPACE}/{}", LOCKS[lock].name); // protocol/keys.rs
    let prefix = format!("{QUEUE_PREFIX}{NAMESPACE}/{}/", LOCKS[lock].name);
    etcd.inspect(|s| {
        let settings = (s.keys_under(config.as_bytes()).iter())
            .find(|kv| kv.key == config.as_bytes())
            .and_then(|kv| serde_json::from_slice::<Settings>(&kv.value).ok());
        let mut queue: Vec<(i64, Option<Entry>)> = (s.keys_under(prefix.as_bytes()).iter())
            .filter(|kv| !String::from_utf8_lossy(&kv.key).contains("/.released/"))
            .map(|kv| (kv.create_revision, Entry::decode(&kv.value)))
            .collect();
        queue.sort_by_key(|(revision, _)| *revision);
        (settings.map_or(0, |s| s.max_holders), queue)
    })
}

/// The pod of a client's holder id (`p{pod}c{client}`, `seed.rs`).
pub fn pod_of(holder: &str) -> usize {
    let digits = holder[1..].split('c').next().unwrap_or_default();
    digits.parse().expect("a holder id of the world")
}

/// How long a fault of `kind` may last: a pause or deafness for up to its longest draw
/// (`faults.rs`); the others are over at once.
fn lasting(kind: &str) -> Duration {
    match kind {
        "pause" => Duration::from_secs(6),
        "deaf" | "deaf+break" => Duration::from_secs(3),
        _ => Duration::ZERO,
    }
}

/// Whether a fault of `kind` touches etcd itself (every pod) rather than one pod's network.
fn of_etcd(kind: &str) -> bool {
    !matches!(kind, "pause" | "break" | "deaf" | "deaf+break")
}

impl World {
    /// `holder` asks to acquire now.
    pub fn asking(&self, holder: &str) {
        let wall = rfc3339(clock::now());
        self.with(|s| s.live.asked.insert(holder.to_string(), Asked { wall }));
    }

    /// A fault of `kind` begins now, on `pod` if it is one of a pod's network.
    pub fn disturbed(&self, kind: &str, pod: usize) {
        let pod = (!of_etcd(kind)).then_some(pod);
        let end = Instant::now() + lasting(kind) + SETTLE;
        self.with(|s| s.live.faults.push((end, pod)));
    }
}

/// Samples etcd every [`SAMPLE`], until `stop`: the holds believed (`belief.rs`) each time, the
/// waiters while an acquire waits.
pub async fn run(world: World, etcd: std::sync::Arc<Etcd>, mut stop: oneshot::Receiver<()>) {
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => return,
            _ = sleep(SAMPLE) => {}
        }
        world.with(|s: &mut Shared| {
            let gone = s.check.gone_holds(&etcd);
            s.check.checks += 1;
            let ops = &s.ops;
            let r = s.belief.sample(gone, &s.live, |h| ops.dead_holder(h));
            s.judge(r);
            s.check.checks += 1;
            let r = s.nobody.sample(&etcd, (&s.check, &s.live, &s.ops));
            s.judge(r);
            s.judge_admission();
            if s.live.asked.is_empty() {
                return;
            }
            s.check.checks += 1;
            let r = s.live.sample(&etcd);
            s.judge(r);
        });
    }
}
