//! Every measured figure of the benchmarks has one source: the results file its benchmark writes
//! (bench/results/handoff.md, scale.md; see tests/common/results). These tests check that the
//! docs (README.md, bench/README.md, docs/*.md) agree with it:
//!
//! * a doc's quote of a results block (between its markers) is that block, verbatim;
//! * a results file's derived blocks (side by side, targets) follow its own table;
//! * a table row of a doc named as a row of a results table (or by the start of its name) states
//!   the same first figure in every column the two tables share;
//! * prose states each wired figure as the results do (rounded to the decimals it gives), in the
//!   forms [`checks`] lists: handoffs/s and the ratio to etcd's Go Mutex at 8 and 64 contenders,
//!   etcd requests per grant, the uncontended p50 and its ratio, the handoff after a Pod's
//!   deletion on a lost node, `podlock lock` against `etcdctl lock`, and the status lag.
//!
//! Text between `<!-- earlier runs: ... -->` and `<!-- end of earlier runs -->` is skipped: it
//! records older runs (each figure beside the run it names), not the latest.

use regex::{Captures, Regex};

use crate::common::results::handoff;
use crate::common::results::table::{Figure, Table, figures, first, ratio};
use crate::common::results::{self, quotes};

const EARLIER: (&str, &str) = ("<!-- earlier runs:", "<!-- end of earlier runs -->");

/// The results' figures: each results file's full table.
struct Results {
    handoff: Table,
    scale: Table,
}

const UNCONTENDED: &str = "uncontended acquire+release p50 / p99 (median of rounds)";
const POD_DELETED: &str = "failover: holder's node lost (SIGSTOP) and its Pod deleted, TTL 5 s";
const STATUS_LAG: &str = "status lag, grant to status (p50 / p99)";

impl Results {
    fn load() -> Self {
        let table = |bench: &str| {
            let text = results::read(&results::path(bench));
            let block = results::block(&text, "table").expect("a table block");
            Table::parse(block).expect("a table")
        };
        Results {
            handoff: table("handoff"),
            scale: table("scale"),
        }
    }

    fn cell(&self, row: &str, column: &str) -> &str {
        (self.handoff.cell(row, column)).unwrap_or_else(|| panic!("no {row} / {column} in handoff.md"))
    }

    fn handoffs(&self, n: &str) -> Figure {
        first(self.cell(&format!("handoffs/s, {n} contenders"), "podlock")).unwrap()
    }

    fn mutex_ratio(&self, n: &str) -> Figure {
        ratio(self.cell(&format!("handoffs/s, {n} contenders"), "etcd Go Mutex")).unwrap()
    }

    fn requests(&self, n: &str) -> Figure {
        let row = format!("etcd requests / watches created / watch events per grant, {n} contender(s)");
        first(self.cell(&row, "podlock")).unwrap()
    }

    /// podlock's and the Mutex's p50, and the ratio.
    fn uncontended(&self) -> [Figure; 3] {
        let mutex = self.cell(UNCONTENDED, "etcd Go Mutex");
        let podlock = first(self.cell(UNCONTENDED, "podlock")).unwrap();
        [podlock, first(mutex).unwrap(), ratio(mutex).unwrap()]
    }

    fn pod_deleted(&self) -> Vec<Figure> {
        figures(self.cell(POD_DELETED, "podlock"))[..2].to_vec()
    }

    /// `podlock lock` / `etcdctl lock` at 1 and 8 loops: the ratios, podlock's and etcdctl's rates.
    fn cli(&self) -> [Vec<Figure>; 3] {
        let rows = ["1", "8"].map(|n| format!("shell: `LOCKCLI NAME -- true` cycles/s, {n} loop(s)"));
        let of = |column: &str, f: fn(&str) -> Option<Figure>| {
            rows.iter().map(|r| f(self.cell(r, column)).unwrap()).collect()
        };
        [
            of("etcdctl lock", ratio),
            of("podlock", first),
            of("etcdctl lock", first),
        ]
    }

    /// The status lag's p50 and p99, in ms.
    fn status_lag(&self) -> Vec<Figure> {
        let cell = self
            .scale
            .cell(STATUS_LAG, "podlock")
            .expect("a status lag row in scale.md");
        figures(cell)[..2].to_vec()
    }
}

/// `text` without the quotes of results blocks and the earlier runs' records, each replaced by
/// a paragraph break.
fn checked_text(text: &str) -> String {
    let mut out = text.to_string();
    for q in quotes(text).into_iter().rev() {
        out.replace_range(q.text, "\n");
    }
    while let Some(start) = out.find(EARLIER.0) {
        let stop = (out[start..].find(EARLIER.1))
            .map(|e| start + e + EARLIER.1.len())
            .unwrap_or_else(|| panic!("earlier runs opened and never closed ({})", EARLIER.1));
        out.replace_range(start..stop, "\n\n");
    }
    out
}

/// The clauses of `text`, lowercased, whitespace collapsed: each table row is one; prose is cut
/// at paragraph breaks, semicolons and the ends of sentences.
fn clauses(text: &str) -> Vec<String> {
    let mut out = vec![];
    for paragraph in text.split("\n\n") {
        let (rows, prose): (Vec<&str>, Vec<&str>) =
            paragraph.lines().partition(|l| l.trim_start().starts_with('|'));
        out.extend(rows.iter().map(|r| r.to_lowercase()));
        let prose = prose.join(" ").split_whitespace().collect::<Vec<_>>().join(" ");
        let mut clause = String::new();
        let chars: Vec<char> = prose.chars().collect();
        for (i, &c) in chars.iter().enumerate() {
            clause.push(c);
            let sentence_end = c == '.'
                && chars.get(i + 1) == Some(&' ')
                && chars
                    .get(i + 2)
                    .is_some_and(|n| n.is_uppercase() || "*(`".contains(*n));
            if c == ';' || sentence_end {
                out.push(std::mem::take(&mut clause).to_lowercase());
            }
        }
        out.push(clause.to_lowercase());
    }
    out.retain(|c| !c.trim().is_empty());
    out
}

/// What a doc states, and what the results say it should.
struct Wrong(String);

/// Checks `stated` against `expected`: a disagreement is recorded with the clause.
fn expect(wrong: &mut Vec<Wrong>, what: &str, stated: &str, expected: &[Figure], clause: &str) {
    let Some(s) = first(stated) else { return };
    if !expected.iter().any(|e| e.agrees(s)) {
        let expected: Vec<String> = expected.iter().map(Figure::to_string).collect();
        wrong.push(Wrong(format!(
            "{what}: states {s}, the results say {}, in: {clause}",
            expected.join(" or ")
        )));
    }
}

/// The contender count a clause (or the text just before a match) is about: the one count of
/// the results' rows (8 or 64) it names, if it names exactly one.
fn contenders(text: &str) -> Option<&'static str> {
    let named: Vec<&str> = ["8", "64"]
        .into_iter()
        .filter(|n| Regex::new(&format!(r"\b{n} contenders")).unwrap().is_match(text))
        .collect();
    (named.len() == 1).then(|| named[0])
}

/// What a ratio at `at` in `clause` is about: `uncontended`, or the contender count ("8",
/// "64"), whichever the clause last named before it (else the one it names after it).
fn subject(clause: &str, at: usize) -> Option<&'static str> {
    let named = |text: &str| {
        let mut named: Vec<(usize, &'static str)> = ["uncontended", "8 contenders", "64 contenders"]
            .into_iter()
            .filter_map(|k| {
                Some((
                    Regex::new(&format!(r"\b{k}"))
                        .unwrap()
                        .find_iter(text)
                        .last()?
                        .start(),
                    k,
                ))
            })
            .collect();
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

/// Whether the words before a match make it a target, not a measurement.
fn a_target(clause: &str, at: usize) -> bool {
    let before = &clause[clause[..at].char_indices().rev().nth(14).map_or(0, |(i, _)| i)..at];
    ["least", "within", "target", "asked", "most", "≤", "≥"]
        .iter()
        .any(|w| before.contains(w))
}

/// Every rule over one clause: (pattern, what to check for each match).
type Check = fn(&Results, &Captures, &str, &mut Vec<Wrong>);

/// The prose forms checked: a pattern, and how its match must agree with the results.
fn checks() -> Vec<(&'static str, Check)> {
    vec![
        (
            r"(\d[\d,]*) handoffs/s (?:with|at) (\d+) contenders",
            |r, c, clause, w| {
                if ["8", "64"].contains(&&c[2]) {
                    expect(
                        w,
                        &format!("handoffs/s at {}", &c[2]),
                        &c[1],
                        &[r.handoffs(&c[2])],
                        clause,
                    );
                }
            },
        ),
        (
            r"(?:^|[^\d.])(\d[\d,]*) at (\d+) contenders",
            |r, c, clause, w| {
                if clause.contains("handoffs") && ["8", "64"].contains(&&c[2]) {
                    expect(
                        w,
                        &format!("handoffs/s at {}", &c[2]),
                        &c[1],
                        &[r.handoffs(&c[2])],
                        clause,
                    );
                }
            },
        ),
        (
            r"(\d+\.\d+)x (?:as often as |slower than |faster than |the |of )*(?:etcd's |the |go )*mutex",
            |r, c, clause, w| {
                let at = c.get(0).unwrap().start();
                if a_target(clause, at) {
                    return;
                }
                match subject(clause, at) {
                    Some("uncontended") => expect(
                        w,
                        "uncontended p50, x the Mutex's",
                        &c[1],
                        &[r.uncontended()[2]],
                        clause,
                    ),
                    Some(n) => expect(
                        w,
                        &format!("handoffs at {n}, x the Mutex's"),
                        &c[1],
                        &[r.mutex_ratio(n)],
                        clause,
                    ),
                    None => {}
                }
            },
        ),
        (
            r"(\d+\.\d+)(?:[-–](\d+\.\d+))? (?:etcd )?requests per grant(.{0,40})",
            |r, c, clause, w| {
                if clause.contains("waiters") {
                    return; // the scale benchmark's queue, not a figure wired here
                }
                let after = &c[3];
                let all = ["1", "8", "64"].map(|n| r.requests(n));
                let expected = if after.trim_start().starts_with("uncontended") {
                    vec![all[0]]
                } else if let Some(n) = contenders(after) {
                    vec![r.requests(n)]
                } else {
                    all.to_vec()
                };
                expect(w, "etcd requests per grant", &c[1], &expected, clause);
                if let Some(high) = c.get(2) {
                    expect(w, "etcd requests per grant", high.as_str(), &all, clause);
                }
            },
        ),
        (r"\((\d+\.\d+) vs (\d+\.\d+) ms", |r, c, clause, w| {
            if clause.contains("uncontended") {
                let [podlock, mutex, _] = r.uncontended();
                expect(w, "uncontended p50", &c[1], &[podlock], clause);
                expect(w, "the Mutex's uncontended p50", &c[2], &[mutex], clause);
            }
        }),
        (
            r"(\d+) ms (?:\(?p50\)?)[ ,/]+(\d+) ms (?:\(?p99\)?)",
            |r, c, clause, w| {
                let lost_node = ["node lost", "lost node", "sigstop", "frozen"]
                    .iter()
                    .any(|k| clause.contains(k));
                if lost_node && clause.contains("deleted") {
                    let [p50, p99] = [r.pod_deleted()[0], r.pod_deleted()[1]];
                    expect(
                        w,
                        "handoff after a lost node's Pod deleted, p50",
                        &c[1],
                        &[p50],
                        clause,
                    );
                    expect(
                        w,
                        "handoff after a lost node's Pod deleted, p99",
                        &c[2],
                        &[p99],
                        clause,
                    );
                }
            },
        ),
        (r"(\d+\.\d+)(?: to |[-–])?(\d+\.\d+)?x", |r, c, clause, w| {
            if clause.contains("podlock lock") && clause.contains("etcdctl lock") {
                let ratios = &r.cli()[0];
                expect(w, "podlock lock against etcdctl lock", &c[1], ratios, clause);
                if let Some(high) = c.get(2) {
                    expect(
                        w,
                        "podlock lock against etcdctl lock",
                        high.as_str(),
                        ratios,
                        clause,
                    );
                }
            }
        }),
        (r"(\d+) \(`(podlock|etcdctl) lock`\)", |r, c, clause, w| {
            if clause.contains("cycles") {
                let [_, podlock, etcdctl] = r.cli();
                let rates = if &c[2] == "podlock" { podlock } else { etcdctl };
                expect(w, &format!("{} lock cycles/s", &c[2]), &c[1], &rates, clause);
            }
        }),
        (
            r"p99(?: lag)?(?: of| was| at| is)? (\d[\d,]*(?:\.\d+)?) (ms|s)\b",
            status_lag,
        ),
        (r"(\d[\d,]*(?:\.\d+)?) (ms|s) p99", status_lag),
    ]
}

/// The status lag's p99, where a clause about the status lag states it.
fn status_lag(r: &Results, c: &Captures, clause: &str, w: &mut Vec<Wrong>) {
    let at = c.get(0).unwrap().start();
    if clause.contains("status lag") && !a_target(clause, at) {
        let ms = in_ms(&c[1], &c[2]);
        expect(w, "status lag p99", &ms, &[r.status_lag()[1]], clause);
    }
}

/// A stated duration in ms, keeping the decimals it was stated with (`1.06 s` → `1060`).
fn in_ms(value: &str, unit: &str) -> String {
    match (unit, first(value)) {
        ("s", Some(f)) => format!("{:.*}", f.decimals.saturating_sub(3), f.value * 1000.0),
        _ => value.replace(',', ""),
    }
}

/// Where `doc` (its text; `name` for messages) disagrees with the results.
fn disagreements(r: &Results, doc: &str) -> Vec<String> {
    let text = checked_text(doc);
    let mut wrong = vec![];
    for table in Table::all(&text) {
        wrong.extend(table_rows(r, &table));
    }
    let checks: Vec<(Regex, Check)> = checks()
        .into_iter()
        .map(|(p, f)| (Regex::new(p).unwrap(), f))
        .collect();
    for clause in clauses(&text) {
        for (pattern, check) in &checks {
            for c in pattern.captures_iter(&clause) {
                check(r, &c, &clause, &mut wrong);
            }
        }
    }
    wrong.into_iter().map(|Wrong(w)| w).collect()
}

/// A doc table's rows named as a results table's rows: the first figure of every column the two
/// share must agree.
fn table_rows(r: &Results, doc: &Table) -> Vec<Wrong> {
    let plain = |s: &str| s.replace('`', "");
    let mut wrong = vec![];
    for results in [&r.handoff, &r.scale] {
        for row in &doc.rows {
            let name = plain(&row[0]);
            let Some(theirs) = results.rows.iter().find(|t| {
                let t = plain(&t[0]);
                t == name || t.starts_with(&format!("{name} "))
            }) else {
                continue;
            };
            for (i, column) in doc.header.iter().enumerate().skip(1) {
                let Some(j) = results.header.iter().position(|h| plain(h) == plain(column)) else {
                    continue;
                };
                let (Some(stated), Some(expected)) = (row.get(i).and_then(|c| first(c)), first(&theirs[j]))
                else {
                    continue;
                };
                if !expected.agrees(stated) {
                    wrong.push(Wrong(format!(
                        "table row {} / {column}: states {stated}, the results say {expected}",
                        row[0]
                    )));
                }
            }
        }
    }
    wrong
}

#[test]
fn every_quote_of_a_results_block_is_that_block_verbatim() {
    let mut quoted = vec![];
    for doc in results::docs() {
        let text = results::read(&doc);
        for q in quotes(&text) {
            let source = results::read(&q.file);
            let block = results::block(&source, &q.block)
                .unwrap_or_else(|| panic!("{doc} quotes {}: {}, which it lacks", q.file, q.block));
            assert_eq!(
                &text[q.text], block,
                "{doc}'s quote of {}: {} differs: a full run of its benchmark rewrites both",
                q.file, q.block
            );
            quoted.push(format!("{doc} <- {}: {}", q.file, q.block));
        }
    }
    for wired in [
        "README.md <- bench/results/handoff.md: side-by-side",
        "docs/comparison.md <- bench/results/handoff.md: side-by-side",
        "bench/README.md <- bench/results/handoff.md: targets",
    ] {
        assert!(
            quoted.iter().any(|q| q == wired),
            "no quote {wired}; quotes: {quoted:#?}"
        );
    }
}

#[test]
fn the_derived_blocks_of_handoff_md_follow_its_table() {
    let text = results::read(&results::path("handoff"));
    let table = results::block(&text, "table").unwrap();
    for (name, derived) in [
        ("side-by-side", handoff::side_by_side(table)),
        ("targets", handoff::targets(table)),
    ] {
        assert_eq!(
            results::block(&text, name),
            Some(derived.as_str()),
            "block {name}"
        );
    }
}

#[test]
fn no_doc_states_a_figure_that_disagrees_with_the_results() {
    let r = Results::load();
    let mut wrong = vec![];
    for doc in results::docs() {
        let found = disagreements(&r, &results::read(&doc));
        wrong.extend(found.into_iter().map(|w| format!("{doc}: {w}")));
    }
    assert!(
        wrong.is_empty(),
        "docs disagree with bench/results:\n{}",
        wrong.join("\n")
    );
}

/// The check finds a figure off from the results in each form it knows (built from the results,
/// so it holds after every run), and passes the same text with the results' own figures.
#[test]
fn the_check_finds_each_form_of_a_stale_figure() {
    let r = Results::load();
    let off = |f: Figure| Figure {
        value: f.value * 1.5 + 1.0,
        ..f
    };
    let [p50, mutex_p50, x] = r.uncontended();
    let lag = r.status_lag()[1];
    let (pod, cli) = (r.pod_deleted(), r.cli()[0][0]);
    let text = |shift: &dyn Fn(Figure) -> Figure| {
        let h8 = shift(r.handoffs("8"));
        let h64 = shift(r.handoffs("64"));
        let (x8, x64, q8) = (
            shift(r.mutex_ratio("8")),
            shift(r.mutex_ratio("64")),
            shift(r.requests("8")),
        );
        let (p50, x, lag, cli) = (shift(p50), shift(x), shift(lag), shift(cli));
        let (pod50, pod99) = (shift(pod[0]), shift(pod[1]));
        let handoff_row = shift(r.handoffs("64"));
        vec![
            format!("podlock makes {h8} handoffs/s with 8 contenders, {x8}x the Go Mutex's."),
            format!("It does {h64} at 64 contenders (handoffs: {x64}x the Mutex's)."),
            format!("Each grant costs {q8} etcd requests per grant at 8 contenders."),
            format!("Uncontended, podlock is {x}x slower than the Go Mutex ({p50} vs {mutex_p50} ms)."),
            format!("The holder's Pod deleted (node lost): next holder in {pod50} ms p50 / {pod99} ms p99."),
            format!("`podlock lock -- true` makes {cli}x the cycles of `etcdctl lock -- true`."),
            format!("The status lag p99 was {lag} ms."),
            format!("| measurement | podlock |\n|---|---|\n| handoffs/s, 64 contenders | {handoff_row} |"),
        ]
    };
    for (right, wrong) in text(&|f| f).iter().zip(text(&off)) {
        assert_eq!(
            disagreements(&r, right),
            Vec::<String>::new(),
            "the results' own figures"
        );
        assert!(!disagreements(&r, &wrong).is_empty(), "not found: {wrong}");
    }
    let earlier = format!("{} -->\n{}\n{}", EARLIER.0, text(&off).join("\n\n"), EARLIER.1);
    assert!(disagreements(&r, &earlier).is_empty(), "earlier runs are records");
}
