//! The benchmark's one table: a row per measurement, a column per lock, each peer cell with
//! podlock's value divided by the peer's.

use std::time::Duration;

use crate::common::{percentile, results};
use crate::measure::{Contended, EtcdWork};

/// Columns after "measurement".
pub const PEERS: [&str; 7] = [
    "podlock",
    "etcd Go Mutex",
    "Redis SET NX PX",
    "Lease election",
    "etcdctl lock",
    "floor: 1 write + 1 watch event",
    "floor: 2 writes + 1 watch event",
];

/// The column of the first floor; the second follows it.
pub const FLOORS: usize = 5;

/// One row: a value per column; `None` where a lock has no such measurement.
pub struct Row {
    name: String,
    pub cells: [Option<(f64, String)>; PEERS.len()],
}

impl Row {
    pub fn new(name: impl Into<String>) -> Self {
        Row {
            name: name.into(),
            cells: Default::default(),
        }
    }

    /// Sets column `col` to `value`, shown as `text`.
    pub fn set(mut self, col: usize, value: f64, text: String) -> Self {
        self.cells[col] = Some((value, text));
        self
    }

    /// The row as a markdown table line.
    pub fn render(&self) -> String {
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
        format!("| {} | {} |", self.name, cells.join(" | "))
    }
}

/// The whole table: its header and every row.
pub fn render(rows: &[Row]) -> String {
    let mut lines = vec![
        format!("| measurement | {} |", PEERS.join(" | ")),
        format!("|---|{}", "---|".repeat(PEERS.len())),
    ];
    lines.extend(rows.iter().map(Row::render));
    lines.join("\n")
}

/// What the cells' bracketed figures are.
pub const RATIOS: &str =
    "(x): podlock's value divided by the peer's (for a floor: the fraction of it podlock reaches)";

/// The results file's blocks: the rows the docs compare, the targets, every row.
pub fn blocks(table: &str) -> Vec<(&'static str, &'static str, String)> {
    vec![
        (
            "side-by-side",
            "The rows docs/comparison.md and the README quote; (x): podlock's value divided by the peer's.",
            results::handoff::side_by_side(table),
        ),
        (
            "targets",
            "Issue #28's targets for this benchmark, each against this run's figure (from the table below).",
            results::handoff::targets(table),
        ),
        ("table", RATIOS, table.to_string()),
    ]
}

pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

pub fn json_f64(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("peer output lacks {key}: {v}"))
}

/// p50 / max of failover times, as (p50 seconds, text).
pub fn spread(mut d: Vec<Duration>) -> (f64, String) {
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

/// The key of a peer's rate in its output, as [`Contended::rate`] is podlock's: grants per
/// second with one contender, else handoffs per second.
pub fn rate_key(contenders: usize) -> &'static str {
    match contenders {
        1 => "grants_per_s",
        _ => "handoffs_per_s",
    }
}

/// The rows of one contended run: handoffs, waits, fairness.
pub fn contended_rows(
    n: usize,
    r: &Contended,
    go: &serde_json::Value,
    rd: &serde_json::Value,
    floors: Option<[f64; 2]>,
) -> Vec<Row> {
    let key = rate_key(n);
    let podlock = r.rate(n);
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
    for (i, f) in floors.into_iter().flatten().enumerate() {
        rows[0].cells[FLOORS + i] = Some((f, format!("{f:.0}")));
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

/// The row of `work` over `grants` grants with `n` contenders: each per grant.
pub fn etcd_work_row(work: &EtcdWork, n: usize, grants: f64) -> Row {
    let [requests, watches, events] = work.per_grant(grants);
    Row::new(format!(
        "etcd requests / watches created / watch events per grant, {n} contender(s)"
    ))
    .set(0, requests, format!("{requests:.2} / {watches:.2} / {events:.2}"))
}
