//! The docs that quote benchmark figures by hand beside their own prose (docs/operations.md,
//! docs/design.md, docs/comparison.md) state each as the results files have it. The wired forms
//! of [`super::prose`] know a dozen figures by name; this check knows none by name, so a figure
//! copied from any row of any results file is covered, and so is one no results file has:
//!
//! * a *measurement clause* is a prose clause or table row (outside the quotes of results blocks
//!   and the earlier runs' records) that cites a benchmark (`cargo bench`, "benchmark",
//!   `bench/results`, `bench/README.md`), a row of a table whose introducing paragraph cites one,
//!   or a clause about memory measured (`rss`, or "memory" with a figure in MiB);
//! * in a measurement clause, every figure with a unit (ms, s, MiB; `1.47x` as a ratio; `A-B`,
//!   `A to B` and `A and B` before a unit give it to both) must be, rounded to the decimals it is
//!   stated with, a figure with that unit somewhere in `bench/results/*.md`'s tables (a
//!   measurement, or a setting the row names: `TTL 5 s`). A figure of an earlier run belongs
//!   between the earlier runs' markers, beside the run it names.
//!
//! Memory settings are written in Kubernetes' units (`64 Mi`), not as measurements (`MiB`).

use std::collections::BTreeMap;

use regex::Regex;

use super::checked_text;
use crate::common::results::table::{Figure, Table, figures};
use crate::common::results::{self};

/// The docs this check reads.
pub const DOCS: [&str; 3] = ["docs/operations.md", "docs/design.md", "docs/comparison.md"];

/// The benchmarks whose results files are read.
const BENCHES: [&str; 3] = ["handoff", "scale", "fence"];

/// Every figure with a unit in the results files' tables, by unit (`ms`, `s`, `mib`, `x`).
pub struct Known(BTreeMap<String, Vec<Figure>>);

impl Known {
    pub fn load() -> Self {
        let mut text = String::new();
        for bench in BENCHES {
            let file = results::read(&results::path(bench));
            for q in results::quotes(&file) {
                text += &file[q.text];
                text.push('\n');
            }
        }
        Known::from_text(&text)
    }

    /// The figures with units in `text`.
    pub fn from_text(text: &str) -> Self {
        let mut known: BTreeMap<String, Vec<Figure>> = BTreeMap::new();
        for (figure, unit) in with_units(&text.to_lowercase()) {
            known.entry(unit).or_default().push(figure);
        }
        Known(known)
    }

    fn has(&self, figure: Figure, unit: &str) -> bool {
        (self.0.get(unit)).is_some_and(|all| all.iter().any(|k| k.agrees(figure)))
    }
}

/// Each figure stated with a unit in `text` (lowercased), with its unit; a range or pair before
/// a unit (`137-194 mib`, `41.2 and 43.7 mib`) gives the unit to both.
fn with_units(text: &str) -> Vec<(Figure, String)> {
    let number = r"\d[\d,]*(?:\.\d+)?";
    let pattern = Regex::new(&format!(
        r"(?:^|[^\w.^])({number})(?:(?:[-–]| to | and )({number}))? ?(ms|s|mib)\b|(?:^|[^\w.^])(\d+\.\d+)x\b"
    ))
    .unwrap();
    let mut out = vec![];
    for c in pattern.captures_iter(text) {
        if let Some(ratio) = c.get(4) {
            out.extend(figures(ratio.as_str()).into_iter().map(|f| (f, "x".to_string())));
            continue;
        }
        let unit = c[3].to_string();
        for m in [c.get(1), c.get(2)].into_iter().flatten() {
            out.extend(figures(m.as_str()).into_iter().map(|f| (f, unit.clone())));
        }
    }
    out
}

/// Whether `text` (lowercased) cites a benchmark.
fn cites_a_benchmark(text: &str) -> bool {
    ["cargo bench", "benchmark", "bench/results", "bench/readme"]
        .iter()
        .any(|k| text.contains(k))
}

/// Whether a clause states memory measured.
fn about_memory(clause: &str) -> bool {
    clause.contains("rss") || (clause.contains("memory") && clause.contains("mib"))
}

/// The measurement clauses of `doc` (see the module's docs), lowercased.
pub fn measurement_clauses(doc: &str) -> Vec<String> {
    let text = checked_text(doc);
    let mut out = vec![];
    let mut intro = false;
    for paragraph in text.split("\n\n") {
        let is_table =
            !Table::all(paragraph).is_empty() && paragraph.lines().all(|l| l.trim_start().starts_with('|'));
        let rows_sourced = is_table && intro;
        if !is_table {
            intro = cites_a_benchmark(&paragraph.to_lowercase());
        }
        for clause in super::clauses(paragraph) {
            let row = clause.trim_start().starts_with('|');
            if (row && rows_sourced) || cites_a_benchmark(&clause) || about_memory(&clause) {
                out.push(clause);
            }
        }
    }
    out
}

/// Each figure of `doc`'s measurement clauses that no results file has, with its clause; and
/// how many were checked.
pub fn unsourced(known: &Known, doc: &str) -> (Vec<String>, usize) {
    let (mut wrong, mut checked) = (vec![], 0);
    for clause in measurement_clauses(doc) {
        for (figure, unit) in with_units(&clause) {
            checked += 1;
            if !known.has(figure, &unit) {
                wrong.push(format!(
                    "{figure} {unit}: in no results file, in: {}",
                    clause.trim()
                ));
            }
        }
    }
    (wrong, checked)
}

#[test]
fn every_benchmark_figure_of_operations_design_and_comparison_is_in_the_results() {
    let known = Known::load();
    let (mut wrong, mut checked) = (vec![], 0);
    for doc in DOCS {
        let (w, c) = unsourced(&known, &results::read(doc));
        checked += c;
        wrong.extend(w.into_iter().map(|w| format!("{doc}: {w}")));
    }
    eprintln!("{checked} benchmark figures in {DOCS:?} checked against bench/results");
    assert!(checked >= 10, "the check found only {checked} figures");
    assert!(
        wrong.is_empty(),
        "figures quoted from a benchmark that bench/results does not have (a copy that drifted, or \
         an earlier run's figure outside the earlier runs' markers):\n{}",
        wrong.join("\n")
    );
}

/// The check finds each way a copied figure goes stale: built from the results themselves, a
/// text with their figures passes and the same text with each figure off fails.
#[test]
fn the_sourced_check_finds_a_stale_copy_in_each_form() {
    let known = Known::load();
    let handoff = results::read(&results::path("handoff"));
    let scale = results::read(&results::path("scale"));
    let table = |text: &str| Table::parse(results::block(text, "table").unwrap()).unwrap();
    let (handoff, scale) = (table(&handoff), table(&scale));
    let cell = |t: &Table, row: &str| {
        let found = t.rows.iter().find(|r| r[0].starts_with(row));
        figures(&found.unwrap_or_else(|| panic!("no row {row}"))[1])
    };
    let killed = cell(&handoff, "failover: holder killed");
    let sidecar = cell(&handoff, "sidecar RSS")[0];
    let ready = cell(&scale, "operator RSS, locks Ready")[0];
    let end = cell(&scale, "operator RSS, at the end")[0];
    let off = |f: Figure| Figure {
        value: f.value + 10f64.powi(-(f.decimals as i32)) * 3.0,
        ..f
    };
    let texts = |shift: &dyn Fn(Figure) -> Figure| {
        let (k50, kmax) = (shift(killed[0]), shift(killed[1]));
        let (sidecar, ready, end) = (shift(sidecar), shift(ready), shift(end));
        vec![
            format!(
                "`cargo bench --bench handoff` measured the handoff: killed, {k50} s p50 / {kmax} s max."
            ),
            format!(
                "From the scale benchmark:\n\n| | measured |\n|---|---|\n| operator memory | RSS {ready} MiB Ready, {end} MiB at the end |"
            ),
            format!("The sidecar's RSS was {sidecar} MiB in the handoff run."),
            format!("The operator's memory was {ready} and {end} MiB."),
        ]
    };
    for (right, wrong) in texts(&|f| f).iter().zip(texts(&off)) {
        assert_eq!(unsourced(&known, right).0, Vec::<String>::new(), "{right}");
        assert!(!unsourced(&known, &wrong).0.is_empty(), "not found: {wrong}");
    }
    let slope = "Beyond 10,000 locks the operator's memory grows by about 25 MiB per 1,000 more.";
    assert!(!unsourced(&known, slope).0.is_empty(), "a figure no run printed");
    let setting = "The operator's memory: request 64 Mi, limit 512 Mi.";
    assert_eq!(
        unsourced(&known, setting),
        (vec![], 0),
        "settings are not measurements"
    );
    let earlier = format!(
        "{} -->\n{}\n{}",
        super::EARLIER.0,
        texts(&off).join("\n\n"),
        super::EARLIER.1
    );
    assert_eq!(
        unsourced(&known, &earlier).0,
        Vec::<String>::new(),
        "earlier runs are records"
    );
}
