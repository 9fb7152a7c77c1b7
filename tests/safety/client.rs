//! A worker's client of its sidecar's lock API, recording every call it makes in the
//! [`History`], and following the lock's events stream for `lost` notices.

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::time::timeout;

use super::history::{History, Notice, Op, OpKind, Outcome};
use super::now;

/// A grant, as its client saw it.
#[derive(Debug, Clone, Copy)]
pub struct Grant {
    /// The fencing token.
    pub token: i64,
    /// When its sidecar made it (its `acquiredAt`), in seconds since the Unix epoch.
    pub acquired: f64,
    /// When it was asked for.
    pub call: f64,
    /// Its mode.
    pub mode: &'static str,
}

/// The mode a grant states (a sidecar that states none grants what was asked).
pub fn granted_mode(grant: &Value, asked: &'static str) -> &'static str {
    match grant["mode"].as_str() {
        Some("shared") => "shared",
        Some(_) => "exclusive",
        None => asked,
    }
}

/// One holder identity's calls on one lock, through one worker.
#[derive(Clone)]
pub struct LockClient {
    /// Requests with an overall timeout.
    pub http: reqwest::Client,
    /// Requests without one: an events stream stays open.
    pub streams: reqwest::Client,
    /// Where the calls are recorded.
    pub history: Arc<History>,
    /// The lock.
    pub lock: &'static str,
    /// Its sidecar's pod.
    pub pod: String,
    /// The holder id sent (`None`: the sidecar's default, the pod's name).
    pub holder: Option<String>,
    /// The worker's index: its row in the history.
    pub row: usize,
    /// The sidecar it talks to (the fault loop's victim index).
    pub sidecar: usize,
    /// The mode it asks for.
    pub mode: &'static str,
    /// The further locks it takes as one with `lock` (a multi-lock acquire); every operation
    /// is recorded on each lock of the set.
    pub with: &'static [&'static str],
    /// The maximum hold time it asks for, in seconds (`None`: the lock's, none here): a hold
    /// that outlives it (a stalled worker's) ends at its deadline, `lost` with reason
    /// `deadline`, and the next worker is granted.
    pub max_hold: Option<u32>,
    /// How many of the lock's slots each hold takes (`permits`; `None`: one, not asked).
    pub permits: Option<u32>,
}

impl LockClient {
    /// The holder id the sidecar knows it by.
    pub fn holder_id(&self) -> &str {
        self.holder.as_deref().unwrap_or(&self.pod)
    }

    /// The same client under holder id `holder` (as a hold's grant named it).
    pub fn with_holder(&self, holder: &str) -> LockClient {
        LockClient {
            holder: Some(holder.into()),
            ..self.clone()
        }
    }

    /// The holder identity the history knows it by: the pod, and the holder id.
    pub fn client(&self) -> String {
        format!("{}/{}", self.pod, self.holder_id())
    }

    /// The locks it takes: `lock`, and those it takes with it.
    pub fn locks(&self) -> impl Iterator<Item = &'static str> + use<> {
        std::iter::once(self.lock).chain(self.with.iter().copied())
    }

    /// Records one of its operations, on every lock it takes.
    pub fn record(&self, kind: OpKind, api: &'static str, call: f64, outcome: Outcome, token: i64) {
        self.push_each(self.op(kind, api, call, outcome, token));
    }

    /// Records `op` on every lock it takes.
    fn push_each(&self, op: Op) {
        for lock in self.locks() {
            self.history.push(Op { lock, ..op.clone() });
        }
    }

    /// One of its operations, answered now unless its outcome is unknown.
    fn op(&self, kind: OpKind, api: &'static str, call: f64, outcome: Outcome, token: i64) -> Op {
        Op {
            lock: self.lock,
            client: self.client(),
            row: self.row,
            kind,
            api,
            mode: (kind == OpKind::Acquire).then_some(self.mode),
            granted: None,
            permits: self.permits.filter(|_| kind == OpKind::Acquire),
            outcome,
            token,
            limit: 0,
            call,
            ret: (outcome != Outcome::Unknown).then(now),
        }
    }

    /// Records a grant of `token` in `mode`, asked for through `api` at `call`.
    pub fn record_grant(&self, api: &'static str, call: f64, token: i64, mode: &'static str) {
        let op = self.op(OpKind::Acquire, api, call, Outcome::Ok, token);
        self.push_each(Op {
            granted: Some(mode),
            ..op
        });
    }

    /// Records that it was told at `told` that the hold of `grant` ended (`promised`: by an
    /// events stream of its sidecar, which promises that within 1 s).
    pub fn told(&self, grant: &Grant, confirmed: f64, told: f64, promised: bool) {
        for lock in self.locks() {
            self.history.told(Notice {
                lock,
                client: self.client(),
                row: self.row,
                token: grant.token,
                confirmed: confirmed.max(grant.call),
                told,
                promised_by: promised.then_some(self.sidecar),
            });
        }
    }

    /// The base URL of its lock on the sidecar at `addr`.
    pub fn url(&self, addr: &str, call: &str) -> String {
        format!("{addr}/v1/locks/{}/{call}", self.lock)
    }

    /// The options of every call: the holder id, if it names one.
    fn body(&self, mut options: Value) -> Value {
        if let Some(h) = &self.holder {
            options["holderId"] = json!(h);
        }
        options
    }

    /// The options of an acquire (`/acquire` or `/hold`), waiting up to 5 s: its mode, and
    /// its maximum hold time and permits if it asks for them.
    pub fn acquire_options(&self) -> Value {
        let mut options = json!({"waitSeconds": 5});
        if self.mode == "shared" {
            options["mode"] = json!("shared");
        }
        if let Some(seconds) = self.max_hold {
            options["maxHoldSeconds"] = json!(seconds);
        }
        if let Some(n) = self.permits {
            options["permits"] = json!(n);
        }
        options
    }

    /// Acquires the lock (waiting up to 5 s), asked at `call`: the grant, or `None`.
    pub async fn acquire(&self, addr: &str, call: f64, heartbeat: Duration) -> Option<Grant> {
        let mut options = self.acquire_options();
        options["heartbeatTimeoutSeconds"] = json!(heartbeat.as_secs());
        if !self.with.is_empty() {
            options["with"] = json!(self.with);
        }
        let answer = self
            .http
            .post(self.url(addr, "acquire"))
            .json(&self.body(options))
            .send();
        let (status, grant) = match answer.await {
            Ok(r) => (Some(r.status().as_u16()), r.json::<Value>().await.ok()),
            Err(_) => (None, None),
        };
        let grant = grant.filter(|_| status == Some(200)).and_then(|g| {
            let acquired = epoch_seconds(g["acquiredAt"].as_str()?)?;
            let mode = granted_mode(&g, self.mode);
            self.check_set(&g);
            Some(Grant {
                token: g["fencingToken"].as_i64()?,
                acquired,
                call,
                mode,
            })
        });
        match (Outcome::of_status(status), &grant) {
            (_, Some(g)) => self.record_grant("acquire", call, g.token, g.mode),
            (Outcome::Ok, None) => self.record(OpKind::Acquire, "acquire", call, Outcome::Unknown, 0),
            (outcome, None) => self.record(OpKind::Acquire, "acquire", call, outcome, 0),
        }
        grant
    }

    /// Checks that a grant of a set names every lock of it, each with the grant's token: the
    /// run never moves a lock's token epoch, so one revision is one token on every lock (the
    /// history records it on each).
    fn check_set(&self, grant: &Value) {
        let named: Vec<(&str, i64)> = (grant["locks"].as_array().into_iter().flatten())
            .filter_map(|l| Some((l["lock"].as_str()?, l["fencingToken"].as_i64()?)))
            .collect();
        let token = grant["fencingToken"].as_i64().unwrap_or_default();
        let want: Vec<(&str, i64)> = self.locks().map(|l| (l, token)).collect();
        let want = if self.with.is_empty() { vec![] } else { want };
        assert_eq!(
            named, want,
            "a grant of {:?} names its locks otherwise: {grant}",
            want
        );
    }

    /// Releases (or heartbeats, for `call` "heartbeat") the hold; the answer's status, if one came.
    pub async fn end_or_beat(&self, addr: &str, call: &'static str) -> Option<u16> {
        let at = now();
        let answer = self
            .http
            .post(self.url(addr, call))
            .json(&self.body(json!({})))
            .send();
        let status = answer.await.ok().map(|r| r.status().as_u16());
        let outcome = Outcome::of_status(status);
        let kind = if call == "release" {
            OpKind::Release
        } else {
            OpKind::Heartbeat
        };
        self.record(kind, call, at, outcome, 0);
        status
    }

    /// Starts following the lock's events on the sidecar at `addr`: its pod's holds, lost and
    /// released; `None` if it does not answer.
    pub async fn follow_events(&self, addr: &str) -> Option<(Arc<Mutex<Notices>>, AbortOnDrop)> {
        let events = self
            .streams
            .get(format!("{addr}/v1/locks/{}/events", self.lock))
            .send();
        let events = match timeout(Duration::from_secs(2), events).await {
            Ok(Ok(events)) if events.status().is_success() => events,
            _ => return None,
        };
        let notices = Arc::new(Mutex::new(Notices::default()));
        let follower = tokio::spawn(follow(events, notices.clone()));
        Some((notices, AbortOnDrop(follower)))
    }
}

/// Seconds since the Unix epoch of an RFC 3339 time, as the API writes them.
fn epoch_seconds(rfc3339: &str) -> Option<f64> {
    let t = humantime::parse_rfc3339(rfc3339).ok()?;
    Some(t.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs_f64())
}

/// What one events stream said about the pod's holds ending. Tokens are unique in a lock, so
/// they name the holds, whatever their holder ids.
#[derive(Default)]
pub struct Notices {
    /// Token → when its `lost` event arrived.
    lost: HashMap<i64, f64>,
    /// Token → when its `released` event arrived.
    released: HashMap<i64, f64>,
    /// Token → when its `yield` event arrived.
    asked: HashMap<i64, f64>,
    /// When the stream broke (the sidecar died): every hold on it counts as lost.
    broken: Option<f64>,
}

impl Notices {
    /// When the hold with `token` was first said lost, if it was.
    pub fn lost(&self, token: i64) -> Option<f64> {
        [self.lost.get(&token).copied(), self.broken]
            .into_iter()
            .flatten()
            .reduce(f64::min)
    }

    /// When the hold with `token` was asked to yield, if it was.
    pub fn asked(&self, token: i64) -> Option<f64> {
        self.asked.get(&token).copied()
    }

    /// When the hold with `token` was said released, if it was.
    pub fn released(&self, token: i64) -> Option<f64> {
        self.released.get(&token).copied()
    }
}

/// What the events streams said of one kind of ending told ahead over the run: its warnings,
/// and its `lost` notices (one per lock of a set).
#[derive(Default)]
pub struct Endings {
    pub warned: AtomicUsize,
    pub ended: AtomicUsize,
}

impl Endings {
    const fn new() -> Self {
        Endings {
            warned: AtomicUsize::new(0),
            ended: AtomicUsize::new(0),
        }
    }

    /// Its (warnings, ends) so far.
    pub fn counts(&self) -> (usize, usize) {
        (
            self.warned.load(Ordering::Relaxed),
            self.ended.load(Ordering::Relaxed),
        )
    }
}

/// Maximum hold times: `deadline` warnings, and `lost` with reason `deadline`.
pub static DEADLINES: Endings = Endings::new();

/// Requests to yield: `yield` events, and `lost` with reason `yield`.
pub static YIELDS: Endings = Endings::new();

/// Reads a lock's events stream until it ends, recording the holds lost and released. A
/// stream that ends (its sidecar died, or it lagged) makes every hold on it count as lost.
async fn follow(events: reqwest::Response, notices: Arc<Mutex<Notices>>) {
    let mut stream = events.bytes_stream().eventsource();
    while let Some(Ok(event)) = stream.next().await {
        let data = serde_json::from_str::<Value>(&event.data).unwrap_or_default();
        let token = data["fencingToken"].as_i64();
        let count = match (event.event.as_str(), data["reason"].as_str()) {
            ("deadline", _) => Some(&DEADLINES.warned),
            ("lost", Some("deadline")) => Some(&DEADLINES.ended),
            ("yield", _) => Some(&YIELDS.warned),
            ("lost", Some("yield")) => Some(&YIELDS.ended),
            _ => None,
        };
        count.map(|c| c.fetch_add(1, Ordering::Relaxed));
        let mut n = notices.lock().unwrap();
        let seen = match event.event.as_str() {
            "lost" => &mut n.lost,
            "released" => &mut n.released,
            "yield" => &mut n.asked,
            _ => continue,
        };
        if let Some(token) = token {
            seen.entry(token).or_insert(now());
        }
    }
    notices.lock().unwrap().broken.get_or_insert(now());
}

/// Aborts a task when dropped.
pub struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
