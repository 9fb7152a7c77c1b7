//! The grants against etcd's own log. While the workers run, a watch over every podlock key
//! (from revision 1: the settings and the queues) records each event and when it arrived;
//! afterwards the log is replayed in revision order. At each revision a queue key is admitted
//! when the protocol's rule (`src/lock/position.rs`) makes it a holder: a shared key once every
//! key ahead of it is shared and has recorded its grant (`acquiredAt`); an exclusive key once
//! fewer than `maxHolders` keys are ahead of it, all exclusive and granted (a mutex's: none
//! ahead). Admitted keys stay admitted until deleted. The replay checks that
//!
//! * at every revision the admitted keys fit: exclusive ones never more than the largest
//!   `maxHolders` in force since the oldest of them was admitted (a lowering binds new grants
//!   only), and never beside shared ones;
//! * every key that recorded its grant (`acquiredAt`) had been admitted by then, and every key
//!   a release handed its grant to (`handed`, direct handoff) is admitted at that revision;
//! * every token a client was granted is the create revision of a key of its lock and holder
//!   id that was admitted at a revision after the client asked (later than every revision the
//!   watch had delivered by then) and before it was deleted.

use etcd_client::{EventType, WatchOptions};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::{sleep, timeout};

use super::history::{Op, OpKind, Outcome};
use super::now;
use super::objects::NAMESPACE;

/// One event of the log.
#[derive(Debug, Clone)]
pub struct Event {
    /// Its revision.
    pub revision: i64,
    /// The key.
    pub key: String,
    /// Its value, `None` for a deletion.
    pub value: Option<Value>,
}

/// The log as the watch delivered it, and when each revision arrived.
#[derive(Debug, Default)]
pub struct Log {
    /// Every event.
    pub events: Vec<Event>,
    /// (when, revision): each response's newest revision, on arrival.
    pub arrivals: Vec<(f64, i64)>,
}

/// Watches every podlock key from revision 1 until it has delivered revision `end` (set by
/// the caller when it is done: until then `i64::MAX`), watching again from the next revision
/// whenever the stream breaks (a member killed, stalled or cut off).
pub async fn record(endpoints: String, end: Arc<AtomicI64>) -> Log {
    let endpoints: Vec<&str> = endpoints.split(',').collect();
    let log = Mutex::new(Log::default());
    let mut next = 1;
    while next <= end.load(Ordering::Relaxed) {
        let watched = async {
            let mut etcd = etcd_client::Client::connect(&endpoints, None).await?;
            let opts = WatchOptions::new().with_prefix().with_start_revision(next);
            let mut stream = etcd.watch("/podlock/v1/", Some(opts)).await?;
            while next <= end.load(Ordering::Relaxed) {
                // Waits a while at most: the end may be set while no event comes.
                let Ok(resp) = timeout(Duration::from_millis(200), stream.message()).await else {
                    continue;
                };
                match resp? {
                    Some(resp) => next = next.max(take(&log, &resp) + 1),
                    None => break,
                }
            }
            Ok::<_, etcd_client::Error>(())
        };
        if watched.await.is_err() {
            sleep(Duration::from_millis(100)).await;
        }
    }
    log.into_inner().unwrap()
}

/// Adds a watch response's events to the log; its newest revision.
fn take(log: &Mutex<Log>, resp: &etcd_client::WatchResponse) -> i64 {
    let mut log = log.lock().unwrap();
    let mut newest = 0;
    for ev in resp.events() {
        let Some(kv) = ev.kv() else { continue };
        newest = newest.max(kv.mod_revision());
        log.events.push(Event {
            revision: kv.mod_revision(),
            key: String::from_utf8_lossy(kv.key()).into(),
            value: match ev.event_type() {
                EventType::Put => serde_json::from_slice(kv.value()).ok(),
                EventType::Delete => None,
            },
        });
    }
    if newest > 0 {
        log.arrivals.push((now(), newest));
    }
    newest
}

/// A queue key of the replay.
#[derive(Debug, Clone)]
struct Key {
    holder: String,
    pod: String,
    shared: bool,
    granted: bool,
    /// The revision at which a release handed it its grant.
    handed: Option<i64>,
    admitted: Option<i64>,
    deleted: Option<i64>,
}

/// One lock's state at a revision: its `maxHolders` (none while undeclared), the values it took
/// (revision, value), and its keys by create revision.
#[derive(Debug, Default)]
struct Lock {
    limit: Option<u32>,
    limits: Vec<(i64, u32)>,
    keys: BTreeMap<i64, Key>,
}

impl Lock {
    /// Admits the keys the rule makes holders now.
    fn admit(&mut self, revision: i64) {
        let Some(limit) = self.limit else { return };
        let live: Vec<i64> = (self.keys.iter())
            .filter(|(_, k)| k.deleted.is_none())
            .map(|(c, _)| *c)
            .collect();
        for (i, c) in live.iter().enumerate() {
            let ahead: Vec<&Key> = live[..i].iter().map(|a| &self.keys[a]).collect();
            let k = &self.keys[c];
            let holder = if k.shared {
                ahead.iter().all(|a| a.shared && a.granted)
            } else {
                ahead.len() < limit as usize && ahead.iter().all(|a| !a.shared && a.granted)
            };
            if holder && k.admitted.is_none() {
                self.keys.get_mut(c).unwrap().admitted = Some(revision);
            }
        }
    }

    /// The keys handed their grant at `revision` that the rule does not admit.
    fn unadmitted_handoffs(&self, name: &str, revision: i64) -> Vec<String> {
        (self.keys.iter())
            .filter(|(_, k)| k.handed == Some(revision) && k.admitted.is_none())
            .map(|(c, _)| format!("{name}: key {c} handed its grant at revision {revision} unadmitted"))
            .collect()
    }

    /// What is wrong with the admitted keys at `revision`, if anything.
    fn check(&self, name: &str, revision: i64) -> Option<String> {
        let admitted: Vec<(&i64, &Key)> = (self.keys.iter())
            .filter(|(_, k)| k.deleted.is_none() && k.admitted.is_some())
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
        // Shared keys share, however many; exclusive ones, up to maxHolders; never both.
        let exclusive = admitted.iter().filter(|(_, k)| !k.shared).count();
        let over = exclusive > bound as usize || (exclusive > 0 && exclusive < admitted.len());
        over.then(|| {
            let tokens: Vec<&i64> = admitted.iter().map(|(c, _)| *c).collect();
            format!("{name} at revision {revision}: keys {tokens:?} admitted together (maxHolders {bound})")
        })
    }
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

/// The replay: each lock's keys as the log left them, and what was wrong on the way.
#[derive(Debug, Default)]
pub struct Replay {
    locks: HashMap<String, Lock>,
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
}

/// Replays `log` in revision order.
pub fn replay(log: &Log) -> Replay {
    let mut events = log.events.clone();
    events.sort_by_key(|e| e.revision);
    events.dedup_by(|a, b| a.revision == b.revision && a.key == b.key);
    let mut r = Replay::default();
    let mut created: HashMap<String, i64> = HashMap::new();
    for same in events.chunk_by(|a, b| a.revision == b.revision) {
        let revision = same[0].revision;
        for e in same {
            apply(&mut r, &mut created, e);
        }
        for (name, lock) in &mut r.locks {
            lock.admit(revision);
            r.violations.extend(lock.check(name, revision));
            r.violations.extend(lock.unadmitted_handoffs(name, revision));
        }
        r.revisions += 1;
    }
    r.admitted = (r.locks.values().flat_map(|l| l.keys.values()))
        .filter(|k| k.admitted.is_some())
        .count();
    r.handed = (r.locks.values().flat_map(|l| l.keys.values()))
        .filter(|k| k.handed.is_some())
        .count();
    r
}

/// Applies one event; a grant recorded by a key not admitted is a violation.
fn apply(r: &mut Replay, created: &mut HashMap<String, i64>, e: &Event) {
    let Some((name, kind, holder)) = parse(&e.key) else {
        return;
    };
    let lock = r.locks.entry(name.into()).or_default();
    if kind == "config" {
        lock.limit = e
            .value
            .as_ref()
            .and_then(|v| v["maxHolders"].as_u64())
            .map(|l| l as u32);
        lock.limits.extend(lock.limit.map(|l| (e.revision, l)));
        return;
    }
    let Some(v) = &e.value else {
        if let Some(k) = created.remove(&e.key).and_then(|c| lock.keys.get_mut(&c)) {
            k.deleted = Some(e.revision);
        }
        return;
    };
    let c = *created.entry(e.key.clone()).or_insert(e.revision);
    let k = lock.keys.entry(c).or_insert_with(|| Key {
        holder: holder.unwrap_or_default().into(),
        pod: v["pod"]["name"].as_str().unwrap_or_default().into(),
        shared: v["mode"] == "shared",
        granted: false,
        handed: None,
        admitted: None,
        deleted: None,
    });
    if v["handed"] == true && k.handed.is_none() {
        k.handed = Some(e.revision);
        r.handed_slots += usize::from(lock.limit.is_some_and(|l| l > 1));
    }
    k.granted = v["acquiredAt"].is_string();
    if k.granted && k.admitted.is_none() {
        r.violations.push(format!(
            "{name}: key {c} recorded its grant at revision {} unadmitted",
            e.revision
        ));
    }
}

impl Replay {
    /// One line for the report, of a log of `events` events in which `grants` were found.
    pub fn summary(&self, events: usize, grants: usize) -> String {
        format!(
            "etcd's log: {events} events over {} revisions replayed, {} queue keys admitted ({} \
             handed their grant by a release, {} of them a semaphore's slot), {grants} grants found \
             admitted in it; violations: {}",
            self.revisions,
            self.admitted,
            self.handed,
            self.handed_slots,
            self.violations.len()
        )
    }

    /// Checks every grant of the history against the replay: its token names a key of its
    /// lock, pod and holder id, admitted after the newest revision the watch had delivered
    /// when the client asked (for a grant again of a hold, alive then), before its deletion.
    pub fn check_grants(&mut self, ops: &[Op], arrivals: &[(f64, i64)]) -> usize {
        let delivered: Vec<i64> = (arrivals.iter())
            .scan(0, |top, (_, r)| {
                *top = (*top).max(*r);
                Some(*top)
            })
            .collect();
        let mut seen = std::collections::HashSet::new();
        let mut checked = 0;
        for op in ops
            .iter()
            .filter(|o| o.kind == OpKind::Acquire && o.outcome == Outcome::Ok)
        {
            let n = arrivals.partition_point(|(t, _)| *t <= op.call);
            let asked = n.checked_sub(1).map_or(0, |i| delivered[i]);
            let again = !seen.insert((op.lock, op.token));
            let key = self.locks.get(op.lock).and_then(|l| l.keys.get(&op.token));
            let (pod, holder) = op.client.split_once('/').unwrap_or_default();
            let fits = key.is_some_and(|k| {
                let alive = k.deleted.is_none_or(|d| d > asked);
                k.holder == holder
                    && k.pod == pod
                    && alive
                    && (again || op.token > asked)
                    && k.admitted.is_some()
            });
            checked += 1;
            if !fits {
                self.violations.push(format!(
                    "{} granted token {} to {} (asked after revision {asked}): {key:?}",
                    op.lock, op.token, op.client
                ));
            }
        }
        checked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const QUEUE: &str = "/podlock/v1/queue/safety/m/00000000000000aa/";

    fn put(revision: i64, key: &str, value: Value) -> Event {
        Event {
            revision,
            key: key.into(),
            value: Some(value),
        }
    }

    fn entry(holder: &str, granted: bool) -> Event {
        let mut v = json!({"holderId": holder, "pod": {"name": "w0"}});
        if granted {
            v["acquiredAt"] = json!("2026-01-01T00:00:00Z");
        }
        put(0, &format!("{QUEUE}{holder}"), v)
    }

    /// A mutex `m` declared at revision 1, then `events` at revisions 2, 3, ...
    fn log(events: Vec<Event>) -> Log {
        let config = put(1, "/podlock/v1/config/safety/m", json!({"maxHolders": 1}));
        let events = (events.into_iter().enumerate())
            .map(|(i, e)| Event {
                revision: i as i64 + 2,
                ..e
            })
            .chain([config])
            .collect();
        Log {
            events,
            arrivals: vec![],
        }
    }

    fn delete(holder: &str) -> Event {
        Event {
            value: None,
            ..entry(holder, false)
        }
    }

    #[test]
    fn a_grant_handed_out_of_turn_is_caught() {
        let handed = |holder, revision| {
            let mut e = entry(holder, false);
            e.value.as_mut().unwrap()["handed"] = json!(true);
            Event { revision, ..e }
        };
        // a's release (revision 5) hands the lock to c, past b still waiting.
        let mut past = log(vec![
            entry("a", false),
            entry("b", false),
            entry("c", false),
            delete("a"),
        ]);
        past.events.push(handed("c", 5));
        let r = replay(&past);
        assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
        // In turn: to b, in the transaction that deletes a (revision 4).
        let mut next = log(vec![entry("a", false), entry("b", false), delete("a")]);
        next.events.push(handed("b", 4));
        let r = replay(&next);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.handed, 1);
    }

    #[test]
    fn a_grant_recorded_out_of_turn_is_caught() {
        // b records its grant while a, ahead of it, is still there.
        let r = replay(&log(vec![entry("a", false), entry("b", false), entry("b", true)]));
        assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
        // In turn: a goes first.
        let r = replay(&log(vec![
            entry("a", false),
            entry("b", false),
            delete("a"),
            entry("b", true),
        ]));
        assert!(r.violations.is_empty(), "{:?}", r.violations);
    }

    #[test]
    fn a_granted_token_must_name_a_key_admitted_after_the_client_asked() {
        let mut r = replay(&log(vec![entry("a", false), entry("b", false)]));
        let grant = |token: i64, holder: &str| Op {
            lock: "m",
            client: format!("w0/{holder}"),
            row: 0,
            kind: OpKind::Acquire,
            api: "acquire",
            mode: Some("exclusive"),
            granted: None,
            outcome: Outcome::Ok,
            token,
            limit: 0,
            call: 10.0,
            ret: Some(11.0),
        };
        assert_eq!(r.check_grants(&[grant(2, "a")], &[(9.0, 1)]), 1);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        // b's key was never admitted; a's existed before the client asked.
        r.check_grants(&[grant(3, "b")], &[(9.0, 1)]);
        r.check_grants(&[grant(2, "a")], &[(9.0, 3)]);
        assert_eq!(r.violations.len(), 2, "{:?}", r.violations);
    }
}
