//! Measurements that apply to any lock: podlock through its sidecar here, the peers in their
//! own processes (`bench/peers`, same definitions in `harness`).

use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::{EtcdServer, Sidecar, percentile};

/// A podlock sidecar (one per contender, like one pod each), spoken to over HTTP with a
/// keep-alive client.
pub struct Podlock {
    pub sidecar: Sidecar,
    http: reqwest::Client,
    lock: String,
}

impl Podlock {
    /// `n` sidecars contending for `lock`.
    pub async fn contenders(etcd: &EtcdServer, lock: &str, n: usize) -> Vec<Arc<Podlock>> {
        let mut out = vec![];
        for i in 0..n {
            let sidecar = Sidecar::start(&etcd.endpoint, &format!("bench-{lock}-{i}"), &[]).await;
            out.push(Arc::new(Podlock {
                sidecar,
                http: reqwest::Client::new(),
                lock: lock.into(),
            }));
        }
        out
    }

    async fn call(&self, verb: &str, body: serde_json::Value) {
        let url = format!("{}/v1/locks/{}/{verb}", self.sidecar.addr, self.lock);
        let resp = self
            .http
            .post(url)
            .json(&body)
            .send()
            .await
            .expect("sidecar answers");
        assert!(
            resp.status().is_success(),
            "{verb}: {}",
            resp.text().await.unwrap_or_default()
        );
    }

    /// Blocks until granted (FIFO).
    pub async fn acquire(&self) {
        self.call("acquire", json!({"waitSeconds": 60})).await
    }

    /// Releases the hold.
    pub async fn release(&self) {
        self.call("release", json!({})).await
    }
}

/// Uncontended acquire+release cycles: (p50, p99, cycles per second).
pub async fn uncontended(c: &Podlock, cycles: usize) -> (Duration, Duration, f64) {
    for _ in 0..cycles / 10 {
        c.acquire().await;
        c.release().await;
    }
    let mut samples = Vec::with_capacity(cycles);
    let start = Instant::now();
    for _ in 0..cycles {
        let t = Instant::now();
        c.acquire().await;
        c.release().await;
        samples.push(t.elapsed());
    }
    let rate = cycles as f64 / start.elapsed().as_secs_f64();
    (
        percentile(&mut samples, 0.5),
        percentile(&mut samples, 0.99),
        rate,
    )
}

/// Every contender takes one turn, so that the sessions (each sidecar's lease) and connections
/// are made before a run is measured, as the peers make theirs before their clocks start.
pub async fn warm_up(contenders: &[Arc<Podlock>]) {
    let turns = contenders.iter().map(|c| async move {
        c.acquire().await;
        c.release().await;
    });
    futures::future::join_all(turns).await;
}

/// What a contended run measured.
pub struct Contended {
    /// Grants to a contender other than the previous holder, per second.
    pub handoffs_per_s: f64,
    pub p99_wait: Duration,
    pub min_max_grants: (usize, usize),
    pub grants: usize,
    /// The run's length in seconds.
    pub window_s: f64,
    /// Every wait, request to grant, sorted.
    pub waits: Vec<Duration>,
    /// When each grant was answered, from the run's start, in order.
    pub grants_at: Vec<Duration>,
}

impl Contended {
    /// The run's rate: grants per second with one contender, else handoffs per second.
    pub fn rate(&self, contenders: usize) -> f64 {
        match contenders {
            1 => self.grants as f64 / self.window_s,
            _ => self.handoffs_per_s,
        }
    }
}

/// Every contender loops acquire → release for `window`, counting grants, handoffs and waits.
pub async fn contended(contenders: &[Arc<Podlock>], window: Duration) -> Contended {
    let start = Instant::now();
    let last = Arc::new(AtomicUsize::new(usize::MAX));
    let handoffs = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = contenders
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (c, last, handoffs) = (c.clone(), last.clone(), handoffs.clone());
            tokio::spawn(async move {
                let (mut waits, mut at) = (vec![], vec![]);
                while start.elapsed() < window {
                    let t = Instant::now();
                    c.acquire().await;
                    waits.push(t.elapsed());
                    at.push(start.elapsed());
                    if last.swap(i, Ordering::SeqCst) != i {
                        handoffs.fetch_add(1, Ordering::SeqCst);
                    }
                    c.release().await;
                }
                (waits, at)
            })
        })
        .collect();
    let (mut per, mut grants_at): (Vec<Vec<Duration>>, Vec<Duration>) = (vec![], vec![]);
    for t in tasks {
        let (waits, at) = t.await.unwrap();
        per.push(waits);
        grants_at.extend(at);
    }
    grants_at.sort();
    let elapsed = start.elapsed().as_secs_f64();
    let mut all: Vec<Duration> = per.iter().flatten().copied().collect();
    Contended {
        handoffs_per_s: handoffs.load(Ordering::SeqCst) as f64 / elapsed,
        p99_wait: percentile(&mut all, 0.99),
        min_max_grants: (
            per.iter().map(Vec::len).min().unwrap(),
            per.iter().map(Vec::len).max().unwrap(),
        ),
        grants: all.len(),
        window_s: elapsed,
        waits: all,
        grants_at,
    }
}

/// Runs `cmd` (a lock CLI around `true`) in `loops` parallel loops for `window`; returns
/// completed cycles per second.
pub async fn cli_rate(cmd: &[String], loops: usize, window: Duration) -> f64 {
    let start = Instant::now();
    let tasks: Vec<_> = (0..loops)
        .map(|_| {
            let cmd = cmd.to_vec();
            tokio::spawn(async move {
                let mut cycles = 0u32;
                while start.elapsed() < window {
                    let status = tokio::process::Command::new(&cmd[0])
                        .args(&cmd[1..])
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .status()
                        .await
                        .unwrap();
                    assert!(status.success(), "{cmd:?} failed");
                    cycles += 1;
                }
                cycles
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    f64::from(total) / start.elapsed().as_secs_f64()
}

/// The etcd work podlock's sidecars counted: unary requests, watches created, watch events.
pub struct EtcdWork([f64; 3]);

impl EtcdWork {
    const METRICS: [&str; 3] = [
        "podlock_etcd_requests_total",
        "podlock_etcd_watches_total",
        "podlock_watch_events_total",
    ];

    /// The sums over `contenders`' sidecars.
    pub async fn of(contenders: &[Arc<Podlock>]) -> Self {
        let mut sums = [0.0; 3];
        for (sum, metric) in sums.iter_mut().zip(Self::METRICS) {
            for c in contenders {
                *sum += c.sidecar.metric(metric).await;
            }
        }
        EtcdWork(sums)
    }

    /// This count less `before`: the work done between the two.
    pub fn minus(&self, before: &EtcdWork) -> EtcdWork {
        EtcdWork(std::array::from_fn(|i| self.0[i] - before.0[i]))
    }

    /// Each per grant.
    pub fn per_grant(&self, grants: f64) -> [f64; 3] {
        self.0.map(|v| v / grants.max(1.0))
    }
}
