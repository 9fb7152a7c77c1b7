//! Benchmark: podlock beside the locks people use instead, same machine, same run.
//!
//! `cargo bench --bench handoff` (add `-- --quick` for a short run) prints one markdown table and
//! writes it to bench/results/handoff.md (a quick run: handoff-quick.md; see tests/common/results):
//! podlock through its sidecar (HTTP on loopback, one sidecar process per contender, like one pod
//! each), etcd's own Go `concurrency.Mutex` and a Redis `SET NX PX` lock (bench/peers), client-go
//! Lease leader election (failover rows) and `etcdctl lock` (shell rows), and two floors: what a
//! handoff physically costs on this etcd (one write, one watch event), and what it costs a lock
//! that enqueues each request (two writes, one watch event; `floor.rs`). Every peer cell also
//! shows podlock's value divided by the peer's (for a floor: the fraction of it podlock
//! reaches). See bench/README.md for what each row means.

#[path = "../../tests/common/mod.rs"]
mod common;
mod failover;
mod floor;
mod measure;
mod path;
mod peers;
mod profile;
mod table;

use std::time::Duration;

use common::usage;
use common::{EtcdServer, declare, results};
use failover::{Fault, TTL};
use floor::{Floor, Ring};
use measure::{EtcdWork, Podlock, cli_rate, contended, uncontended, warm_up};
use peers::{Peers, Redis};
use table::{FLOORS, RATIOS, Row, blocks, contended_rows, etcd_work_row, json_f64, rate_key, spread};

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
    if let Some((n, window)) = mode(&args, "--podlock-only") {
        return profile::podlock_only(n, window).await;
    }
    if let Some((n, window)) = mode(&args, "--floor-only") {
        return profile::floor_only(n, window).await;
    }
    if let Some((n, window)) = mode(&args, "--critical-path") {
        let etcd = EtcdServer::start().await;
        let path = path::measure(&etcd, n, window).await;
        return println!("{}", path.table(n));
    }
    let quick = args.iter().any(|a| a == "--quick");
    let machine = results::machine();
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
    let critical = path::measure(&run.etcd, PATH_CONTENDERS, window).await;
    rows.extend(run.failovers().await);
    rows.extend(run.shell().await);

    let setup = format!(
        "{}; one local etcd and one redis-server; window {window:?} per contended run",
        etcd_version()
    );
    let table = table::render(&rows);
    let critical = critical.table(PATH_CONTENDERS);
    println!("machine: {machine}; {setup}\n{RATIOS}\n\n{table}\n\n{critical}");
    let mut blocks = blocks(&table);
    blocks.push(("critical-path", path::ABOUT, critical));
    let written = results::Run {
        bench: "handoff",
        quick,
        machine,
        setup,
        blocks,
    }
    .write();
    println!("\nwritten: {written}");
}

/// The contenders and seconds after `flag` (`--podlock-only 8 20`), if `args` name it.
fn mode(args: &[String], flag: &str) -> Option<(usize, Duration)> {
    let i = args.iter().position(|a| a == flag)?;
    let number = |j: usize| args.get(j).and_then(|v| v.parse::<u64>().ok());
    let (Some(n), Some(secs)) = (number(i + 1), number(i + 2)) else {
        panic!("usage: {flag} CONTENDERS SECONDS");
    };
    Some((n as usize, Duration::from_secs(secs)))
}

/// The contenders of the critical path's run: a mutex as contended as the 8-contender rows.
const PATH_CONTENDERS: usize = 8;

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

    /// `n` contenders loop acquire → release for the window, podlock, each peer and the floors
    /// taking turns over [`CONTENDED_ROUNDS`] rounds: handoffs, waits, fairness, CPU and etcd
    /// work per grant, each lock's from its median round; and the largest sidecar RSS.
    async fn contended(&self, n: usize) -> (Vec<Row>, f64) {
        let lock = format!("c{n}");
        declare(self.endpoint(), &[&lock]);
        let cs = Podlock::contenders(&self.etcd, &lock, n).await;
        warm_up(&cs).await;
        let (count, secs) = (n.to_string(), self.window.as_secs_f64().to_string());
        let contend = ["-lock", lock.as_str(), "contend", &count, &secs];
        let go_args = [&self.go_flags()[..], &contend].concat();
        let redis_args = [&self.redis_flags()[..], &contend].concat();
        let (mut podlock, mut floor_rounds) = (vec![], vec![]);
        let (mut go, mut redis) = (vec![], vec![]);
        for _ in 0..CONTENDED_ROUNDS {
            podlock.push(self.podlock_round(&cs).await);
            go.push(self.peer_round("etcd-mutex", &go_args, self.etcd.pid()));
            redis.push(self.peer_round("redis-lock", &redis_args, self.redis.pid()));
            if n > 1 {
                let at = |f| floor::ring(self.endpoint(), self.etcd.pid(), n, self.window, f);
                floor_rounds.push([at(Floor::OneWrite).await, at(Floor::TwoWrites).await]);
            }
        }
        let rss = cs.iter().map(|c| usage(c.sidecar.pid()).0).fold(0.0, f64::max);
        drop(cs);
        let key = rate_key(n);
        let p = median_by(podlock, |r| r.run.rate(n));
        let (go, go_cpu) = median_by(go, |(v, _)| json_f64(v, key));
        let (rd, rd_cpu) = median_by(redis, |(v, _)| json_f64(v, key));
        // Each floor's round of median rate, with that round's CPU.
        let floors: Option<[Ring; 2]> = (n > 1).then(|| {
            let (ones, twos): (Vec<Ring>, Vec<Ring>) = floor_rounds.into_iter().map(|[a, b]| (a, b)).unzip();
            [median_by(ones, |r| r.rate), median_by(twos, |r| r.rate)]
        });
        let rates = floors.as_ref().map(|[a, b]| [a.rate, b.rate]);
        let mut rows = contended_rows(n, &p.run, &go, &rd, rates);
        let per = |cpu: f64, grants: f64| 1000.0 * cpu / grants.max(1.0);
        let grants = |v: &serde_json::Value| json_f64(v, "grants_per_s") * self.window.as_secs_f64();
        let cpu_row = |name: String, [a, b, c]: [f64; 3], floor: Option<[f64; 2]>| {
            let row = (Row::new(name).set(0, a, format!("{a:.2}")))
                .set(1, b, format!("{b:.2}"))
                .set(2, c, format!("{c:.2}"));
            match floor {
                Some([f1, f2]) => {
                    row.set(FLOORS, f1, format!("{f1:.2}"))
                        .set(FLOORS + 1, f2, format!("{f2:.2}"))
                }
                None => row,
            }
        };
        let floor_cpu = |cpu: fn(&Ring) -> f64| floors.as_ref().map(|[a, b]| [cpu(a), cpu(b)]);
        let g = p.run.grants as f64;
        rows.push(cpu_row(
            format!("client CPU s per 1,000 grants, {n} contender(s) (podlock: sidecars)"),
            [
                per(p.sidecar_cpu, g),
                per(json_f64(&go, "cpu_s"), grants(&go)),
                per(json_f64(&rd, "cpu_s"), grants(&rd)),
            ],
            floor_cpu(|r| r.client_cpu),
        ));
        rows.push(cpu_row(
            format!("server CPU s per 1,000 grants, {n} contender(s) (etcd / redis-server)"),
            [
                per(p.etcd_cpu, g),
                per(go_cpu, grants(&go)),
                per(rd_cpu, grants(&rd)),
            ],
            floor_cpu(|r| r.etcd_cpu),
        ));
        rows.push(etcd_work_row(&p.work, n, g));
        (rows, rss)
    }

    /// One contended run of podlock on `cs`: what it measured, and the CPU and etcd work it took.
    async fn podlock_round(&self, cs: &[std::sync::Arc<Podlock>]) -> PodlockRound {
        let before = EtcdWork::of(cs).await;
        let sidecars = || cs.iter().map(|c| usage(c.sidecar.pid()).1).sum::<f64>();
        let (sidecar_cpu, etcd_cpu) = (sidecars(), usage(self.etcd.pid()).1);
        let run = contended(cs, self.window).await;
        PodlockRound {
            run,
            sidecar_cpu: sidecars() - sidecar_cpu,
            etcd_cpu: usage(self.etcd.pid()).1 - etcd_cpu,
            work: EtcdWork::of(cs).await.minus(&before),
        }
    }

    /// One contended run of a peer (its own process) with `args`: what it printed, and the CPU
    /// its server (`server_pid`) spent meanwhile.
    fn peer_round(&self, peer: &str, args: &[&str], server_pid: i32) -> (serde_json::Value, f64) {
        let before = usage(server_pid).1;
        let out = self.peers.measure(peer, args);
        (out, usage(server_pid).1 - before)
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

/// How many turns podlock, the peers and the floors take at each contended size: as at the
/// uncontended cycle, so that the machine's drift over minutes hits every column alike.
const CONTENDED_ROUNDS: usize = 3;

/// One contended run of podlock and what it cost.
struct PodlockRound {
    run: measure::Contended,
    /// CPU seconds of the sidecars and of etcd during the run.
    sidecar_cpu: f64,
    etcd_cpu: f64,
    work: EtcdWork,
}

/// The round whose `rate` is the median of `rounds`'.
fn median_by<T>(mut rounds: Vec<T>, rate: impl Fn(&T) -> f64) -> T {
    rounds.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
    rounds.swap_remove(rounds.len() / 2)
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
