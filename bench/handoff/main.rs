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
mod table;

use std::time::Duration;

use common::usage;
use common::{EtcdServer, declare};
use failover::{Fault, TTL};
use measure::{Podlock, cli_rate, contended, uncontended};
use peers::{Peers, Redis};
use table::{PEERS, Row, contended_rows, json_f64, spread};

/// One run of the benchmark: its sizes, and what every lock runs on.
struct Run {
    /// Uncontended cycles.
    cycles: usize,
    /// How long each contended run lasts.
    window: Duration,
    /// Failover trials per peer, and for podlock's Pod-deletion row.
    trials: usize,
    pod_trials: usize,
    peers: Peers,
    etcd: EtcdServer,
    redis: Redis,
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--podlock-only") {
        let number = |j: usize| args.get(j).and_then(|v| v.parse::<u64>().ok());
        let (Some(n), Some(secs)) = (number(i + 1), number(i + 2)) else {
            panic!("usage: --podlock-only CONTENDERS SECONDS");
        };
        return podlock_only(n as usize, Duration::from_secs(secs)).await;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let (cycles, window, trials, pod_trials) = if quick {
        (300, Duration::from_secs(2), 1, 5)
    } else {
        (2000, Duration::from_secs(5), 3, 20)
    };
    let run = Run {
        cycles,
        window,
        trials,
        pod_trials,
        peers: Peers::build(),
        etcd: EtcdServer::start().await,
        redis: Redis::start().await,
    };
    let (mut rows, mut rss) = run.uncontended().await;
    for n in [1usize, 8, 64] {
        let (more, sidecar_rss) = run.contended(n).await;
        rows.extend(more);
        rss = rss.max(sidecar_rss);
    }
    rows.push(Row::new("sidecar RSS, max over sidecars").set(0, rss, format!("{rss:.1} MiB")));
    rows.extend(run.failovers().await);
    rows.extend(run.shell().await);

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

/// `--podlock-only N SECONDS`: podlock alone, `n` contenders for `window`, for a profiler to
/// watch (`scripts/profile-handoff.sh`); prints one line.
async fn podlock_only(n: usize, window: Duration) {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["profiled"]);
    let cs = Podlock::contenders(&etcd, "profiled", n).await;
    println!(
        "podlock, {n} contenders, etcd pid {}: running for {window:?}",
        etcd.pid()
    );
    let r = contended(&cs, window).await;
    let mean = Duration::from_secs_f64(1.0 / r.handoffs_per_s.max(1e-9));
    println!(
        "handoffs/s {:.0}, mean handoff {:.2} ms, p99 wait {:.1} ms (FIFO predicts about {:.1} ms: {n} handoffs)",
        r.handoffs_per_s,
        mean.as_secs_f64() * 1000.0,
        r.p99_wait.as_secs_f64() * 1000.0,
        mean.as_secs_f64() * 1000.0 * n as f64
    );
    let quantiles = quantiles(&r.waits, &[0.5, 0.9, 0.99, 0.999, 1.0]);
    println!("waits over {} grants: {quantiles}", r.waits.len());
    let slow = |ms: u64| {
        r.waits
            .iter()
            .filter(|w| **w >= Duration::from_millis(ms))
            .count()
    };
    let buckets = [20, 30, 50, 100, 200].map(|ms| format!(">= {ms} ms: {}", slow(ms)));
    println!("slow waits: {}", buckets.join(", "));
    print_gaps(&r.grants_at);
}

/// The time between consecutive grants: a stall of the whole lock (every waiter's wait grows by
/// it) shows as a long gap, a waiter served out of turn does not.
fn print_gaps(grants_at: &[Duration]) {
    let mut gaps: Vec<(Duration, Duration)> = (grants_at.windows(2)).map(|w| (w[1] - w[0], w[1])).collect();
    gaps.sort();
    let Some(&(longest, _)) = gaps.last() else {
        return;
    };
    let sorted: Vec<Duration> = gaps.iter().map(|g| g.0).collect();
    let long = |ms: u64| gaps.iter().filter(|g| g.0 >= Duration::from_millis(ms)).count();
    println!(
        "gaps between grants: {}, longest {:.1} ms; >= 10 ms: {}, >= 30 ms: {}",
        quantiles(&sorted, &[0.5, 0.9, 0.99, 0.999]),
        longest.as_secs_f64() * 1000.0,
        long(10),
        long(30)
    );
    let worst: Vec<_> = (gaps.iter().rev().take(8))
        .map(|(g, t)| {
            format!(
                "{:.1} ms ending at {:.3} s",
                g.as_secs_f64() * 1000.0,
                t.as_secs_f64()
            )
        })
        .collect();
    println!("longest gaps: {}", worst.join("; "));
}

/// `sorted`'s value at each of `ps`, as "p: x ms, ...".
fn quantiles(sorted: &[Duration], ps: &[f64]) -> String {
    let at = |p: f64| sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)];
    let each: Vec<_> = (ps.iter())
        .map(|&p| format!("{p}: {:.1} ms", at(p).as_secs_f64() * 1000.0))
        .collect();
    each.join(", ")
}

/// How many turns podlock and the peers take at the uncontended cycle.
const UNCONTENDED_ROUNDS: usize = 5;

/// Each of the three figures' median over the rounds.
fn medians(rounds: &[[f64; 3]]) -> [f64; 3] {
    [0, 1, 2].map(|i| {
        let mut v: Vec<f64> = rounds.iter().map(|r| r[i]).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    })
}

impl Run {
    fn endpoint(&self) -> &str {
        &self.etcd.endpoint
    }

    /// Uncontended acquire + release: latency and rate; and the sidecar's RSS after it. podlock
    /// and the peers take turns over [`UNCONTENDED_ROUNDS`] rounds and each figure is the
    /// median of its rounds: this shared machine's speed drifts within minutes, and measured one
    /// after the other the ratios followed the drift (1.55x in one run, 1.92x in the next).
    async fn uncontended(&self) -> (Vec<Row>, f64) {
        declare(self.endpoint(), &["solo"]);
        let solo = Podlock::contenders(&self.etcd, "solo", 1).await;
        let per_round = self.cycles / UNCONTENDED_ROUNDS;
        let n = per_round.to_string();
        let args = ["-lock", "solo", "uncontended", &n];
        let [mut podlock, mut go, mut redis] = [vec![], vec![], vec![]];
        for _ in 0..UNCONTENDED_ROUNDS {
            let (p50, p99, rate) = uncontended(&solo[0], per_round).await;
            podlock.push([p50.as_secs_f64() * 1000.0, p99.as_secs_f64() * 1000.0, rate]);
            let peer = |v: serde_json::Value| ["p50_ms", "p99_ms", "cycles_per_s"].map(|k| json_f64(&v, k));
            go.push(peer(
                self.peers
                    .measure("etcd-mutex", &[&self.go_flags()[..], &args].concat()),
            ));
            redis.push(peer(
                self.peers
                    .measure("redis-lock", &[&self.redis_flags()[..], &args].concat()),
            ));
        }
        let [podlock, go, redis] = [podlock, go, redis].map(|rounds| medians(&rounds));
        let mut latency = Row::new("uncontended acquire+release p50 / p99 (median of rounds)");
        let mut rate = Row::new("uncontended cycles/s (median of rounds)");
        for (column, [p50, p99, r]) in [podlock, go, redis].into_iter().enumerate() {
            latency = latency.set(column, p50, format!("{p50:.2} ms / {p99:.2} ms"));
            rate = rate.set(column, r, format!("{r:.0}"));
        }
        (vec![latency, rate], usage(solo[0].sidecar.pid()).0)
    }

    fn go_flags(&self) -> [&str; 2] {
        ["-endpoint", self.endpoint()]
    }

    fn redis_flags(&self) -> [&str; 2] {
        ["-addr", &self.redis.addr]
    }

    /// `n` contenders loop acquire → release for the window, on podlock, then on each peer and
    /// the floor: handoffs, waits, fairness, CPU and etcd work per grant; and the largest
    /// sidecar RSS.
    async fn contended(&self, n: usize) -> (Vec<Row>, f64) {
        let lock = format!("c{n}");
        declare(self.endpoint(), &[&lock]);
        let cs = Podlock::contenders(&self.etcd, &lock, n).await;
        let before = EtcdWork::of(&cs).await;
        let cpu_before: f64 = cs.iter().map(|c| usage(c.sidecar.pid()).1).sum();
        let etcd_before = usage(self.etcd.pid()).1;
        let r = contended(&cs, self.window).await;
        let etcd_cpu = usage(self.etcd.pid()).1 - etcd_before;
        let cpu: f64 = cs.iter().map(|c| usage(c.sidecar.pid()).1).sum::<f64>() - cpu_before;
        let work = EtcdWork::of(&cs).await.minus(&before);
        let rss = cs.iter().map(|c| usage(c.sidecar.pid()).0).fold(0.0, f64::max);
        drop(cs); // stop these sidecars before the peers run
        let (count, secs) = (n.to_string(), self.window.as_secs_f64().to_string());
        let contend = ["-lock", lock.as_str(), "contend", &count, &secs];
        let etcd_before = usage(self.etcd.pid()).1;
        let go = self
            .peers
            .measure("etcd-mutex", &[&self.go_flags()[..], &contend].concat());
        let go_etcd_cpu = usage(self.etcd.pid()).1 - etcd_before;
        let redis_before = usage(self.redis.pid()).1;
        let rd = self
            .peers
            .measure("redis-lock", &[&self.redis_flags()[..], &contend].concat());
        let redis_cpu = usage(self.redis.pid()).1 - redis_before;
        let floor = match n {
            1 => None,
            _ => Some(floor::handoffs_per_s(self.endpoint(), n, self.window).await),
        };
        let mut rows = contended_rows(n, &r, &go, &rd, floor);
        let secs = self.window.as_secs_f64();
        let per = |grants: f64| 1000.0 / grants.max(1.0);
        let (grants, go_grants, rd_grants) = (
            r.grants as f64,
            json_f64(&go, "grants_per_s") * secs,
            json_f64(&rd, "grants_per_s") * secs,
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
        rows.push(work.row(n, grants));
        (rows, rss)
    }

    /// The holder goes away while a waiter queues: the time until the waiter is granted.
    async fn failovers(&self) -> Vec<Row> {
        let (ttl_s, ttl_ms) = (TTL.to_string(), (TTL * 1000).to_string());
        let go_failover = ["-endpoint", self.endpoint(), "-ttl", &ttl_s];
        let redis_failover = ["-addr", &self.redis.addr, "-ttl-ms", &ttl_ms];
        let (peers, trials) = (&self.peers, self.trials);
        let mut rows = vec![];
        for (fault, what) in [
            (Fault::Kill, "holder killed (kill -9)"),
            (
                Fault::PodDeleted,
                "holder's node lost (SIGSTOP) and its Pod deleted",
            ),
        ] {
            let podlock = match fault {
                Fault::Kill => failover::podlock_killed(&self.etcd, trials).await,
                Fault::PodDeleted => failover::podlock_pod_deleted(self.pod_trials).await,
            };
            let cells = [
                spread(podlock),
                spread(failover::peer(peers, "etcd-mutex", &go_failover, fault, trials).await),
                spread(failover::peer(peers, "redis-lock", &redis_failover, fault, trials).await),
                spread(failover::lease_election(peers, fault, trials).await),
            ];
            let mut row = Row::new(format!("failover: {what}, TTL {TTL} s"));
            for (i, (v, text)) in cells.into_iter().enumerate() {
                row = row.set(i, v, text);
            }
            rows.push(row);
        }
        rows
    }

    /// The same lock from the shell: one process per cycle around `true`.
    async fn shell(&self) -> Vec<Row> {
        declare(self.endpoint(), &["cli"]);
        let cli = Podlock::contenders(&self.etcd, "cli", 1).await;
        let addr = cli[0].sidecar.addr.as_str();
        let podlock_cli = [common::podlock_bin(), "lock", "cli", "--addr", addr, "--", "true"];
        let etcdctl = common::bin_dir().join("etcdctl").display().to_string();
        let endpoint = self.endpoint();
        let etcdctl_cli = [
            &etcdctl,
            "--endpoints",
            endpoint,
            "lock",
            "cli-etcdctl",
            "--",
            "true",
        ];
        let (podlock_cli, etcdctl_cli) = (podlock_cli.map(String::from), etcdctl_cli.map(String::from));
        let mut rows = vec![];
        for loops in [1usize, 8] {
            let p = cli_rate(&podlock_cli, loops, self.window).await;
            let e = cli_rate(&etcdctl_cli, loops, self.window).await;
            rows.push(
                Row::new(format!("shell: `LOCKCLI NAME -- true` cycles/s, {loops} loop(s)"))
                    .set(0, p, format!("{p:.0}"))
                    .set(4, e, format!("{e:.0}")),
            );
        }
        rows
    }
}

/// The etcd work podlock's sidecars counted: unary requests, watches created, watch events.
struct EtcdWork([f64; 3]);

impl EtcdWork {
    const METRICS: [&str; 3] = [
        "podlock_etcd_requests_total",
        "podlock_etcd_watches_total",
        "podlock_watch_events_total",
    ];

    /// The sums over `contenders`' sidecars.
    async fn of(contenders: &[std::sync::Arc<Podlock>]) -> Self {
        let mut sums = [0.0; 3];
        for (sum, metric) in sums.iter_mut().zip(Self::METRICS) {
            for c in contenders {
                *sum += c.sidecar.metric(metric).await;
            }
        }
        EtcdWork(sums)
    }

    fn minus(&self, before: &EtcdWork) -> EtcdWork {
        EtcdWork(std::array::from_fn(|i| self.0[i] - before.0[i]))
    }

    /// The row: each per grant.
    fn row(&self, n: usize, grants: f64) -> Row {
        let [requests, watches, events] = self.0.map(|v| v / grants.max(1.0));
        Row::new(format!(
            "etcd requests / watches created / watch events per grant, {n} contender(s)"
        ))
        .set(0, requests, format!("{requests:.2} / {watches:.2} / {events:.2}"))
    }
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
