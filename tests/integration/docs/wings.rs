//! docs/design.md's wing table ("The engine's wings") holds the engine's imports: every
//! `crate::lock::…` and `super::…` path in a file of `src/lock` leads into the file's own wing
//! or one its row lets it import. An import the table does not allow fails here, and so does a
//! file that reaches the engine's face (`src/lock/mod.rs`), which no wing may import.

use std::collections::{BTreeMap, BTreeSet};

use super::{ROOT, read};

/// The face of the engine, which only re-exports: no wing may import it.
const FACE: &str = "mod.rs";

/// The wings each wing may import, from the table under "### The engine's wings": the first
/// column names the wings of a row, the last what they may import, each in backquotes.
fn table(design: &str) -> BTreeMap<String, BTreeSet<String>> {
    let after = design
        .split("\n### The engine's wings\n")
        .nth(1)
        .expect("a section \"The engine's wings\"");
    let rows = after.lines().skip_while(|l| !l.starts_with('|')).skip(2);
    let quoted =
        |cell: &str| -> Vec<String> { cell.split('`').skip(1).step_by(2).map(str::to_string).collect() };
    let mut allowed = BTreeMap::new();
    for row in rows.take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.trim_matches('|').split('|').collect();
        let may: BTreeSet<String> = quoted(cells[cells.len() - 1]).into_iter().collect();
        for wing in quoted(cells[0]) {
            allowed.insert(wing, may.clone());
        }
    }
    allowed
}

/// A file's text without its comments, so that a doc link is no import.
fn code(text: &str) -> String {
    let strip = |line: &str| match line.find("//") {
        Some(i) if i == 0 || line[..i].ends_with(char::is_whitespace) => line[..i].to_string(),
        _ => line.to_string(),
    };
    text.lines().map(strip).collect::<Vec<_>>().join("\n")
}

/// The first segment of each path a `use` group `{a::b, c, d::{e}}` names, from just after
/// its opening brace.
fn group(rest: &str) -> Vec<String> {
    let (mut depth, mut item, mut firsts) = (1, String::new(), vec![]);
    for c in rest.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 1 => break,
            '}' => depth -= 1,
            ',' if depth == 1 => {
                firsts.push(std::mem::take(&mut item));
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    firsts.push(item);
    let first = |i: &String| i.trim().split("::").next().unwrap_or("").trim().to_string();
    firsts.iter().map(first).filter(|f| !f.is_empty()).collect()
}

/// The module paths below `src/lock` that `text` (the code of the module at `module`) names:
/// `crate::lock::a::…` as `[a]`, `super::b` as `b` beside `module`. In a file's inline
/// `mod tests`, `super` is the file itself.
fn paths(module: &[String], text: &str) -> Vec<Vec<String>> {
    let tests = text.find("#[cfg(test)]\nmod tests {").unwrap_or(text.len());
    let mut found = vec![];
    for (at, _) in text
        .match_indices("crate::lock::")
        .chain(text.match_indices("super::"))
    {
        let crate_path = text[at..].starts_with("crate::lock::");
        let mut rest = &text[at..];
        let mut ups = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            (rest, ups) = (r, ups + 1);
        }
        if at > 0 && text[..at].ends_with("super::") {
            continue; // counted from the first `super::` of the run
        }
        let rest = rest.strip_prefix("crate::lock::").unwrap_or(rest);
        let firsts = match rest.strip_prefix('{') {
            Some(inner) => group(inner),
            None => vec![
                rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                    .next()
                    .unwrap()
                    .to_string(),
            ],
        };
        let ups = if at > tests && !crate_path { ups - 1 } else { ups };
        let base = match crate_path {
            true => vec![],
            false if ups > module.len() => continue,
            false => module[..module.len() - ups].to_vec(),
        };
        for first in firsts.into_iter().filter(|f| f != "self" && !f.is_empty()) {
            found.push([base.clone(), vec![first]].concat());
        }
    }
    found
}

/// The wing a module path below `src/lock` lies in: its folder (`a/`), its file (`a.rs`), or
/// the face for a name the face re-exports.
fn wing_of(path: &[String], wings: &BTreeSet<String>) -> String {
    let Some(first) = path.first() else {
        return FACE.into();
    };
    [format!("{first}/"), format!("{first}.rs")]
        .into_iter()
        .find(|w| wings.contains(w))
        .unwrap_or_else(|| FACE.into())
}

/// What is wrong with the imports of the files `sources` (module path and code) under a table
/// allowing `allowed`.
fn faults(allowed: &BTreeMap<String, BTreeSet<String>>, sources: &[(Vec<String>, String)]) -> Vec<String> {
    let wings: BTreeSet<String> = allowed.keys().cloned().collect();
    let mut faults = BTreeSet::new();
    for (module, text) in sources {
        let own = wing_of(module, &wings);
        let Some(may) = allowed.get(&own) else {
            faults.insert(format!("{own}: no row in the wing table"));
            continue;
        };
        for path in paths(module, &code(text)) {
            let to = wing_of(&path, &wings);
            if to != own && !may.contains(&to) {
                let file = module.join("/");
                faults.insert(format!(
                    "src/lock/{file}: imports {to} ({}), which its wing {own} may not",
                    path.join("::")
                ));
            }
        }
    }
    faults.into_iter().collect()
}

/// Every `.rs` file under `src/lock` but the face, as (module path, text).
fn engine_sources() -> Vec<(Vec<String>, String)> {
    fn walk(dir: &str, module: &[String], out: &mut Vec<(Vec<String>, String)>) {
        for entry in std::fs::read_dir(format!("{ROOT}/{dir}")).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            let path = format!("{dir}/{name}");
            if std::fs::metadata(format!("{ROOT}/{path}")).unwrap().is_dir() {
                walk(&path, &[module, std::slice::from_ref(&name)].concat(), out);
            } else if let Some(stem) = name.strip_suffix(".rs") {
                let module = match stem {
                    "mod" => module.to_vec(),
                    _ => [module, &[stem.to_string()]].concat(),
                };
                out.push((module, read(&path)));
            }
        }
    }
    let mut out = vec![];
    walk("src/lock", &[], &mut out);
    out.retain(|(module, _)| !module.is_empty());
    out
}

#[test]
fn every_import_of_the_engine_is_one_its_wing_table_allows() {
    let allowed = table(&read("docs/design.md"));
    assert!(allowed.len() >= 10, "the wing table has {} wings", allowed.len());
    let faults = faults(&allowed, &engine_sources());
    assert!(
        faults.is_empty(),
        "docs/design.md, \"The engine's wings\":\n{}",
        faults.join("\n")
    );
}

#[test]
fn the_wing_check_finds_an_arrow_up_a_group_import_and_the_face() {
    let design = "## Shape\n\n### The engine's wings\n\nIntro.\n\n| wing | holds | may import |\n|---|---|---|\n\
        | `low/` | ground | nothing |\n| `high.rs`, `side/` | above | `low/` |\n\nProse.\n";
    let allowed = table(design);
    assert_eq!(allowed["side/"], BTreeSet::from(["low/".to_string()]));
    let module = |m: &[&str]| m.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let ok = [
        (
            module(&["high"]),
            "use crate::lock::low::x::Y;\n// crate::lock::side::z in a comment".into(),
        ),
        (
            module(&["low", "a"]),
            "use super::b::C;\n#[cfg(test)]\nmod tests {\n    use super::D;\n}".into(),
        ),
    ];
    assert_eq!(faults(&allowed, &ok), Vec::<String>::new());
    let bad = [
        (
            module(&["low", "a"]),
            "use crate::lock::{side::S, low::L};".to_string(),
        ),
        (module(&["side", "b"]), "use super::super::Engine;".to_string()),
    ];
    assert_eq!(
        faults(&allowed, &bad),
        [
            "src/lock/low/a: imports side/ (side), which its wing low/ may not",
            "src/lock/side/b: imports mod.rs (Engine), which its wing side/ may not",
        ]
    );
}
