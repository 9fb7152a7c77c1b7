//! The prose forms in which the docs state a wired figure, and how each must agree with the
//! results. A clause is lowercased, its whitespace collapsed (see `clauses`).

use regex::{Captures, Regex};

use super::Results;
use crate::common::results::table::{Figure, first};

/// What the checks found in a text: each disagreement, and how many figures were checked.
#[derive(Default)]
pub struct Findings {
    pub wrong: Vec<String>,
    pub checked: usize,
}

impl Findings {
    /// Checks the figure `stated` states against `expected` (any of them), naming `what`.
    pub fn expect(&mut self, what: &str, stated: &str, expected: &[Figure], clause: &str) {
        let Some(s) = first(stated) else { return };
        self.checked += 1;
        if !expected.iter().any(|e| e.agrees(s)) {
            let expected: Vec<String> = expected.iter().map(Figure::to_string).collect();
            self.wrong.push(format!(
                "{what}: states {s}, the results say {}, in: {clause}",
                expected.join(" or ")
            ));
        }
    }
}

/// One form: what to do with each match of its pattern in a clause.
type Check = fn(&Results, &Captures, &str, &mut Findings);

/// The forms checked, each a pattern and its check.
pub fn forms() -> Vec<(Regex, Check)> {
    let forms: [(&str, Check); 11] = [
        (r"(\d[\d,]*) handoffs/s (?:with|at) (\d+) contenders", handoffs),
        (r"(?:^|[^\d.])(\d[\d,]*) at (\d+) contenders", handoffs_at),
        (
            r"(\d+\.\d+)x (?:as often as |slower than |faster than |the |of )*(?:etcd's |the |go )*mutex",
            mutex_ratio,
        ),
        (
            r"(\d+\.\d+)(?:[-–](\d+\.\d+))? (?:etcd )?requests per grant(.{0,40})",
            requests,
        ),
        (r"(\d+\.\d+)[-–](\d+\.\d+) at 8 and 64 contenders", requests_range),
        (r"\((\d+\.\d+) vs (\d+\.\d+) ms", uncontended_p50),
        (r"(\d+) ms \(?p50\)?[ ,/]+(\d+) ms \(?p99\)?", pod_deleted),
        (r"(\d+\.\d+)(?: to |[-–])?(\d+\.\d+)?x", cli_ratio),
        (r"(\d+) \(`(podlock|etcdctl) lock`\)", cli_rate),
        (
            r"p99(?: lag)?(?: of| was| at| is)? (\d[\d,]*(?:\.\d+)?) (ms|s)\b",
            status_lag,
        ),
        (r"(\d[\d,]*(?:\.\d+)?) (ms|s) p99", status_lag),
    ];
    forms
        .into_iter()
        .map(|(p, check)| (Regex::new(p).unwrap(), check))
        .collect()
}

/// `N handoffs/s with|at C contenders`: podlock's handoffs at C.
fn handoffs(r: &Results, c: &Captures, clause: &str, f: &mut Findings) {
    if let Some(n) = ["8", "64"].into_iter().find(|n| *n == &c[2]) {
        f.expect(&format!("handoffs/s at {n}"), &c[1], &[r.handoffs(n)], clause);
    }
}

/// `N at C contenders` in a clause about handoffs.
fn handoffs_at(r: &Results, c: &Captures, clause: &str, f: &mut Findings) {
    if clause.contains("handoffs") {
        handoffs(r, c, clause, f);
    }
}

/// `R x the Go Mutex('s)`: uncontended or at 8 or 64 contenders, whichever the clause is about.
fn mutex_ratio(r: &Results, c: &Captures, clause: &str, f: &mut Findings) {
    let at = c.get(0).unwrap().start();
    if a_target(clause, at) {
        return;
    }
    match subject(clause, at) {
        Some("uncontended") => {
            let x = r.uncontended()[2];
            f.expect("uncontended p50, x the Mutex's", &c[1], &[x], clause);
        }
        Some(n) => {
            let what = format!("handoffs at {n}, x the Mutex's");
            f.expect(&what, &c[1], &[r.mutex_ratio(n)], clause);
        }
        None => {}
    }
}

/// `N (or N-M) etcd requests per grant`, uncontended or at C contenders if it says so right
/// after, else any of the results' counts (not the scale benchmark's queue of waiters).
fn requests(r: &Results, c: &Captures, clause: &str, f: &mut Findings) {
    let after = &c[3];
    if after.contains("waiters") {
        return;
    }
    let all = ["1", "8", "64"].map(|n| r.requests(n));
    let expected = if after.trim_start().starts_with("uncontended") {
        vec![all[0]]
    } else if let Some(n) = contenders(after) {
        vec![r.requests(n)]
    } else {
        all.to_vec()
    };
    f.expect("etcd requests per grant", &c[1], &expected, clause);
    if let Some(high) = c.get(2) {
        f.expect("etcd requests per grant", high.as_str(), &all, clause);
    }
}

/// `A-B at 8 and 64 contenders` in a clause about etcd requests per grant.
fn requests_range(r: &Results, c: &Captures, clause: &str, f: &mut Findings) {
    if clause.contains("requests per grant") {
        f.expect("etcd requests per grant at 8", &c[1], &[r.requests("8")], clause);
        f.expect(
            "etcd requests per grant at 64",
            &c[2],
            &[r.requests("64")],
            clause,
        );
    }
}

/// `(P vs M ms` in a clause about the uncontended cycle: podlock's and the Mutex's p50.
fn uncontended_p50(r: &Results, c: &Captures, clause: &str, f: &mut Findings) {
    if clause.contains("uncontended") {
        let [podlock, mutex, _] = r.uncontended();
        f.expect("uncontended p50", &c[1], &[podlock], clause);
        f.expect("the Mutex's uncontended p50", &c[2], &[mutex], clause);
    }
}

/// `A ms p50 / B ms p99` in a clause about a lost node's Pod deleted.
fn pod_deleted(r: &Results, c: &Captures, clause: &str, f: &mut Findings) {
    let lost = ["node lost", "lost node", "sigstop", "frozen"];
    if clause.contains("deleted") && lost.iter().any(|k| clause.contains(k)) {
        let [p50, p99] = r.pod_deleted();
        f.expect(
            "handoff after a lost node's Pod deleted, p50",
            &c[1],
            &[p50],
            clause,
        );
        f.expect(
            "handoff after a lost node's Pod deleted, p99",
            &c[2],
            &[p99],
            clause,
        );
    }
}

/// `R x` (or `R to S x`) in a clause that compares `podlock lock` and `etcdctl lock`.
fn cli_ratio(r: &Results, c: &Captures, clause: &str, f: &mut Findings) {
    if clause.contains("podlock lock") && clause.contains("etcdctl lock") {
        let ratios = &r.cli()[0];
        f.expect("podlock lock against etcdctl lock", &c[1], ratios, clause);
        if let Some(high) = c.get(2) {
            f.expect("podlock lock against etcdctl lock", high.as_str(), ratios, clause);
        }
    }
}

/// `N (`podlock lock`)` or `N (`etcdctl lock`)` in a clause about cycles.
fn cli_rate(r: &Results, c: &Captures, clause: &str, f: &mut Findings) {
    if clause.contains("cycles") {
        let [_, podlock, etcdctl] = r.cli();
        let rates = if &c[2] == "podlock" { podlock } else { etcdctl };
        f.expect(&format!("{} lock cycles/s", &c[2]), &c[1], &rates, clause);
    }
}

/// The status lag's p99, in a clause about the status lag.
fn status_lag(r: &Results, c: &Captures, clause: &str, f: &mut Findings) {
    let at = c.get(0).unwrap().start();
    if clause.contains("status lag") && !a_target(clause, at) {
        let ms = in_ms(&c[1], &c[2]);
        f.expect("status lag p99", &ms, &[r.status_lag()[1]], clause);
    }
}

/// A stated duration in ms, keeping the precision it was stated with (`1.06 s` → `1060`).
fn in_ms(value: &str, unit: &str) -> String {
    match (unit, first(value)) {
        ("s", Some(f)) => format!("{:.*}", f.decimals.saturating_sub(3), f.value * 1000.0),
        _ => value.replace(',', ""),
    }
}

/// The contender count `text` is about: the one count of the results' rows (8 or 64) it names,
/// if it names exactly one.
fn contenders(text: &str) -> Option<&'static str> {
    let named: Vec<&str> = ["8", "64"]
        .into_iter()
        .filter(|n| Regex::new(&format!(r"\b{n} contenders")).unwrap().is_match(text))
        .collect();
    (named.len() == 1).then(|| named[0])
}

/// What a ratio at `at` in `clause` is about: "uncontended", or the contender count ("8",
/// "64"), whichever the clause last named before it (else the one it names after it, if one).
fn subject(clause: &str, at: usize) -> Option<&'static str> {
    let named = |text: &str| {
        let keys = ["uncontended", "8 contenders", "64 contenders"];
        let last = |k: &'static str| {
            let pattern = Regex::new(&format!(r"\b{k}")).unwrap();
            Some((pattern.find_iter(text).last()?.start(), k))
        };
        let mut named: Vec<(usize, &'static str)> = keys.into_iter().filter_map(last).collect();
        named.sort();
        named
    };
    let before = named(&clause[..at]);
    let (_, k) = before.last().copied().or_else(|| {
        let after = named(&clause[at..]);
        (after.len() == 1).then(|| after[0])
    })?;
    Some(k.trim_end_matches(" contenders"))
}

/// Whether the words just before a match make it a target, not a measurement.
fn a_target(clause: &str, at: usize) -> bool {
    let from = clause[..at].char_indices().rev().nth(14).map_or(0, |(i, _)| i);
    let before = &clause[from..at];
    ["least", "within", "target", "asked", "most", "≤", "≥"]
        .iter()
        .any(|w| before.contains(w))
}
