//! Benchmark: podlock beside the locks people use instead, same machine, same run.
//!
//! `cargo bench --bench handoff` (add `-- --quick` for a short run) prints one markdown table:
//! podlock through its sidecar (HTTP on loopback, one sidecar process per contender, like one pod
//! each), etcd's own Go `concurrency.Mutex` and a Redis `SET NX PX` lock (bench/peers), client-go
//! Lease leader election (failover rows) and `etcdctl lock` (shell rows), and the floor: what a
//! handoff physically costs on this etcd (one write, one watch event; `floor.rs`). Every peer
//! cell also shows podlock's value divided by the peer's (for the floor: the fraction of it
//! podlock reaches). See bench/README.md for what each row means.

#[path = "../../tests/common/mod.rs"]
mod common;
mod failover;
mod floor;
mod measure;
mod peers;

use std::time::Duration;

use common::{EtcdServer, declare, percentile};
use failover::{Fault, TTL};
use measure::{Podlock, cli_rate, contended, uncontended, usage};
use peers::{Peers, Redis};

/// Columns after "measurement".
const PEERS: [&str; 6] = [
    "podlock",
    "etcd Go Mutex",
    "Redis SET NX PX",
    "Lease election",
    "etcdctl lock",
    "floor: 1 write + 1 watch event",
];

/// One row: a value per column; `None` where a lock has no such measurement.
struct Row {
    name: String,
    cells: [Option<(f64, String)>; 6],
}

impl Row {
    fn new(name: impl Into<String>) -> Self {
        Row {
            name: name.into(),
            cells: Default::default(),
        }
    }

    /// Sets column `col` to `value`, shown as `text`.
    fn set(mut self, col: usize, value: f64, text: String) -> Self {
        self.cells[col] = Some((value, text));
        self
    }

    fn print(&self) {
        let podlock = self.cells[0].as_ref().map(|c| c.0);
        let cells: Vec<String> = self
            .cells
            .iter()
            .enumerate()
            .map(|(i, c)| match (c, podlock) {
                (None, _) => "—".into(),
                (Some((_, text)), _) if i == 0 => text.clone(),
                (Some((v, text)), Some(p)) if *v > 0.0 => format!("{text} ({:.2}x)", p / v),
                (Some((_, text)), _) => text.clone(),
            })
            .collect();
        println!("| {} | {} |", self.name, cells.join(" | "));
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn json_f64(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("peer output lacks {key}: {v}"))
}

/// p50 / max of failover times, as (p50 seconds, text).
fn spread(mut d: Vec<Duration>) -> (f64, String) {
    let (p50, p99) = (percentile(&mut d, 0.5), percentile(&mut d, 0.99));
    let s = |d: Duration| match d.as_secs_f64() {
        secs if secs < 1.0 => format!("{:.0} ms", secs * 1000.0),
        secs => format!("{secs:.2} s"),
    };
    let text = if d.len() >= 10 {
        format!("{} / {} (p50 / p99, {} trials)", s(p50), s(p99), d.len())
    } else {
        let trials = if d.len() == 1 {
            "1 trial".into()
        } else {
            format!("{} trials", d.len())
        };
        format!("{} / {} (p50 / max, {trials})", s(p50), s(p99))
    };
    (p50.as_secs_f64(), text)
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (cycles, window, trials, pod_trials) = if quick {
        (300, Duration::from_secs(2), 1, 5)
    } else {
        (2000, Duration::from_secs(5), 3, 20)
    };
    let peers = Peers::build();
    let etcd = EtcdServer::start().await;
    let redis = Redis::start().await;
    let (endpoint, raddr) = (etcd.endpoint.as_str(), redis.addr.as_str());
    let go_flags = ["-endpoint", endpoint];
    let redis_flags = ["-addr", raddr];
    let (ttl_s, ttl_ms) = (TTL.to_string(), (TTL * 1000).to_string());
    let go_failover = ["-endpoint", endpoint, "-ttl", &ttl_s];
    let redis_failover = ["-addr", raddr, "-ttl-ms", &ttl_ms];
    let mut rows: Vec<Row> = vec![];

    declare(endpoint, &["solo"]);
    let solo = Podlock::contenders(&etcd, "solo", 1).await;
    let (p50, p99, rate) = uncontended(&solo[0], cycles).await;
    let n = cycles.to_string();
    let go = peers.measure(
        "etcd-mutex",
        &[&go_flags[..], &["-lock", "solo", "uncontended", &n]].concat(),
    );
    let rd = peers.measure(
        "redis-lock",
        &[&redis_flags[..], &["-lock", "solo", "uncontended", &n]].concat(),
    );
    let latency = |v: &serde_json::Value| {
        let p50 = json_f64(v, "p50_ms");
        (p50, format!("{p50:.2} ms / {:.2} ms", json_f64(v, "p99_ms")))
    };
    let (go_l, rd_l) = (latency(&go), latency(&rd));
    rows.push(
        Row::new("uncontended acquire+release p50 / p99")
            .set(
                0,
                p50.as_secs_f64() * 1000.0,
                format!("{} / {}", ms(p50), ms(p99)),
            )
            .set(1, go_l.0, go_l.1)
            .set(2, rd_l.0, rd_l.1),
    );
    let (go_r, rd_r) = (json_f64(&go, "cycles_per_s"), json_f64(&rd, "cycles_per_s"));
    rows.push(
        Row::new("uncontended cycles/s")
            .set(0, rate, format!("{rate:.0}"))
            .set(1, go_r, format!("{go_r:.0}"))
            .set(2, rd_r, format!("{rd_r:.0}")),
    );
    let mut rss: f64 = usage(solo[0].sidecar.pid()).0;
    drop(solo);

    for n in [1usize, 8, 64] {
        let lock = format!("c{n}");
        declare(endpoint, &[&lock]);
        let cs = Podlock::contenders(&etcd, &lock, n).await;
        let total = async |metric: &str| {
            let mut sum = 0.0;
            for c in &cs {
                sum += c.sidecar.metric(metric).await;
            }
            sum
        };
        let before = (
            total("podlock_etcd_requests_total").await,
            total("podlock_watch_events_total").await,
            total("podlock_etcd_watches_total").await,
        );
        let cpu_before: f64 = cs.iter().map(|c| usage(c.sidecar.pid()).1).sum();
        let etcd_before = usage(etcd.pid()).1;
        let r = contended(&cs, window).await;
        let etcd_cpu = usage(etcd.pid()).1 - etcd_before;
        let cpu: f64 = cs.iter().map(|c| usage(c.sidecar.pid()).1).sum::<f64>() - cpu_before;
        let requests = total("podlock_etcd_requests_total").await - before.0;
        let events = total("podlock_watch_events_total").await - before.1;
        let watches = total("podlock_etcd_watches_total").await - before.2;
        rss = cs.iter().map(|c| usage(c.sidecar.pid()).0).fold(rss, f64::max);
        drop(cs); // stop these sidecars before the peers run
        let (count, secs) = (n.to_string(), window.as_secs_f64().to_string());
        let contend = ["-lock", lock.as_str(), "contend", &count, &secs];
        let etcd_before = usage(etcd.pid()).1;
        let go = peers.measure("etcd-mutex", &[&go_flags[..], &contend].concat());
        let go_etcd_cpu = usage(etcd.pid()).1 - etcd_before;
        let redis_before = usage(redis.pid()).1;
        let rd = peers.measure("redis-lock", &[&redis_flags[..], &contend].concat());
        let redis_cpu = usage(redis.pid()).1 - redis_before;
        let floor = (n > 1).then_some(floor::handoffs_per_s(endpoint, n, window).await);
        rows.extend(contended_rows(n, &r, &go, &rd, floor));
        let per = |grants: f64| 1000.0 / grants.max(1.0);
        let (grants, go_grants, rd_grants) = (
            r.grants as f64,
            json_f64(&go, "grants_per_s") * window.as_secs_f64(),
            json_f64(&rd, "grants_per_s") * window.as_secs_f64(),
        );
        let cpu_row = |name: String, p: f64, g: f64, rd_v: f64| {
            Row::new(name)
                .set(0, p * per(grants), format!("{:.2}", p * per(grants)))
                .set(1, g * per(go_grants), format!("{:.2}", g * per(go_grants)))
                .set(2, rd_v * per(rd_grants), format!("{:.2}", rd_v * per(rd_grants)))
        };
        rows.push(cpu_row(
            format!("client CPU s per 1,000 grants, {n} contender(s) (podlock: sidecars)"),
            cpu,
            json_f64(&go, "cpu_s"),
            json_f64(&rd, "cpu_s"),
        ));
        rows.push(cpu_row(
            format!("server CPU s per 1,000 grants, {n} contender(s) (etcd / redis-server)"),
            etcd_cpu,
            go_etcd_cpu,
            redis_cpu,
        ));
        let per_grant = format!(
            "{:.2} / {:.2} / {:.2}",
            requests / grants.max(1.0),
            watches / grants.max(1.0),
            events / grants.max(1.0)
        );
        rows.push(
            Row::new(format!(
                "etcd requests / watches created / watch events per grant, {n} contender(s)"
            ))
            .set(0, requests / grants.max(1.0), per_grant),
        );
    }
    rows.push(Row::new("sidecar RSS, max over sidecars").set(0, rss, format!("{rss:.1} MiB")));

    for (fault, what) in [
        (Fault::Kill, "holder killed (kill -9)"),
        (
            Fault::PodDeleted,
            "holder's node lost (SIGSTOP) and its Pod deleted",
        ),
    ] {
        let podlock = match fault {
            Fault::Kill => failover::podlock_killed(&etcd, trials).await,
            Fault::PodDeleted => failover::podlock_pod_deleted(pod_trials).await,
        };
        let cells = [
            spread(podlock),
            spread(failover::peer(&peers, "etcd-mutex", &go_failover, fault, trials).await),
            spread(failover::peer(&peers, "redis-lock", &redis_failover, fault, trials).await),
            spread(failover::lease_election(&peers, fault, trials).await),
        ];
        let mut row = Row::new(format!("failover: {what}, TTL {TTL} s"));
        for (i, (v, text)) in cells.into_iter().enumerate() {
            row = row.set(i, v, text);
        }
        rows.push(row);
    }

    // The same lock from the shell: one process per cycle around `true`.
    declare(endpoint, &["cli"]);
    let cli = Podlock::contenders(&etcd, "cli", 1).await;
    let podlock_cli: Vec<String> = [
        common::podlock_bin(),
        "lock",
        "cli",
        "--addr",
        &cli[0].sidecar.addr,
        "--",
        "true",
    ]
    .map(String::from)
    .to_vec();
    let etcdctl = common::bin_dir().join("etcdctl").display().to_string();
    let etcdctl_cli: Vec<String> = [
        &etcdctl,
        "--endpoints",
        endpoint,
        "lock",
        "cli-etcdctl",
        "--",
        "true",
    ]
    .map(String::from)
    .to_vec();
    for loops in [1usize, 8] {
        let (p, e) = (
            cli_rate(&podlock_cli, loops, window).await,
            cli_rate(&etcdctl_cli, loops, window).await,
        );
        rows.push(
            Row::new(format!("shell: `LOCKCLI NAME -- true` cycles/s, {loops} loop(s)"))
                .set(0, p, format!("{p:.0}"))
                .set(4, e, format!("{e:.0}")),
        );
    }

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "machine: {cores} cores; {}; one local etcd and one redis-server; window {window:?} per contended run",
        etcd_version()
    );
    println!("(x): podlock's value divided by the peer's\n");
    println!("| measurement | {} |", PEERS.join(" | "));
    println!("|---|{}", "---|".repeat(PEERS.len()));
    for r in &rows {
        r.print();
    }
}

/// The rows of one contended run: handoffs, waits, fairness.
fn contended_rows(
    n: usize,
    r: &measure::Contended,
    go: &serde_json::Value,
    rd: &serde_json::Value,
    floor: Option<f64>,
) -> Vec<Row> {
    let key = if n == 1 { "grants_per_s" } else { "handoffs_per_s" };
    let podlock = if n == 1 {
        r.grants as f64 / r.window_s
    } else {
        r.handoffs_per_s
    };
    let what = if n == 1 {
        "grants/s, 1 contender"
    } else {
        "handoffs/s"
    };
    let (g, d) = (json_f64(go, key), json_f64(rd, key));
    let mut rows = vec![
        Row::new(if n == 1 {
            what.to_string()
        } else {
            format!("{what}, {n} contenders")
        })
        .set(0, podlock, format!("{podlock:.0}"))
        .set(1, g, format!("{g:.0}"))
        .set(2, d, format!("{d:.0}")),
    ];
    if let Some(f) = floor {
        rows[0].cells[5] = Some((f, format!("{f:.0}")));
    }
    let (gw, dw) = (json_f64(go, "p99_wait_ms"), json_f64(rd, "p99_wait_ms"));
    let pw = r.p99_wait.as_secs_f64() * 1000.0;
    rows.push(
        Row::new(format!("p99 wait, {n} contender(s)"))
            .set(0, pw, ms(r.p99_wait))
            .set(1, gw, format!("{gw:.2} ms"))
            .set(2, dw, format!("{dw:.2} ms")),
    );
    if n > 1 {
        let spread = |v: &serde_json::Value| format!("{} / {}", v["min_grants"], v["max_grants"]);
        let (lo, hi) = r.min_max_grants;
        rows.push(
            Row::new(format!("grants per contender min / max, {n} contenders"))
                .set(0, 0.0, format!("{lo} / {hi}"))
                .set(1, 0.0, spread(go))
                .set(2, 0.0, spread(rd)),
        );
    }
    rows
}

fn etcd_version() -> String {
    let out = std::process::Command::new(common::bin_dir().join("etcd"))
        .arg("--version")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("?")
        .to_string()
}
