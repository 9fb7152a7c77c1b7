//! The blocks of bench/results/handoff.md that are derived from its full table: the rows the docs
//! compare side by side, and issue #15's targets met or missed. Derived from the table's text,
//! so the docs test can check a results file's blocks against its own table.

use super::table::{Table, first, ratio};

/// The full table's columns the side-by-side block keeps (the floors are not locks).
const LOCKS: [&str; 5] = [
    "podlock",
    "etcd Go Mutex",
    "Redis SET NX PX",
    "Lease election",
    "etcdctl lock",
];

/// The rows the side-by-side block keeps, in order.
const SIDE_BY_SIDE: [&str; 9] = [
    "uncontended acquire+release p50 / p99 (median of rounds)",
    "handoffs/s, 8 contenders",
    "p99 wait, 8 contender(s)",
    "grants per contender min / max, 8 contenders",
    "handoffs/s, 64 contenders",
    "etcd requests / watches created / watch events per grant, 8 contender(s)",
    "failover: holder killed (kill -9), TTL 5 s",
    "failover: holder's node lost (SIGSTOP) and its Pod deleted, TTL 5 s",
    "shell: `LOCKCLI NAME -- true` cycles/s, 1 loop(s)",
];

/// The full table's rows named in [`SIDE_BY_SIDE`], in the columns of [`LOCKS`].
pub fn side_by_side(full: &str) -> String {
    let table = Table::parse(full).expect("the handoff table");
    let keep: Vec<usize> = std::iter::once(0)
        .chain(LOCKS.iter().map(|l| column(&table, l)))
        .collect();
    let line = |cells: &[String]| {
        let kept: Vec<&str> = keep.iter().map(|&i| cells[i].as_str()).collect();
        format!("| {} |", kept.join(" | "))
    };
    let mut out = vec![line(&table.header), format!("|{}", "---|".repeat(keep.len()))];
    for name in SIDE_BY_SIDE {
        let row = table.row(name).unwrap_or_else(|| panic!("no row {name}"));
        out.push(line(row));
    }
    out.join("\n")
}

fn column(table: &Table, name: &str) -> usize {
    (table.header.iter().position(|h| h == name)).unwrap_or_else(|| panic!("no column {name}"))
}

/// One target: what was asked, what the run measured, whether that meets it.
struct Target {
    asked: String,
    measured: String,
    met: bool,
}

/// Issue #15's targets for this benchmark, each with the full table's figure.
pub fn targets(full: &str) -> String {
    let t = Table::parse(full).expect("the handoff table");
    let cell = |row: &str, column: &str| {
        t.cell(row, column)
            .unwrap_or_else(|| panic!("no cell {row} / {column}"))
            .to_string()
    };
    let num = |text: &str| first(text).unwrap_or_else(|| panic!("no number in {text}"));
    let mut out = vec![];
    for (n, at_least) in [(8, 6.0), (64, 1.3)] {
        let row = format!("handoffs/s, {n} contenders");
        let mutex = cell(&row, "etcd Go Mutex");
        let x = ratio(&mutex).expect("a ratio");
        out.push(Target {
            asked: format!("handoffs/s at {n} contenders at least {at_least}x the etcd Go Mutex's"),
            measured: format!("{x}x ({} vs {})", cell(&row, "podlock"), num(&mutex)),
            met: x.value >= at_least,
        });
    }
    let floor = cell("handoffs/s, 8 contenders", "floor: 1 write + 1 watch event");
    let share = ratio(&floor).expect("a ratio").value * 100.0;
    out.push(Target {
        asked: "handoffs/s at 8 contenders at least 50% of the 1-write floor's".into(),
        measured: format!(
            "{share:.0}% ({} of {})",
            cell("handoffs/s, 8 contenders", "podlock"),
            num(&floor)
        ),
        met: share >= 50.0,
    });
    let uncontended = "uncontended acquire+release p50 / p99 (median of rounds)";
    let mutex = cell(uncontended, "etcd Go Mutex");
    let x = ratio(&mutex).expect("a ratio");
    out.push(Target {
        asked: "uncontended acquire+release p50 at most 1.3x the etcd Go Mutex's".into(),
        measured: format!(
            "{x}x ({} vs {} ms)",
            num(&cell(uncontended, "podlock")),
            num(&mutex)
        ),
        met: x.value <= 1.3,
    });
    out.push(fifo_wait(
        &cell("handoffs/s, 8 contenders", "podlock"),
        &cell("p99 wait, 8 contender(s)", "podlock"),
    ));
    for n in [8, 64] {
        let row = format!("etcd requests / watches created / watch events per grant, {n} contender(s)");
        let requests = num(&cell(&row, "podlock"));
        out.push(Target {
            asked: format!("at most 2.1 etcd requests per grant, {n} contender(s)"),
            measured: requests.to_string(),
            met: requests.value <= 2.1,
        });
    }
    let mut lines = vec![
        "| target (issue #28) | this run | met |".to_string(),
        "|---|---|---|".into(),
    ];
    lines.extend(out.iter().map(|t| {
        let met = if t.met { "yes" } else { "no" };
        format!("| {} | {} | {met} |", t.asked, t.measured)
    }));
    lines.join("\n")
}

/// p99 wait at 8 contenders against twice what FIFO order predicts: a waiter waits for the
/// other contenders' holds, about 8 handoffs at the run's rate.
fn fifo_wait(rate: &str, p99: &str) -> Target {
    let rate = first(rate).expect("a rate").value;
    let p99 = first(p99).expect("a wait");
    let fifo = 8.0 / rate.max(1e-9) * 1000.0;
    Target {
        asked:
            "p99 wait at 8 contenders at most twice what FIFO order predicts (8 handoffs at the run's rate)"
                .into(),
        measured: format!(
            "{p99} ms; FIFO predicts {fifo:.1} ms, target {:.1} ms",
            2.0 * fifo
        ),
        met: p99.value <= 2.0 * fifo,
    }
}
