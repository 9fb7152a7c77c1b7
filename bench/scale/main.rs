//! Scale benchmark: podlock on the real control plane (etcd, kube-apiserver) with its operator
//! watching every namespace, at the size of a busy cluster.
//!
//! `cargo bench --bench scale` creates 10,000 DistributedLocks across 100 namespaces, starts the
//! operator and waits for all of them to be Ready; runs 1,000 holder ids through 20 sidecars,
//! taking turns on 200 locks (about 100 handoffs/s) while a watch measures how long each grant
//! takes to show in its lock's status; queues 1,000 waiters on one lock and lets each in turn;
//! and has one sidecar take 200 holds. `-- --quick` does the same at a tenth of the size (a
//! smoke run, no figure to quote). It prints one table, each row as soon as it is measured:
//! each figure beside issue #15's target; at the end it writes the table to
//! bench/results/scale.md (a quick run: scale-quick.md; see tests/common/results).

#[path = "../../tests/common/mod.rs"]
mod common;
mod cpu;
mod fleet;
mod load;
mod stages;
mod status;

use std::time::{Duration, Instant};

use common::kube::{Operator, with_crd};
use common::{percentile, results, usage};
use cpu::Cpu;
use fleet::ApiWrites;
use stages::{Histogram, STAGES};

/// The operator's `podlock_reconcile_duration_seconds`: seconds spent reconciling, and how many
/// reconciliations (failed ones too).
const RECONCILE_SECONDS: [&str; 2] = [
    "podlock_reconcile_duration_seconds_sum",
    "podlock_reconcile_duration_seconds_count",
];

/// How big a run is.
pub struct Sizes {
    /// DistributedLocks, spread evenly over `namespaces`.
    pub locks: usize,
    pub namespaces: usize,
    /// Holder ids taking turns in the steady load (five per lock), over `sidecars`.
    pub clients: usize,
    pub sidecars: usize,
    /// How long each hold of the steady load lasts, and how long the load runs.
    pub hold: Duration,
    pub window: Duration,
    /// Waiters queued on one lock.
    pub waiters: usize,
    /// Holds taken by one sidecar.
    pub holds: usize,
    /// Locks and status writes of the comparison of two ways to write a status.
    pub status_locks: usize,
    pub status_writes: usize,
}

impl Sizes {
    fn new(quick: bool) -> Self {
        let tenth = if quick { 10 } else { 1 };
        Sizes {
            locks: 10_000 / tenth,
            namespaces: 100 / tenth,
            clients: 1_000 / tenth,
            sidecars: if quick { 4 } else { 20 },
            hold: Duration::from_secs(2),
            window: Duration::from_secs(if quick { 15 } else { 60 }),
            waiters: 1_000 / tenth,
            holds: 200 / tenth,
            status_locks: 200 / tenth,
            status_writes: 2_000 / tenth,
        }
    }
}

/// One row: what, the figure, the target.
struct Row(String, String, &'static str);

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let sizes = Sizes::new(quick);
    let machine = results::machine();
    let plane = with_crd();
    let mut table = Table::start(&machine);

    let took = fleet::create(plane, &sizes);
    table.add(&[Row(
        format!(
            "create {} DistributedLocks in {} namespaces (kubectl apply)",
            sizes.locks, sizes.namespaces
        ),
        format!("{:.1} s", took.as_secs_f64()),
        "",
    )]);
    table.add(&status::compare(plane, sizes.status_locks, sizes.status_writes).await);
    let own_ns = plane.namespace("podlock-scale");
    let started = Instant::now();
    let operator = Operator::start_cluster_wide(plane, &own_ns, &[]).await;
    let ready = fleet::all_ready(plane, sizes.locks, Duration::from_secs(1800)).await;
    let (rss, cpu) = usage(operator.pid());
    table.add(&[
        Row(
            format!("operator start to {} locks Ready", sizes.locks),
            format!("{:.1} s (CPU {cpu:.1} s)", (ready - started).as_secs_f64()),
            "",
        ),
        Row(
            "operator RSS, locks Ready".into(),
            format!("{rss:.1} MiB"),
            "≤ 256 MiB",
        ),
    ]);
    table.add(&steady(plane, &operator, &sizes).await);
    table.add(&queue_and_holds(plane, &sizes).await);
    table.add(&[Row(
        "operator RSS, at the end".into(),
        format!("{:.1} MiB", usage(operator.pid()).0),
        "≤ 256 MiB",
    )]);
    let written = results::Run {
        bench: "scale",
        quick,
        machine,
        setup: SETUP.into(),
        blocks: vec![(
            "table",
            "Each figure beside issue #15's target.",
            table.lines.join("\n"),
        )],
    }
    .write();
    println!("\nwritten: {written}");
}

/// The steady load's rows: status lag, API writes, where the lag's time and the CPU went.
async fn steady(plane: &common::kube::ControlPlane, operator: &Operator, sizes: &Sizes) -> Vec<Row> {
    // Two sidecars (pods) per namespace, so that the holder ids of a lock contend across pods.
    let mut sidecars = vec![];
    for n in 0..sizes.sidecars / 2 {
        sidecars.push(load::sidecars(plane, &fleet::namespace(n), 2).await);
    }
    let writes = ApiWrites::read(plane);
    let reconciles = operator.reconciles().await;
    let reconciling = operator.metric_values(RECONCILE_SECONDS).await;
    let scraped = operator.metrics().await;
    let machine = Cpu::now(operator.pid());
    let started = Instant::now();
    let mut s = load::steady(plane, &sidecars, sizes.clients, sizes.hold, sizes.window).await;
    let secs = started.elapsed().as_secs_f64();
    let machine = Cpu::now(operator.pid()).since(&machine, secs);
    let rate = ApiWrites::read(plane).rate_since(&writes, secs);
    let reconciles = operator.reconciles().await - reconciles;
    let [seconds, count] = operator.metric_values(RECONCILE_SECONDS).await;
    let reconciling = [seconds - reconciling[0], count - reconciling[1]];
    let (before, after) = (scraped, operator.metrics().await);
    let stages: Vec<String> = (STAGES.iter())
        .map(|name| {
            Histogram::parse(&after, name)
                .since(&Histogram::parse(&before, name))
                .describe()
        })
        .collect();
    let busy_locks = (sizes.clients / 5) as f64;
    let (p50, p99) = match s.lags.is_empty() {
        true => (Duration::ZERO, Duration::ZERO),
        false => (percentile(&mut s.lags, 0.5), percentile(&mut s.lags, 0.99)),
    };
    vec![
        Row(
            format!(
                "steady load: {} holder ids, {} sidecars, {busy_locks} locks",
                sizes.clients, sizes.sidecars
            ),
            format!("{:.0} grants/s over {secs:.0} s", s.grants as f64 / secs),
            "100 handoffs/s",
        ),
        Row(
            "status lag, grant to status (p50 / p99)".into(),
            format!(
                "{:.0} ms / {:.0} ms ({} grants; {} not seen)",
                ms(p50),
                ms(p99),
                s.lags.len(),
                s.unseen
            ),
            "p99 ≤ 1 s",
        ),
        Row(
            "operator status writes per busy lock per second".into(),
            format!("{:.2} ({:.0}/s in all)", rate.status / busy_locks, rate.status),
            "≤ 1 per coalescing window",
        ),
        Row(
            "operator reconciliations per grant".into(),
            format!("{:.2}", reconciles as f64 / s.grants as f64),
            "",
        ),
        // Little's law: the time spent in reconciliations (or PATCHes) per second of the load is
        // how many were under way on average; at the controller's bound, the backlog is its own.
        Row(
            "operator reconciliation: mean time, how many under way on average".into(),
            format!(
                "{:.0} ms, {:.1}",
                1000.0 * reconciling[0] / reconciling[1].max(1.0),
                reconciling[0] / secs
            ),
            "",
        ),
        Row(
            "operator: etcd change to its reconciliation; status offered to its PATCH".into(),
            stages.join("; "),
            "",
        ),
        Row(
            "API server: status PATCH mean time, how many under way on average".into(),
            format!(
                "{:.0} ms, {:.1}",
                1000.0 * rate.status_seconds / rate.status.max(1e-9),
                rate.status_seconds
            ),
            "",
        ),
        Row("CPU during the load, in cores".into(), machine, ""),
        Row(
            "operator Events written per second".into(),
            format!("{:.1}", rate.events),
            "rate-limited per lock",
        ),
    ]
}

/// One lock's long queue, and one sidecar's many holds.
async fn queue_and_holds(plane: &common::kube::ControlPlane, sizes: &Sizes) -> Vec<Row> {
    let ns = fleet::namespace(sizes.namespaces - 1);
    let sidecars = load::sidecars(plane, &ns, 10).await;
    let queue = load::long_queue(&sidecars, sizes.waiters).await;
    let ns = plane.namespace("scale-holds");
    fleet::create_in(plane, &ns, sizes.holds);
    fleet::all_ready(plane, sizes.locks + sizes.holds, Duration::from_secs(300)).await;
    let holder = load::sidecars(plane, &ns, 1).await;
    let rss = load::many_holds(&holder[0], sizes.holds).await;
    vec![
        Row(
            format!("etcd requests per grant, {} waiters on one lock", sizes.waiters),
            format!(
                "{:.2} (of which sent again after 500 ms unanswered: {:.2}; acquires answered 503 while queueing, and retried: {})",
                queue.per_grant, queue.resent, queue.retried
            ),
            "flat in queue length",
        ),
        Row(
            format!("sidecar RSS with {} holds", sizes.holds),
            format!("{rss:.1} MiB"),
            "≤ 32 MiB",
        ),
    ]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// What the run ran on.
const SETUP: &str = "one etcd and one kube-apiserver, the operator watching every namespace";

/// The table: each row printed as soon as it is measured, so a run that fails late keeps what it
/// measured, and kept for the results file.
struct Table {
    lines: Vec<String>,
}

impl Table {
    fn start(machine: &str) -> Self {
        println!("machine: {machine}; {SETUP}\n");
        let table = Table {
            lines: vec![
                "| measurement | podlock | target (issue #15) |".into(),
                "|---|---|---|".into(),
            ],
        };
        table.lines.iter().for_each(|l| println!("{l}"));
        table
    }

    fn add(&mut self, rows: &[Row]) {
        for Row(what, value, target) in rows {
            let line = format!("| {what} | {value} | {target} |");
            println!("{line}");
            self.lines.push(line);
        }
    }
}
