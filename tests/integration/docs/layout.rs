//! docs/design.md's module table ("Every file") names every source file under src/, and every
//! file it names exists: a file moved, renamed or added without its row fails here.

use std::collections::BTreeSet;

use super::{ROOT, read};

/// The `.rs` files under `dir` (a path from the crate's root), as paths from that root.
fn sources(dir: &str, found: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(format!("{ROOT}/{dir}")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let path = format!("{dir}/{name}");
        if std::fs::metadata(format!("{ROOT}/{path}")).unwrap().is_dir() {
            sources(&path, found);
        } else if name.ends_with(".rs") {
            found.insert(path);
        }
    }
}

/// The paths of `.rs` files that the rows of the table under "### Every file" name, each in
/// backquotes.
fn named(design: &str) -> BTreeSet<String> {
    let after = design
        .split("\n### Every file\n")
        .nth(1)
        .expect("a section \"Every file\"");
    let rows = after.lines().skip_while(|l| !l.starts_with('|'));
    let rows = rows.take_while(|l| l.starts_with('|'));
    let quoted = rows.flat_map(|row| row.split('`').skip(1).step_by(2).collect::<Vec<_>>());
    let paths = quoted.filter(|q| q.starts_with("src/") && q.ends_with(".rs"));
    paths.map(str::to_string).collect()
}

/// What is wrong with a table naming `named`, for a tree of `files`.
fn faults(named: &BTreeSet<String>, files: &BTreeSet<String>) -> Vec<String> {
    let missing = files
        .difference(named)
        .map(|f| format!("{f}: no row in the module table"));
    let gone = named
        .difference(files)
        .map(|f| format!("{f}: a row names it, but it is gone"));
    missing.chain(gone).collect()
}

#[test]
fn the_module_table_names_every_source_file() {
    let mut files = BTreeSet::new();
    sources("src", &mut files);
    let faults = faults(&named(&read("docs/design.md")), &files);
    assert!(
        faults.is_empty(),
        "docs/design.md, \"Every file\":\n{}",
        faults.join("\n")
    );
}

#[test]
fn the_table_check_finds_a_missing_row_and_a_row_for_a_file_that_is_gone() {
    let design = "## Shape\n\n### Every file\n\nIntro.\n\n| module | owns |\n|---|---|\n\
        | `src/a.rs`, `src/b/c.rs` | a, and `c.rs`'s `C` |\n| `src/gone.rs` | old |\n\n\
        Prose naming `src/prose.rs`.\n";
    let named = named(design);
    let want: BTreeSet<String> = ["src/a.rs", "src/b/c.rs", "src/gone.rs"].map(String::from).into();
    assert_eq!(named, want);
    let files: BTreeSet<String> = ["src/a.rs", "src/b/c.rs", "src/new.rs"].map(String::from).into();
    assert_eq!(
        faults(&named, &files),
        [
            "src/new.rs: no row in the module table",
            "src/gone.rs: a row names it, but it is gone"
        ]
    );
}
