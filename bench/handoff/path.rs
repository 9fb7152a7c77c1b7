//! A handoff's critical path, segment by segment: from the releaser's HTTP request leaving the
//! client to the next holder's HTTP answer reaching its client. The contenders loop acquire →
//! release as in the contended runs, with their sidecars' marks on (`podlock::critical_path`,
//! one clock for every process) and the benchmark's own readings around each HTTP call; each
//! grant a release handed on directly is lined up from them. The floor's handoffs, from a
//! contender's watch event to the next one's, come from its ring (`floor::ring`).

use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use podlock::critical_path::monotonic_ns;

use crate::common::{EtcdServer, Sidecar, declare};
use crate::floor::{self, Floor};

/// What the results file says of the critical path's table.
pub const ABOUT: &str = "A handoff's critical path (bench/README.md): each segment's median and p99 over the \
grants a release handed on directly, the sidecars' marks on; the floors' handoffs beside the segments they replace.";

/// The sidecars' log filter: the marks on, the rest as usual.
const MARKS: &str = "info,podlock::path=trace";

/// One contender's readings of one turn: the grant's token (a create revision), when its
/// answer arrived, and when the release's request left.
struct Turn {
    token: i64,
    granted: i64,
    release_sent: i64,
}

/// A mark of a sidecar's log (see `podlock::critical_path::Point`).
#[derive(Debug)]
struct Mark {
    point: String,
    token: i64,
    revision: i64,
    at: i64,
}

/// The segments of a handoff, in order, with the points that bound them.
const SEGMENTS: [&str; 6] = [
    "client sends the release → releaser's sidecar handles it",
    "releaser's sidecar: handler → etcd transaction sent",
    "etcd: transaction sent → watch event at the waiter's sidecar",
    "waiter's sidecar: watch event → grant answered",
    "grant answered → the waiter's client has it",
    "whole handoff: release sent → grant received",
];

/// What one run measured: each segment's samples (ns), the grants seen and those handed on.
pub struct Path {
    segments: Vec<Vec<i64>>,
    /// etcd's answer to the releaser, for reference (not on the path).
    answered: Vec<i64>,
    grants: usize,
    handed: usize,
    handoffs_per_s: f64,
    floors: [Vec<i64>; 2],
}

/// Measures `n` contenders for `window` on `etcd`, and the floors' rings beside them.
pub async fn measure(etcd: &EtcdServer, n: usize, window: Duration) -> Path {
    let lock = format!("path-{n}");
    declare(&etcd.endpoint, &[&lock]);
    let mut sidecars = vec![];
    for i in 0..n {
        let pod = format!("bench-path-{n}-{i}");
        let extra = ["--log-format", "json"];
        sidecars.push(Arc::new(
            Sidecar::start_logging(&etcd.endpoint, &pod, &extra, MARKS).await,
        ));
    }
    let start = Instant::now();
    let loops = sidecars
        .iter()
        .map(|s| contend(s.clone(), lock.clone(), start, window));
    let turns: Vec<Vec<Turn>> = futures::future::join_all(loops).await;
    let grants = turns.iter().map(Vec::len).sum::<usize>();
    let marks: Vec<Vec<Mark>> = sidecars.iter().map(|s| marks(&s.log())).collect();
    let mut path = line_up(&turns, &marks);
    path.grants = grants;
    path.handoffs_per_s = grants as f64 / start.elapsed().as_secs_f64();
    for (i, f) in [Floor::OneWrite, Floor::TwoWrites].into_iter().enumerate() {
        path.floors[i] = floor::ring(&etcd.endpoint, etcd.pid(), n, window, f).await.hops;
    }
    path
}

/// One contender's loop for `window`: acquire, note the answer's arrival, note the release's
/// departure, release.
async fn contend(sidecar: Arc<Sidecar>, lock: String, start: Instant, window: Duration) -> Vec<Turn> {
    let http = reqwest::Client::new();
    let url = |verb: &str| format!("{}/v1/locks/{lock}/{verb}", sidecar.addr);
    let mut turns = vec![];
    while start.elapsed() < window {
        let resp = http
            .post(url("acquire"))
            .json(&json!({"waitSeconds": 60}))
            .send()
            .await;
        let grant: Value = resp.expect("sidecar answers").json().await.expect("a grant");
        let granted = monotonic_ns();
        let token = grant["fencingToken"].as_i64().expect("a fencing token") & ((1 << 40) - 1);
        let release_sent = monotonic_ns();
        let resp = http.post(url("release")).json(&json!({})).send().await;
        assert!(resp.expect("sidecar answers").status().is_success(), "release");
        turns.push(Turn {
            token,
            granted,
            release_sent,
        });
    }
    turns
}

/// The marks in a sidecar's JSON log.
fn marks(log: &str) -> Vec<Mark> {
    let fields = log
        .lines()
        .filter(|l| l.contains("\"podlock::path\""))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| v["fields"].clone());
    let num = |f: &Value, k: &str| f[k].as_i64().unwrap_or(0);
    fields
        .map(|f| Mark {
            point: f["point"].as_str().unwrap_or_default().to_string(),
            token: num(&f, "token"),
            revision: num(&f, "revision"),
            at: num(&f, "at"),
        })
        .collect()
}

/// The releases that handed the lock on, by the revision of their transaction: when the
/// releaser's client sent it, its sidecar began to handle it, sent it to etcd, had etcd's answer.
fn handed_by_revision(turns: &[Vec<Turn>], marks: &[Vec<Mark>]) -> HashMap<i64, [i64; 4]> {
    let sent: HashMap<i64, i64> = turns
        .iter()
        .flatten()
        .map(|t| (t.token, t.release_sent))
        .collect();
    let mut out = HashMap::new();
    for m in marks {
        let (mut request, mut to_etcd) = (0, 0);
        for mark in m {
            match mark.point.as_str() {
                "release.request" => request = mark.at,
                "release.sent" => to_etcd = mark.at,
                "release.handed" if sent.contains_key(&mark.token) => {
                    let client = sent[&mark.token];
                    out.insert(mark.revision, [client, request, to_etcd, mark.at]);
                }
                _ => {}
            }
        }
    }
    out
}

/// Lines up every grant a release handed on: its segments (see [`SEGMENTS`]).
fn line_up(turns: &[Vec<Turn>], marks: &[Vec<Mark>]) -> Path {
    let releases = handed_by_revision(turns, marks);
    let received: HashMap<i64, i64> = turns.iter().flatten().map(|t| (t.token, t.granted)).collect();
    let mut segments = vec![vec![]; SEGMENTS.len()];
    let (mut answered, mut handed) = (vec![], 0);
    for m in marks {
        // Each waiter's first watch event at a handing release's revision, then its grant.
        let mut events: HashMap<i64, (i64, i64)> = HashMap::new();
        for mark in m {
            match mark.point.as_str() {
                "wait.event" if releases.contains_key(&mark.revision) => {
                    events.entry(mark.token).or_insert((mark.revision, mark.at));
                }
                "grant.answered" => {
                    let event = events.remove(&mark.token);
                    if let (Some((rev, at)), Some(got)) = (event, received.get(&mark.token)) {
                        let [client, request, to_etcd, etcd_answer] = releases[&rev];
                        let points = [client, request, to_etcd, at, mark.at, *got];
                        for (i, w) in points.windows(2).enumerate() {
                            segments[i].push(w[1] - w[0]);
                        }
                        segments[5].push(got - client);
                        answered.push(etcd_answer - to_etcd);
                        handed += 1;
                    }
                }
                _ => {}
            }
        }
    }
    Path {
        segments,
        answered,
        grants: 0,
        handed,
        handoffs_per_s: 0.0,
        floors: [vec![], vec![]],
    }
}

/// The `q` quantile of `v`, in microseconds.
fn us(v: &[i64], q: f64) -> String {
    if v.is_empty() {
        return "—".into();
    }
    let mut v = v.to_vec();
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    format!("{:.0} µs", v[i] as f64 / 1000.0)
}

impl Path {
    /// The markdown table: each segment's median and p99, the floors' handoffs beside the
    /// segments they replace.
    pub fn table(&self, n: usize) -> String {
        let mut out = format!(
            "{n} contenders, marks on: {:.0} grants/s; {} of {} grants handed on by a release, lined up\n\n",
            self.handoffs_per_s, self.handed, self.grants
        );
        out += "| segment | podlock p50 | podlock p99 | floor, 1 write p50 / p99 | floor, 2 writes p50 / p99 |\n";
        out += "|---|---|---|---|---|\n";
        let floor = |i: usize| format!("{} / {}", us(&self.floors[i], 0.5), us(&self.floors[i], 0.99));
        for (i, name) in SEGMENTS.iter().enumerate() {
            let (f1, f2) = match i {
                2 | 5 => (floor(0), floor(1)),
                _ => ("—".into(), "—".into()),
            };
            let s = &self.segments[i];
            out += &format!("| {name} | {} | {} | {f1} | {f2} |\n", us(s, 0.5), us(s, 0.99));
        }
        let a = &self.answered;
        out += &format!(
            "| (etcd: transaction sent → answer at the releaser) | {} | {} | — | — |\n",
            us(a, 0.5),
            us(a, 0.99)
        );
        out
    }
}
