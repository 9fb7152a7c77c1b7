//! The benchmarks' results files, `bench/results/NAME.md`: a full run of `cargo bench --bench
//! NAME` writes its file (the command, date, commit and machine at the top, then its tables,
//! each between markers) and refreshes every doc's quote of those tables. The docs test checks
//! each quote, and each figure the docs state, against the file. A `-- --quick` run writes
//! `NAME-quick.md` (ignored by git) and touches no doc: its figures are not to be quoted.

pub mod handoff;
pub mod table;

use std::ops::Range;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The results file of benchmark `bench`, from the repository root.
pub fn path(bench: &str) -> String {
    format!("bench/results/{bench}.md")
}

/// The line that opens block `block` of results file `file`, there and in every doc quoting it.
pub fn begin(file: &str, block: &str) -> String {
    format!("<!-- {file}: {block} -->")
}

/// The line that closes block `block`.
pub fn end(block: &str) -> String {
    format!("<!-- end: {block} -->")
}

/// A block of a results file, where it stands in a text (the results file or a doc quoting it).
pub struct Quote {
    /// The results file (`bench/results/handoff.md`) and the block's name.
    pub file: String,
    pub block: String,
    /// Where the block's text lies between its marker lines (without them).
    pub text: Range<usize>,
}

/// Every block in `text`: a line `<!-- bench/results/FILE.md: BLOCK -->` up to the line
/// `<!-- end: BLOCK -->`. Panics on a block left open, naming it.
pub fn quotes(text: &str) -> Vec<Quote> {
    let mut out = vec![];
    let mut at = 0;
    while let Some(found) = text[at..].find("<!-- bench/results/") {
        let start = at + found;
        let line_end = text[start..].find('\n').map_or(text.len(), |e| start + e);
        let marker = &text[start + 5..line_end];
        let (file, block) = marker
            .strip_suffix(" -->")
            .and_then(|m| m.split_once(": "))
            .unwrap_or_else(|| panic!("a malformed marker: {marker}"));
        let close = format!("\n{}", end(block));
        let stop = text[line_end..]
            .find(&close)
            .map(|e| line_end + e)
            .unwrap_or_else(|| panic!("block {file}: {block} is never closed ({})", end(block)));
        out.push(Quote {
            file: file.to_string(),
            block: block.to_string(),
            text: (line_end + 1).min(stop)..stop,
        });
        at = stop + close.len();
    }
    out
}

/// The text of block `name` in a results file's `results`.
pub fn block<'a>(results: &'a str, name: &str) -> Option<&'a str> {
    let q = quotes(results).into_iter().find(|q| q.block == name)?;
    Some(&results[q.text])
}

/// The docs that may quote results or state measured figures, from the repository root:
/// README.md, bench/README.md and docs/*.md.
pub fn docs() -> Vec<String> {
    let mut docs = vec!["README.md".to_string(), "bench/README.md".to_string()];
    docs.extend(docs_dir());
    docs
}

/// docs/*.md from the repository root, sorted.
pub fn docs_dir() -> Vec<String> {
    let mut docs: Vec<String> = std::fs::read_dir(format!("{ROOT}/docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    docs
}

/// `doc` with each of its quotes of results file `file` replaced by that file's block of the
/// same name, as `results` has it.
pub fn refresh(doc: &str, file: &str, results: &str) -> String {
    let mut out = doc.to_string();
    for q in quotes(doc).into_iter().rev().filter(|q| q.file == file) {
        let new = block(results, &q.block)
            .unwrap_or_else(|| panic!("a doc quotes block {} that {file} does not have", q.block));
        out.replace_range(q.text, new);
    }
    out
}

/// Reads a file of the repository.
pub fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{ROOT}/{path}")).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// What a results file says about where it was measured: cores, CPU model, memory and the
/// load average as the run started (this machine may be shared).
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = (cpuinfo.lines())
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, m)| m.trim())
        })
        .unwrap_or("CPU model unknown");
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib: f64 = (meminfo.lines())
        .find_map(|l| {
            l.strip_prefix("MemTotal:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0.0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().next().unwrap_or("?");
    format!(
        "{cores} cores ({model}), {:.1} GiB; load average {load} at the start",
        kib / 1024.0 / 1024.0
    )
}

/// The commit measured: `git rev-parse --short HEAD`, marked when the tree has changes.
fn commit() -> String {
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).current_dir(ROOT).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(changes) if !changes.is_empty() => format!("`{head}` with uncommitted changes"),
        _ => format!("`{head}`"),
    }
}

/// Now, as `2026-11-25 19:25 UTC`.
fn now() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{}-{:02}-{:02} {:02}:{:02} UTC",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute()
    )
}

/// One run's results: the facts of the run and its blocks (name, what it is, its text).
pub struct Run<'a> {
    pub bench: &'a str,
    pub quick: bool,
    /// The machine's facts, [`machine`] taken as the run started.
    pub machine: String,
    /// What else the run ran on (versions, sizes).
    pub setup: String,
    pub blocks: Vec<(&'a str, &'a str, String)>,
}

impl Run<'_> {
    /// Writes the results file (`NAME-quick.md` for a quick run) and, after a full run, every
    /// doc's quotes of it; returns the file's path.
    pub fn write(&self) -> String {
        let name = if self.quick {
            format!("{}-quick", self.bench)
        } else {
            self.bench.to_string()
        };
        let file = path(&name);
        let text = self.render(&file);
        std::fs::write(format!("{ROOT}/{file}"), &text).unwrap_or_else(|e| panic!("{file}: {e}"));
        if !self.quick {
            for doc in docs() {
                let before = read(&doc);
                let after = refresh(&before, &file, &text);
                if after != before {
                    std::fs::write(format!("{ROOT}/{doc}"), after).unwrap();
                }
            }
        }
        file
    }

    fn render(&self, file: &str) -> String {
        let command = match self.quick {
            true => format!("cargo bench --bench {} -- --quick", self.bench),
            false => format!("cargo bench --bench {}", self.bench),
        };
        let about = match self.quick {
            true => {
                "A quick run: a smoke test of the benchmark, not a measurement to quote; git ignores this file."
            }
            false => {
                "Written by the benchmark's latest full run, which also rewrote every doc's quote of the blocks below; the next full run rewrites them again. Do not edit by hand."
            }
        };
        let mut out = format!(
            "# `{command}`\n\n{about} What each row means and how it is measured: \
             [bench/README.md](../README.md).\n\n| | |\n|---|---|\n| command | `{command}` |\n\
             | date | {} |\n| commit | {} |\n| machine | {} |\n| setup | {} |\n",
            now(),
            commit(),
            self.machine,
            self.setup
        );
        for (name, about, text) in &self.blocks {
            out += &format!(
                "\n## {name}\n\n{about}\n\n{}\n{text}\n{}\n",
                begin(file, name),
                end(name)
            );
        }
        out
    }
}
