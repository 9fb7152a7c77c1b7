//! Every measured figure of the benchmarks has one source: the results file its benchmark writes
//! (bench/results/handoff.md, scale.md; see tests/common/results). These tests check that the
//! docs (README.md, bench/README.md, docs/*.md) agree with it:
//!
//! * a doc's quote of a results block (between its markers) is that block, verbatim;
//! * a results file's derived blocks (side by side, targets) follow its own table;
//! * a table row of a doc named as a row of a results table (or by the start of its name) states
//!   the same first figure in every column the two tables share;
//! * prose states each wired figure as the results do (rounded to the decimals it gives), in the
//!   forms [`prose::forms`] lists: handoffs/s and the ratio to etcd's Go Mutex at 8 and 64 contenders,
//!   etcd requests per grant, the uncontended p50 and its ratio, the handoff after a Pod's
//!   deletion on a lost node, `podlock lock` against `etcdctl lock`, and the status lag;
//! * in docs/operations.md, docs/design.md and docs/comparison.md, every figure with a unit in a
//!   clause that cites a benchmark or states memory measured is a figure of the results files
//!   ([`sourced`]): a hand copy that drifted, or an older run's figure, fails.
//!
//! Text between `<!-- earlier runs: ... -->` and `<!-- end of earlier runs -->` is skipped: it
//! records older runs (each figure beside the run it names), not the latest.

mod prose;
mod sourced;

use crate::common::results::handoff;
use crate::common::results::table::{Figure, Table, figures, first, ratio};
use crate::common::results::{self, quotes};
use prose::Findings;

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

    /// p50 and p99 of the handoff after a lost node's Pod is deleted.
    fn pod_deleted(&self) -> [Figure; 2] {
        let f = figures(self.cell(POD_DELETED, "podlock"));
        [f[0], f[1]]
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
    fn status_lag(&self) -> [Figure; 2] {
        let cell = (self.scale.cell(STATUS_LAG, "podlock")).expect("a status lag row in scale.md");
        let f = figures(cell);
        [f[0], f[1]]
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

/// What the checks find in `doc` (its text).
fn check(r: &Results, doc: &str) -> Findings {
    let text = checked_text(doc);
    let mut found = Findings::default();
    for table in Table::all(&text) {
        table_rows(r, &table, &mut found);
    }
    let forms = prose::forms();
    for clause in clauses(&text) {
        for (pattern, check) in &forms {
            for c in pattern.captures_iter(&clause) {
                check(r, &c, &clause, &mut found);
            }
        }
    }
    found
}

/// Where `doc` disagrees with the results.
fn disagreements(r: &Results, doc: &str) -> Vec<String> {
    check(r, doc).wrong
}

/// A doc table's rows named as a results table's rows (or by the start of such a name): the
/// first figure of every column the two share must agree.
fn table_rows(r: &Results, doc: &Table, found: &mut Findings) {
    let plain = |s: &str| s.replace('`', "");
    for results in [&r.handoff, &r.scale] {
        for row in &doc.rows {
            let name = plain(&row[0]);
            let named = |t: &&Vec<String>| {
                let t = plain(&t[0]);
                t == name || t.starts_with(&format!("{name} "))
            };
            let Some(theirs) = results.rows.iter().find(named) else {
                continue;
            };
            for (i, column) in doc.header.iter().enumerate().skip(1) {
                let Some(j) = results.header.iter().position(|h| plain(h) == plain(column)) else {
                    continue;
                };
                let (Some(stated), Some(expected)) = (row.get(i), first(&theirs[j])) else {
                    continue;
                };
                let what = format!("table row {} / {column}", row[0]);
                found.expect(&what, stated, &[expected], &row.join(" | "));
            }
        }
    }
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

/// What a full run does to the docs (`results::Run::write`): each quote takes the results
/// file's new block, and nothing else changes.
#[test]
fn a_full_run_rewrites_each_quote_and_nothing_else() {
    let file = results::path("handoff");
    let text = results::read(&file);
    let old = results::block(&text, "side-by-side").unwrap();
    let new_block = "| measurement | podlock |\n|---|---|\n| handoffs/s, 8 contenders | 1 |";
    let new = text.replace(old, new_block);
    for doc in ["README.md", "docs/comparison.md"] {
        let before = results::read(doc);
        let after = results::refresh(&before, &file, &new);
        assert!(
            after.contains(new_block) && !after.contains(old),
            "{doc}: not rewritten"
        );
        assert_eq!(
            results::refresh(&after, &file, &text),
            before,
            "{doc}: changed elsewhere"
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
    let (mut wrong, mut checked) = (vec![], 0);
    for doc in results::docs() {
        let found = check(&r, &results::read(&doc));
        checked += found.checked;
        wrong.extend(found.wrong.into_iter().map(|w| format!("{doc}: {w}")));
    }
    eprintln!("{checked} figures stated outside the quotes checked");
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
        let (x8, x64) = (shift(r.mutex_ratio("8")), shift(r.mutex_ratio("64")));
        let [q1, q8, q64] = ["1", "8", "64"].map(|n| shift(r.requests(n)));
        let (p50, x, lag, cli) = (shift(p50), shift(x), shift(lag), shift(cli));
        let (pod50, pod99) = (shift(pod[0]), shift(pod[1]));
        let handoff_row = shift(r.handoffs("64"));
        vec![
            format!("podlock makes {h8} handoffs/s with 8 contenders, {x8}x the Go Mutex's."),
            format!("It does {h64} at 64 contenders (handoffs: {x64}x the Mutex's)."),
            format!("Each grant costs {q8} etcd requests per grant at 8 contenders."),
            format!("etcd: {q1} requests per grant uncontended and {q8}-{q64} at 8 and 64 contenders."),
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
