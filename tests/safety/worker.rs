//! The checker's workers: correct clients of a lock. Each one follows its sidecar's events
//! stream, acquires, does its work and releases, and stops treating a hold as its own the
//! moment it learns the hold is lost: a `lost` event, a refused release, or its events stream
//! breaking (its sidecar died). A worker of the mutex increments the fenced counter once per
//! hold; a worker of the semaphore only holds for a while (its slots are checked by overlap).

use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::apis;
use super::client::{Grant, LockClient};
use super::history::{History, OpKind, Outcome};
use super::register::Register;
use super::spec::{Api, Spec};
use super::{COUNTER, TTL, now};
use crate::common::wait_until;

/// How long a paused worker stalls between its grant and its write: past the TTL, and past the
/// moment its sidecar (stopped for the TTL plus 1 s) resumes.
pub const STALL: Duration = Duration::from_millis(TTL.as_millis() as u64 + 1500);

/// The heartbeat window of every hold: far longer than a hold's work, so only a stalled
/// worker misses it (the mutex's workers never heartbeat; the semaphore's, once a hold).
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// What a worker saw of one hold. Times are wall-clock seconds since the Unix epoch.
#[derive(Debug, Clone)]
pub struct HoldRecord {
    /// The lock.
    pub lock: &'static str,
    /// The worker index.
    pub worker: usize,
    /// Its sidecar's index (a mutex worker's is its own index; the fault loop's pauses name
    /// sidecars by it).
    pub sidecar: usize,
    /// The fencing token.
    pub token: i64,
    /// How many of the lock's slots it took.
    pub permits: u32,
    /// When its sidecar made the grant (the grant's `acquiredAt`, to the millisecond): after
    /// the sidecar decided, before it answered, so it orders grants as the lock made them.
    pub acquired: f64,
    /// When the grant arrived.
    pub granted: f64,
    /// When the worker stopped treating the hold as its own: it sent release, or learned that
    /// the hold was lost, whichever came first.
    pub ended: f64,
    /// When it learned that the hold was lost, if it was.
    pub lost: Option<f64>,
    /// Its write; `None` if it learned of the loss before writing.
    pub write: Option<WriteRecord>,
}

/// A worker's write to the fenced counter.
#[derive(Debug, Clone, Copy)]
pub struct WriteRecord {
    /// When it was sent.
    pub sent: f64,
    /// The store's answer: 200 accepted, 409 rejected (stale token), 0 none.
    pub status: u16,
    /// Made after a deliberate pause without looking at the hold first (a GC pause between
    /// the decision to write and the write).
    pub paused: bool,
}

/// One worker's state, shared with the fault loop.
pub struct Slot {
    /// The worker's pod name, its holder id.
    pub pod: String,
    /// The lock it takes.
    pub lock: &'static str,
    /// Its sidecar's index.
    pub sidecar: usize,
    /// The address of its sidecar now (a restarted sidecar listens elsewhere).
    pub addr: Mutex<String>,
    /// Set by the fault loop: stall after the next grant.
    pub stall: AtomicBool,
    /// Set by the fault loop: stall just before the next release (its sidecar is then paused,
    /// so the release reaches it only after its lease ended and another worker took over).
    pub stall_release: AtomicBool,
    /// Set by the fault loop with `stall`: heartbeat while stalled, as a hung app whose
    /// heartbeat still runs (only a force release or its pod's deletion then ends its hold).
    pub stall_beating: AtomicBool,
    /// Set by the fault loop with `stall`: end the stall at a `yield` event, as an app that
    /// heeds a request to yield (else it stalls on, as a hung app, and is ended at the deadline).
    pub heeds_yield: AtomicBool,
    /// Set while stalling, holding the lock, before the write or the release.
    pub stalling: AtomicBool,
    /// Every hold it had.
    pub holds: Mutex<Vec<HoldRecord>>,
}

impl Slot {
    /// A worker slot for `pod`, taking `lock` through its sidecar `sidecar`, at `addr`.
    pub fn new(pod: &str, lock: &'static str, sidecar: usize, addr: &str) -> Arc<Self> {
        Arc::new(Slot {
            pod: pod.into(),
            lock,
            sidecar,
            addr: Mutex::new(addr.into()),
            stall: AtomicBool::new(false),
            stall_release: AtomicBool::new(false),
            stall_beating: AtomicBool::new(false),
            heeds_yield: AtomicBool::new(false),
            stalling: AtomicBool::new(false),
            holds: Mutex::default(),
        })
    }
}

/// After dropping a waiting acquire: its grant may have raced the drop, so once the sidecar
/// is done with it (no longer waiting), release whatever it left held. Release never touches a
/// waiting key: a waiter the sidecar failed to remove still shows in etcd.
async fn abandon(c: &LockClient, addr: &str) {
    let _ = wait_until(Duration::from_secs(2), || async {
        let Ok(resp) = c.http.get(format!("{addr}/v1/locks")).send().await else {
            return true;
        };
        let mine = resp.json::<Value>().await.unwrap_or_default()["locks"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|l| l["lock"] == c.lock && l["holderId"] == c.holder_id() && l["state"] == "waiting");
        !mine
    })
    .await;
    c.end_or_beat(addr, "release").await;
}

/// Where a mutex worker writes: the fenced counter's URL, and the register it writes to after a
/// fence check ([`Register`]).
#[derive(Clone)]
pub struct Stores {
    /// The fenced counter.
    pub fenced: String,
    /// The register that keeps no token.
    pub register: Arc<Register>,
}

/// One worker: its slot, its recording client, and the stores if it writes.
struct Worker {
    slot: Arc<Slot>,
    store: Option<Stores>,
    c: LockClient,
}

/// What the worker knows of its hold being lost, from its events stream.
type Lost<'a> = &'a (dyn Fn() -> Option<f64> + Sync);

impl Worker {
    /// The work under the lock: the counter's increment, made only while the hold is not known
    /// lost (a holder paused on purpose has already decided to write), or for a semaphore's
    /// worker a while of holding (20 to 80 ms, so that holds overlap in every way) with a
    /// heartbeat halfway; then the pause before release that the fault loop may have asked
    /// for. Returns the write, and when the hold was last confirmed (a heartbeat answered).
    async fn work(
        &self,
        addr: &str,
        g: &Grant,
        (lost, asked): (Lost<'_>, Lost<'_>),
    ) -> (Option<WriteRecord>, f64) {
        let slot = &self.slot;
        let checked = match &self.store {
            Some(_) => self.fence_check(addr, g.token).await,
            None => false,
        };
        let paused = slot.stall.swap(false, Ordering::Relaxed) || self.outstays(g.token);
        if paused {
            slot.stalling.store(true, Ordering::Relaxed);
            match slot.stall_beating.swap(false, Ordering::Relaxed) {
                true => self.stall_beating(addr, lost, asked).await,
                false => sleep(STALL).await,
            }
            slot.stalling.store(false, Ordering::Relaxed);
        }
        let mut confirmed = g.call;
        if let Some(store) = self.store.as_ref().filter(|_| checked) {
            store.register.write(g.token); // checked before the pause: it does not check again
        }
        let write = match &self.store {
            Some(store) if paused || lost().is_none() => {
                Some(self.write(&store.fenced, g.token, paused).await)
            }
            Some(_) => None,
            None => {
                let half = Duration::from_millis(10 + g.token.rem_euclid(5) as u64 * 8);
                sleep(half).await;
                let at = now();
                if self.c.end_or_beat(addr, "heartbeat").await == Some(200) {
                    confirmed = at;
                }
                sleep(half).await;
                None
            }
        };
        sleep(Duration::from_millis(10)).await; // the rest of the work under the lock
        if slot.stall_release.swap(false, Ordering::Relaxed) {
            slot.stalling.store(true, Ordering::Relaxed);
            sleep(Duration::from_millis(300)).await; // the fault loop stops the sidecar meanwhile
            slot.stalling.store(false, Ordering::Relaxed);
        }
        (write, confirmed)
    }

    /// Whether the hold with `token` outstays its maximum hold time: one in 8 of a worker that
    /// asks for one pauses for [`STALL`], past its deadline, before its write, as a stall does.
    fn outstays(&self, token: i64) -> bool {
        self.c.max_hold.is_some() && token.rem_euclid(8) == 0
    }

    /// Stalls for [`STALL`], heartbeating every 300 ms (inside the 1 s window) until the hold
    /// is known lost, or, for a worker that heeds one, asked to yield.
    async fn stall_beating(&self, addr: &str, lost: Lost<'_>, asked: Lost<'_>) {
        let until = tokio::time::Instant::now() + STALL;
        let heeds = self.slot.heeds_yield.swap(false, Ordering::Relaxed);
        let yielding = || heeds && asked().is_some();
        while tokio::time::Instant::now() < until && lost().is_none() && !yielding() {
            sleep(Duration::from_millis(300)).await;
            self.c.end_or_beat(addr, "heartbeat").await;
        }
    }

    /// Whether the sidecar at `addr` calls `token` current for the counter (the fence check).
    async fn fence_check(&self, addr: &str, token: i64) -> bool {
        let url = format!("{addr}/v1/locks/{COUNTER}/fence?token={token}");
        let Ok(resp) = self.c.http.get(url).send().await else {
            return false;
        };
        let body: Option<Value> = resp.json().await.ok();
        body.is_some_and(|b| b["current"] == true)
    }

    /// Increments the counter at `store` with `token`.
    async fn write(&self, store: &str, token: i64, paused: bool) -> WriteRecord {
        let sent = now();
        let url = format!("{store}/increment?token={token}&writer={}", self.slot.pod);
        let status = match self.c.http.post(url).send().await {
            Ok(r) => r.status().as_u16(),
            Err(_) => 0,
        };
        WriteRecord { sent, status, paused }
    }

    /// Ends the hold: when it stopped counting as the worker's own, and when the worker learned
    /// it was lost, if it was. Told before releasing, there is nothing to release; else a
    /// refused release (410 or 409: lost meanwhile) or none answered (the sidecar died) is a
    /// loss. A `lost` event or a 410 is recorded as the hold's end in the history.
    async fn finish(&self, addr: &str, g: &Grant, confirmed: f64, lost: Lost<'_>) -> (f64, Option<f64>) {
        if let Some(at) = lost() {
            self.c.told(g, confirmed, at, true);
            return (at, Some(at));
        }
        let sent = now();
        let status = self.c.end_or_beat(addr, "release").await;
        if status == Some(200) {
            return (sent, None);
        }
        let at = lost().unwrap_or_else(now);
        if status == Some(410) || lost().is_some() {
            self.c.told(g, confirmed, at, true);
        }
        (sent, Some(at))
    }
}

/// Runs worker `i` as `spec` says until `stop`, hold after hold, recording every call in
/// `history`. With a `store`, each hold increments its fenced counter once, and writes to its
/// register if a fence check before calls its token current.
pub async fn run(
    (i, spec): (usize, Spec),
    slot: Arc<Slot>,
    store: Option<Stores>,
    history: Arc<History>,
    stop: CancellationToken,
) {
    let c = LockClient {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        streams: reqwest::Client::new(),
        history,
        lock: slot.lock,
        pod: slot.pod.clone(),
        holder: spec.holder.map(String::from),
        row: i,
        sidecar: spec.sidecar,
        mode: spec.mode,
        with: spec.with,
        max_hold: spec.max_hold,
        permits: spec.permits,
    };
    match spec.api {
        Api::Acquire => acquire_loop(Worker { slot, store, c }, stop).await,
        Api::Hold => apis::hold_loop(&c, &slot, stop).await,
        Api::LockCmd => apis::lock_cmd_loop(&c, &slot, stop).await,
    }
}

/// Acquires and releases until `stop`: each hold does its work ([`Worker::work`]). On `stop`
/// an acquire still waiting is dropped (the client goes away): recorded without an answer.
async fn acquire_loop(w: Worker, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let addr = w.slot.addr.lock().unwrap().clone();
        // Follow the events before acquiring, so that no lost notice of the hold is missed.
        let Some((notices, _follower)) = w.c.follow_events(&addr).await else {
            sleep(Duration::from_millis(100)).await;
            continue;
        };
        let call = now();
        // A worker with a maximum hold time has no heartbeat window: its deadline ends its
        // outstaying holds, not a missed heartbeat.
        let window = if w.c.max_hold.is_some() {
            Duration::ZERO
        } else {
            HEARTBEAT
        };
        let grant = tokio::select! {
            grant = w.c.acquire(&addr, call, window) => grant,
            _ = stop.cancelled() => {
                w.c.record(OpKind::Acquire, "acquire", call, Outcome::Unknown, 0);
                return abandon(&w.c, &addr).await;
            }
        };
        let Some(g) = grant else {
            sleep(Duration::from_millis(50)).await; // refused, or no sidecar: try again
            continue;
        };
        let granted = now();
        let lost = || notices.lock().unwrap().lost(g.token);
        let asked = || notices.lock().unwrap().asked(g.token);
        let (write, confirmed) = w.work(&addr, &g, (&lost, &asked)).await;
        let (ended, lost) = w.finish(&addr, &g, confirmed, &lost).await;
        // One record per lock of its set; the counter's write on the counter's record alone.
        let mut holds = w.slot.holds.lock().unwrap();
        holds.extend(w.c.locks().map(|lock| HoldRecord {
            lock,
            worker: w.c.row,
            sidecar: w.c.sidecar,
            token: g.token,
            permits: w.c.permits.unwrap_or(1),
            acquired: g.acquired,
            granted,
            ended,
            lost,
            write: write.filter(|_| lock == COUNTER),
        }));
    }
}
