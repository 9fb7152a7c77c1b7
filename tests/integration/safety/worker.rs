//! The checker's workers: correct clients of a lock. Each one follows its sidecar's events
//! stream, acquires, does its work and releases, and stops treating a hold as its own the
//! moment it learns the hold is lost: a `lost` event, a refused release, or its events stream
//! breaking (its sidecar died). A worker of the mutex increments the fenced counter once per
//! hold; a worker of the semaphore only holds for a while (its slots are checked by overlap).

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::time::{sleep, timeout};
use tokio_util::sync::CancellationToken;

use super::{TTL, now};
use crate::common::wait_until;

/// How long a paused worker stalls between its grant and its write: past the TTL, and past the
/// moment its sidecar (stopped for the TTL plus 1 s) resumes.
pub const STALL: Duration = Duration::from_millis(TTL.as_millis() as u64 + 1500);

/// The heartbeat window of every hold: far longer than a hold's work, so only a stalled
/// worker misses it (the workers never heartbeat).
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// What a worker saw of one hold. Times are wall-clock seconds since the Unix epoch.
#[derive(Debug, Clone)]
pub struct HoldRecord {
    /// The lock.
    pub lock: &'static str,
    /// The worker (and sidecar) index.
    pub worker: usize,
    /// The fencing token.
    pub token: i64,
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
    /// The address of its sidecar now (a restarted sidecar listens elsewhere).
    pub addr: Mutex<String>,
    /// Set by the fault loop: stall after the next grant.
    pub stall: AtomicBool,
    /// Set by the fault loop: stall just before the next release (its sidecar is then paused,
    /// so the release reaches it only after its lease ended and another worker took over).
    pub stall_release: AtomicBool,
    /// Set while stalling, holding the lock, before the write or the release.
    pub stalling: AtomicBool,
    /// Every hold it had.
    pub holds: Mutex<Vec<HoldRecord>>,
}

impl Slot {
    /// A worker slot for `pod`, taking `lock` through the sidecar at `addr`.
    pub fn new(pod: &str, lock: &'static str, addr: &str) -> Arc<Self> {
        Arc::new(Slot {
            pod: pod.into(),
            lock,
            addr: Mutex::new(addr.into()),
            stall: AtomicBool::new(false),
            stall_release: AtomicBool::new(false),
            stalling: AtomicBool::new(false),
            holds: Mutex::default(),
        })
    }
}

/// What one events stream said about holds being lost.
#[derive(Default)]
struct Notices {
    /// Token → when its `lost` event arrived.
    lost: HashMap<i64, f64>,
    /// When the stream broke (the sidecar died): every hold on it counts as lost.
    broken: Option<f64>,
}

impl Notices {
    fn lost(&self, token: i64) -> Option<f64> {
        [self.lost.get(&token).copied(), self.broken]
            .into_iter()
            .flatten()
            .reduce(f64::min)
    }
}

/// Reads a lock's events stream until it ends, recording `holder`'s lost holds. A stream
/// that ends (its sidecar died, or it lagged) makes every hold on it count as lost.
async fn follow(events: reqwest::Response, holder: String, notices: Arc<Mutex<Notices>>) {
    let mut stream = events.bytes_stream().eventsource();
    while let Some(Ok(event)) = stream.next().await {
        let Ok(ev) = serde_json::from_str::<Value>(&event.data) else {
            continue;
        };
        if event.event == "lost"
            && ev["holderId"] == holder.as_str()
            && let Some(token) = ev["fencingToken"].as_i64()
        {
            notices.lock().unwrap().lost.entry(token).or_insert(now());
        }
    }
    notices.lock().unwrap().broken.get_or_insert(now());
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// After dropping a waiting acquire: its grant may have raced the drop, so once the sidecar
/// is done with it (no longer waiting), release whatever it left held. Release never touches a
/// waiting key: a waiter the sidecar failed to remove still shows in etcd.
async fn abandon(http: &reqwest::Client, addr: &str, slot: &Slot) {
    let _ = wait_until(Duration::from_secs(2), || async {
        let Ok(resp) = http.get(format!("{addr}/v1/locks")).send().await else {
            return true;
        };
        let mine = resp.json::<Value>().await.unwrap_or_default()["locks"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|l| l["lock"] == slot.lock && l["holderId"] == slot.pod && l["state"] == "waiting");
        !mine
    })
    .await;
    let _ = http
        .post(format!("{addr}/v1/locks/{}/release", slot.lock))
        .json(&json!({}))
        .send()
        .await;
}

/// Seconds since the Unix epoch of an RFC 3339 time, as the API writes them.
fn epoch_seconds(rfc3339: &str) -> Option<f64> {
    let t = humantime::parse_rfc3339(rfc3339).ok()?;
    Some(t.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs_f64())
}

/// One worker: its slot, its sidecar's clients, and the fenced store if it writes.
struct Worker {
    i: usize,
    slot: Arc<Slot>,
    store: Option<String>,
    http: reqwest::Client,
    /// Without an overall timeout: an events stream stays open.
    streams: reqwest::Client,
}

/// What the worker knows of its hold being lost, from its events stream.
type Lost<'a> = &'a (dyn Fn() -> Option<f64> + Sync);

impl Worker {
    /// The base URL of the slot's lock on the sidecar at `addr`.
    fn lock_url(&self, addr: &str) -> String {
        format!("{addr}/v1/locks/{}", self.slot.lock)
    }

    /// Starts following the lock's events on the sidecar at `addr`; `None` if it does not answer.
    async fn follow_events(&self, addr: &str) -> Option<(Arc<Mutex<Notices>>, AbortOnDrop)> {
        let events = self.streams.get(format!("{}/events", self.lock_url(addr))).send();
        let events = match timeout(Duration::from_secs(2), events).await {
            Ok(Ok(events)) if events.status().is_success() => events,
            _ => return None,
        };
        let notices = Arc::new(Mutex::new(Notices::default()));
        let follower = tokio::spawn(follow(events, self.slot.pod.clone(), notices.clone()));
        Some((notices, AbortOnDrop(follower)))
    }

    /// Acquires the lock; its token and when the sidecar granted it, or `None` (503, or no
    /// sidecar).
    async fn acquire(&self, addr: &str) -> Option<(i64, f64)> {
        let answer = (self.http.post(format!("{}/acquire", self.lock_url(addr))))
            .json(&json!({"waitSeconds": 5, "heartbeatTimeoutSeconds": HEARTBEAT.as_secs()}))
            .send()
            .await
            .ok()?;
        let grant = answer.json::<Value>().await.unwrap_or_default();
        let acquired = epoch_seconds(grant["acquiredAt"].as_str()?)?;
        Some((grant["fencingToken"].as_i64()?, acquired))
    }

    /// The work under the lock: the counter's increment, made only while the hold is not known
    /// lost (a holder paused on purpose has already decided to write), or for a semaphore's
    /// worker a while of holding (20 to 80 ms, so that holds overlap in every way); then the
    /// pause before release that the fault loop may have asked for.
    async fn work(&self, token: i64, lost: Lost<'_>) -> Option<WriteRecord> {
        let slot = &self.slot;
        let paused = slot.stall.swap(false, Ordering::Relaxed);
        if paused {
            slot.stalling.store(true, Ordering::Relaxed);
            sleep(STALL).await;
            slot.stalling.store(false, Ordering::Relaxed);
        }
        let write = match &self.store {
            Some(store) if paused || lost().is_none() => Some(self.write(store, token, paused).await),
            Some(_) => None,
            None => {
                sleep(Duration::from_millis(20 + token.rem_euclid(5) as u64 * 15)).await;
                None
            }
        };
        sleep(Duration::from_millis(10)).await; // the rest of the work under the lock
        if slot.stall_release.swap(false, Ordering::Relaxed) {
            slot.stalling.store(true, Ordering::Relaxed);
            sleep(Duration::from_millis(300)).await; // the fault loop stops the sidecar meanwhile
            slot.stalling.store(false, Ordering::Relaxed);
        }
        write
    }

    /// Increments the counter at `store` with `token`.
    async fn write(&self, store: &str, token: i64, paused: bool) -> WriteRecord {
        let sent = now();
        let url = format!("{store}/increment?token={token}&writer={}", self.slot.pod);
        let status = match self.http.post(url).send().await {
            Ok(r) => r.status().as_u16(),
            Err(_) => 0,
        };
        WriteRecord { sent, status, paused }
    }

    /// Ends the hold: when it stopped counting as the worker's own, and when the worker learned
    /// it was lost, if it was. Told before releasing, there is nothing to release; else a
    /// refused release (410 or 409: lost meanwhile) or none answered (the sidecar died) is a loss.
    async fn finish(&self, addr: &str, lost: Lost<'_>) -> (f64, Option<f64>) {
        if let Some(at) = lost() {
            return (at, Some(at));
        }
        let sent = now();
        let released = (self.http.post(format!("{}/release", self.lock_url(addr))))
            .json(&json!({}))
            .send()
            .await;
        let refused = !matches!(released, Ok(r) if r.status().is_success());
        (sent, refused.then(|| lost().unwrap_or_else(now)))
    }
}

/// Runs worker `i` until `stop`, hold after hold. With a `store`, each hold increments its
/// fenced counter once; without one, the worker only holds for a while (a semaphore's slot).
/// On `stop` an acquire still waiting is dropped (the client goes away).
pub async fn run(i: usize, slot: Arc<Slot>, store: Option<String>, stop: CancellationToken) {
    let w = Worker {
        i,
        slot,
        store,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        streams: reqwest::Client::new(),
    };
    while !stop.is_cancelled() {
        let addr = w.slot.addr.lock().unwrap().clone();
        // Follow the events before acquiring, so that no lost notice of the hold is missed.
        let Some((notices, _follower)) = w.follow_events(&addr).await else {
            sleep(Duration::from_millis(100)).await;
            continue;
        };
        let grant = tokio::select! {
            grant = w.acquire(&addr) => grant,
            _ = stop.cancelled() => return abandon(&w.http, &addr, &w.slot).await,
        };
        let Some((token, acquired)) = grant else {
            sleep(Duration::from_millis(50)).await; // 503 or no sidecar: try again
            continue;
        };
        let granted = now();
        let lost = || notices.lock().unwrap().lost(token);
        let write = w.work(token, &lost).await;
        let (ended, lost) = w.finish(&addr, &lost).await;
        w.slot.holds.lock().unwrap().push(HoldRecord {
            lock: w.slot.lock,
            worker: w.i,
            token,
            acquired,
            granted,
            ended,
            lost,
            write,
        });
    }
}
