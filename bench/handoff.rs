//! Benchmark: podlock through its sidecar (HTTP on loopback) on one local etcd.
//!
//! `cargo bench --bench handoff` (add `-- --quick` for a short run) prints one markdown table:
//! uncontended acquire+release latency, handoffs per second and p99 wait at 1, 8 and 64
//! contenders (one sidecar process per contender, like one pod each), fairness, etcd requests
//! and watch events per handoff, sidecar CPU per 1,000 handoffs and sidecar RSS; beside it, etcd's
//! own Go `concurrency.Mutex` (bench/peers/etcd-mutex) on the same etcd in the same run.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{EtcdServer, Sidecar, declare, percentile};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One process contending for a lock.
trait Contender: Send + Sync {
    /// Blocks until granted (FIFO), then returns.
    fn acquire(&self) -> impl Future<Output = ()> + Send;
    /// Releases the hold.
    fn release(&self) -> impl Future<Output = ()> + Send;
}

/// A podlock sidecar, spoken to over HTTP with a keep-alive client.
struct Podlock {
    sidecar: Sidecar,
    http: reqwest::Client,
    lock: String,
}

impl Podlock {
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
}

impl Contender for Podlock {
    async fn acquire(&self) {
        self.call("acquire", json!({"waitSeconds": 60})).await
    }
    async fn release(&self) {
        self.call("release", json!({})).await
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Uncontended acquire+release cycles: (p50, p99, cycles per second).
async fn uncontended(c: &impl Contender, cycles: usize) -> (Duration, Duration, f64) {
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

/// What a contended run measured.
struct Contended {
    handoffs_per_s: f64,
    p99_wait: Duration,
    min_max_grants: (usize, usize),
    grants: usize,
}

/// Every contender loops acquire → release for `window`; counts grants and waits.
async fn contended<C: Contender + 'static>(contenders: &[Arc<C>], window: Duration) -> Contended {
    let start = Instant::now();
    let tasks: Vec<_> = contenders
        .iter()
        .map(|c| {
            let c = c.clone();
            tokio::spawn(async move {
                let mut waits = vec![];
                while start.elapsed() < window {
                    let t = Instant::now();
                    c.acquire().await;
                    waits.push(t.elapsed());
                    c.release().await;
                }
                waits
            })
        })
        .collect();
    let mut per: Vec<Vec<Duration>> = vec![];
    for t in tasks {
        per.push(t.await.unwrap());
    }
    let elapsed = start.elapsed();
    let grants: usize = per.iter().map(Vec::len).sum();
    let mut all: Vec<Duration> = per.iter().flatten().copied().collect();
    Contended {
        handoffs_per_s: grants as f64 / elapsed.as_secs_f64(),
        p99_wait: percentile(&mut all, 0.99),
        min_max_grants: (
            per.iter().map(Vec::len).min().unwrap(),
            per.iter().map(Vec::len).max().unwrap(),
        ),
        grants,
    }
}

/// Sum of a metric over sidecars.
async fn total(contenders: &[Arc<Podlock>], metric: &str) -> f64 {
    let mut sum = 0.0;
    for c in contenders {
        sum += c.sidecar.metric(metric).await;
    }
    sum
}

/// (RSS in MiB, CPU seconds) of a process, from /proc.
fn usage(pid: i32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: f64 = fields
        .get(11..13)
        .map_or(0.0, |f| f.iter().filter_map(|t| t.parse::<f64>().ok()).sum());
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (rss_kb / 1024.0, ticks / hz)
}

async fn podlock_contenders(etcd: &EtcdServer, lock: &str, n: usize) -> Vec<Arc<Podlock>> {
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

/// etcd's Go Mutex, built from bench/peers/etcd-mutex; runs one measurement, returns its JSON.
fn go_mutex(etcd: &str, lock: &str, args: &[&str]) -> serde_json::Value {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/peers/etcd-mutex");
    let bin = std::env::temp_dir().join("podlock-bench-etcd-mutex"); // Go's build cache keeps rebuilds fast
    let bin = bin.to_str().unwrap();
    let built = std::process::Command::new("go")
        .args(["build", "-o", bin, "."])
        .current_dir(dir)
        .status();
    assert!(built.is_ok_and(|s| s.success()), "go build of {dir} failed");
    let out = std::process::Command::new(bin)
        .args(["-endpoint", etcd, "-lock", lock])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "etcd-mutex {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Runs `cmd` (a lock CLI around `true`) in `loops` parallel loops for `window`; returns
/// completed cycles per second.
async fn cli_rate(cmd: &[String], loops: usize, window: Duration) -> f64 {
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

/// A ratio cell: podlock's value over the peer's, "higher/lower is better" left to the row.
fn ratio(podlock: f64, peer: f64) -> String {
    format!("{:.2}x", podlock / peer)
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (cycles, window) = if quick {
        (300, Duration::from_secs(2))
    } else {
        (2000, Duration::from_secs(5))
    };
    let etcd = EtcdServer::start().await;
    let etcd_version = std::process::Command::new(common::bin_dir().join("etcd"))
        .arg("--version")
        .output()
        .unwrap();
    let etcd_version = String::from_utf8_lossy(&etcd_version.stdout)
        .lines()
        .next()
        .unwrap_or("?")
        .to_string();
    // (measurement, podlock, etcd Go Mutex, podlock / Go Mutex)
    let mut rows: Vec<[String; 4]> = vec![];
    let dash = || "—".to_string();

    declare(&etcd.endpoint, &["solo"]);
    let solo = podlock_contenders(&etcd, "solo", 1).await;
    let (p50, p99, rate) = uncontended(solo[0].as_ref(), cycles).await;
    let go = go_mutex(&etcd.endpoint, "solo", &["uncontended", &cycles.to_string()]);
    let go_p50 = go["p50_ms"].as_f64().unwrap();
    let go_rate = go["cycles_per_s"].as_f64().unwrap();
    rows.push([
        "uncontended acquire+release p50 / p99".into(),
        format!("{} / {}", ms(p50), ms(p99)),
        format!("{go_p50:.2} ms / {:.2} ms", go["p99_ms"].as_f64().unwrap()),
        format!("{} (p50)", ratio(p50.as_secs_f64() * 1000.0, go_p50)),
    ]);
    rows.push([
        "uncontended cycles/s".into(),
        format!("{rate:.0}"),
        format!("{go_rate:.0}"),
        ratio(rate, go_rate),
    ]);

    let mut rss: f64 = usage(solo[0].sidecar.pid()).0;
    for n in [1usize, 8, 64] {
        let lock = format!("c{n}");
        declare(&etcd.endpoint, &[&lock]);
        let cs = podlock_contenders(&etcd, &lock, n).await;
        let before = (
            total(&cs, "podlock_etcd_requests_total").await,
            total(&cs, "podlock_watch_events_total").await,
        );
        let cpu_before: f64 = cs.iter().map(|c| usage(c.sidecar.pid()).1).sum();
        let r = contended(&cs, window).await;
        let cpu: f64 = cs.iter().map(|c| usage(c.sidecar.pid()).1).sum::<f64>() - cpu_before;
        let requests = total(&cs, "podlock_etcd_requests_total").await - before.0;
        let events = total(&cs, "podlock_watch_events_total").await - before.1;
        rss = cs.iter().map(|c| usage(c.sidecar.pid()).0).fold(rss, f64::max);
        drop(cs); // stop these sidecars before the Go Mutex runs
        let per = r.grants.max(1) as f64;
        let go = go_mutex(
            &etcd.endpoint,
            &lock,
            &["contend", &n.to_string(), &window.as_secs_f64().to_string()],
        );
        let go_rate = go["handoffs_per_s"].as_f64().unwrap();
        rows.push([
            format!("handoffs/s, {n} contender(s)"),
            format!("{:.0}", r.handoffs_per_s),
            format!("{go_rate:.0}"),
            ratio(r.handoffs_per_s, go_rate),
        ]);
        rows.push([
            format!("p99 wait, {n} contender(s)"),
            ms(r.p99_wait),
            format!("{:.2} ms", go["p99_wait_ms"].as_f64().unwrap()),
            dash(),
        ]);
        if n > 1 {
            rows.push([
                format!("grants per contender min / max, {n} contenders"),
                format!("{} / {}", r.min_max_grants.0, r.min_max_grants.1),
                format!("{} / {}", go["min_grants"], go["max_grants"]),
                dash(),
            ]);
        }
        rows.push([
            format!("etcd requests / watch events per handoff, {n} contender(s)"),
            format!("{:.2} / {:.2}", requests / per, events / per),
            dash(),
            dash(),
        ]);
        rows.push([
            format!("sidecar CPU s per 1,000 handoffs, {n} contender(s)"),
            format!("{:.2}", cpu / per * 1000.0),
            dash(),
            dash(),
        ]);
    }
    rows.push([
        "sidecar RSS, max over sidecars".into(),
        format!("{rss:.1} MiB"),
        dash(),
        dash(),
    ]);

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("machine: {cores} cores; {etcd_version}; one local etcd; window {window:?} per contended run\n");
    println!("| measurement | podlock (sidecar, HTTP) | etcd Go Mutex | podlock / Go Mutex |");
    println!("|---|---|---|---|");
    for [name, podlock, go, ratio] in rows {
        println!("| {name} | {podlock} | {go} | {ratio} |");
    }

    // The same lock from the shell: one process per cycle around `true`.
    declare(&etcd.endpoint, &["cli"]);
    let cli_sidecar = podlock_contenders(&etcd, "cli", 1).await;
    let podlock_cli: Vec<String> = [
        common::podlock_bin(),
        "lock",
        "cli",
        "--addr",
        &cli_sidecar[0].sidecar.addr,
        "--",
        "true",
    ]
    .map(String::from)
    .to_vec();
    let etcdctl = common::bin_dir().join("etcdctl").display().to_string();
    let etcdctl_cli: Vec<String> = [
        etcdctl.as_str(),
        "--endpoints",
        &etcd.endpoint,
        "lock",
        "cli-etcdctl",
        "--",
        "true",
    ]
    .map(String::from)
    .to_vec();
    println!(
        "\n| `LOCKCLI NAME -- true`, one process per cycle | podlock lock | etcdctl lock | podlock / etcdctl |"
    );
    println!("|---|---|---|---|");
    for loops in [1usize, 8] {
        let p = cli_rate(&podlock_cli, loops, window).await;
        let e = cli_rate(&etcdctl_cli, loops, window).await;
        println!(
            "| cycles/s, {loops} loop(s) | {p:.0} | {e:.0} | {} |",
            ratio(p, e)
        );
    }
}
