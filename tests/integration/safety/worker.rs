//! The checker's workers: correct clients of the lock. Each one follows its sidecar's events
//! stream, acquires, increments the fenced counter once and releases, and stops treating a
//! hold as its own the moment it learns the hold is lost: a `lost` event, a refused release, or
//! its events stream breaking (its sidecar died).

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
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
    /// The worker (and sidecar) index.
    pub worker: usize,
    /// The fencing token.
    pub token: i64,
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
    /// A worker slot for `pod` on the sidecar at `addr`.
    pub fn new(pod: &str, addr: &str) -> Arc<Self> {
        Arc::new(Slot {
            pod: pod.into(),
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

/// Reads `/v1/locks/counter/events` until it ends, recording `holder`'s lost holds. A stream
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
async fn abandon(http: &reqwest::Client, addr: &str, pod: &str) {
    let _ = wait_until(Duration::from_secs(2), || async {
        let Ok(resp) = http.get(format!("{addr}/v1/locks")).send().await else {
            return true;
        };
        let mine = resp.json::<Value>().await.unwrap_or_default()["locks"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|l| l["holderId"] == pod && l["state"] == "waiting");
        !mine
    })
    .await;
    let _ = http
        .post(format!("{addr}/v1/locks/counter/release"))
        .json(&json!({}))
        .send()
        .await;
}

/// Runs worker `i` until `stop`: hold after hold, each written to the store at `store` once.
/// On `stop` an acquire still waiting is dropped (the client goes away).
pub async fn run(i: usize, slot: Arc<Slot>, store: String, stop: CancellationToken) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let streams = reqwest::Client::new(); // no overall timeout: the events stream stays open
    while !stop.is_cancelled() {
        let addr = slot.addr.lock().unwrap().clone();
        // Follow the events before acquiring, so that no lost notice of the hold is missed.
        let events = streams.get(format!("{addr}/v1/locks/counter/events")).send();
        let events = match timeout(Duration::from_secs(2), events).await {
            Ok(Ok(events)) if events.status().is_success() => events,
            _ => {
                sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let notices = Arc::new(Mutex::new(Notices::default()));
        let _follower = AbortOnDrop(tokio::spawn(follow(events, slot.pod.clone(), notices.clone())));
        let acquire = http
            .post(format!("{addr}/v1/locks/counter/acquire"))
            .json(&json!({"waitSeconds": 5, "heartbeatTimeoutSeconds": HEARTBEAT.as_secs()}))
            .send();
        let answer = tokio::select! {
            answer = acquire => answer,
            _ = stop.cancelled() => return abandon(&http, &addr, &slot.pod).await,
        };
        let grant = match answer {
            Ok(r) => r.json::<Value>().await.unwrap_or_default(),
            Err(_) => Value::Null,
        };
        let Some(token) = grant["fencingToken"].as_i64() else {
            sleep(Duration::from_millis(50)).await; // 503 or no sidecar: try again
            continue;
        };
        let granted = now();
        let lost = || notices.lock().unwrap().lost(token);

        let paused = slot.stall.swap(false, Ordering::Relaxed);
        if paused {
            slot.stalling.store(true, Ordering::Relaxed);
            sleep(STALL).await;
            slot.stalling.store(false, Ordering::Relaxed);
        }
        // A correct client writes only while it holds; the paused one has already decided to.
        let write = if paused || lost().is_none() {
            let sent = now();
            let url = format!("{store}/increment?token={token}&writer={}", slot.pod);
            let status = match http.post(url).send().await {
                Ok(r) => r.status().as_u16(),
                Err(_) => 0,
            };
            Some(WriteRecord { sent, status, paused })
        } else {
            None
        };
        sleep(Duration::from_millis(10)).await; // the rest of the work under the lock
        if slot.stall_release.swap(false, Ordering::Relaxed) {
            slot.stalling.store(true, Ordering::Relaxed);
            sleep(Duration::from_millis(300)).await; // the fault loop stops the sidecar meanwhile
            slot.stalling.store(false, Ordering::Relaxed);
        }

        let (ended, lost) = match lost() {
            Some(at) => (at, Some(at)), // told before releasing: nothing to release
            None => {
                let sent = now();
                let released = http
                    .post(format!("{addr}/v1/locks/counter/release"))
                    .json(&json!({}))
                    .send()
                    .await;
                let refused = !matches!(released, Ok(r) if r.status().is_success());
                // 410 (or 409): the hold was lost meanwhile; no answer: the sidecar died.
                (sent, refused.then(|| lost().unwrap_or_else(now)))
            }
        };
        slot.holds.lock().unwrap().push(HoldRecord {
            worker: i,
            token,
            granted,
            ended,
            lost,
            write,
        });
    }
}
