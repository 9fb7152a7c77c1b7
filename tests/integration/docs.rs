//! The docs name everything the code has, and nothing it lacks: every flag and environment
//! variable of every command's `--help` (the real binary's) is in docs/cli.md under that
//! command, and every flag there exists; every error code the sidecar answers is in docs/api.md's
//! error table with its status, and every code there is answered; every metric is in
//! docs/operations.md; every field and parameter of docs/openapi.yaml is in docs/api.md; the
//! code docs/clients.md quotes is in the examples as quoted; every measured figure agrees with
//! the benchmarks' results files (`numbers`); every relative link of the README, CHANGELOG,
//! SECURITY and docs/*.md leads to a file and heading that exist, and the README links every doc;
//! docs/design.md's module table names every source file, and no file that is gone (`layout`);
//! every import of the engine is one its wing table allows (`wings`).

mod layout;
mod numbers;
mod support;
mod wings;

use std::collections::BTreeSet;
use std::process::Command;

use crate::common::podlock_bin;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{ROOT}/{path}")).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `podlock ARGS --help`.
fn help(args: &[&str]) -> String {
    let out = Command::new(podlock_bin())
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "podlock {args:?} --help");
    String::from_utf8(out.stdout).unwrap()
}

/// The commands `podlock --help` lists, but `help`.
fn commands() -> Vec<String> {
    let top = help(&[]);
    let listed = top.split("Commands:\n").nth(1).expect("a command list");
    let lines = listed.lines().take_while(|l| !l.trim().is_empty());
    let names = lines.filter_map(|l| l.split_whitespace().next());
    names.filter(|n| *n != "help").map(str::to_string).collect()
}

/// The long flags (`--name`) in `text`.
fn long_flags(text: &str) -> BTreeSet<String> {
    let starts = text.match_indices("--").map(|(i, _)| i);
    let starts =
        starts.filter(|&i| i == 0 || !text[..i].ends_with(|c: char| c.is_alphanumeric() || c == '-'));
    let names = starts.map(|i| {
        let rest = &text[i + 2..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .unwrap_or(rest.len());
        &rest[..end]
    });
    let names = names.filter(|n| n.starts_with(|c: char| c.is_ascii_lowercase()));
    names.map(|n| format!("--{n}")).collect()
}

/// The flags a help text defines (the first long flag of each option line) and the
/// environment variables it names.
fn defined(help: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let options = help.lines().filter(|l| l.trim_start().starts_with('-'));
    let flags = options.filter_map(|l| long_flags(l.split("  ").find(|p| p.contains("--"))?).pop_first());
    let envs = help.split("[env: ").skip(1).map(|rest| {
        let end = rest.find(['=', ']']).unwrap();
        rest[..end].to_string()
    });
    (flags.collect(), envs.collect())
}

/// The section of `doc` under the heading `## TITLE`, up to the next `## `.
fn section<'a>(doc: &'a str, title: &str) -> &'a str {
    let start = doc
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("no section {title}"));
    let rest = &doc[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    &rest[..end]
}

#[test]
fn every_flag_and_variable_of_every_command_is_in_cli_md_under_it_and_no_other() {
    let cli = read("docs/cli.md");
    let common = section(&cli, "Every command");
    let mut all = defined(&help(&[])).0;
    let mut missing = vec![];
    for command in commands() {
        let (flags, envs) = defined(&help(&[&command]));
        let own = section(&cli, &format!("podlock {command}"));
        for name in flags
            .iter()
            .map(|f| format!("`{f}`"))
            .chain(envs.iter().map(|e| format!("`{e}`")))
        {
            if !own.contains(&name) && !common.contains(&name) {
                missing.push(format!("podlock {command}: {name}"));
            }
        }
        let stale: Vec<_> = long_flags(own).difference(&flags).cloned().collect();
        assert!(
            stale.is_empty(),
            "docs/cli.md's podlock {command} names flags it lacks: {stale:?}"
        );
        all.extend(flags);
    }
    assert!(missing.is_empty(), "undocumented in docs/cli.md: {missing:#?}");
    let stale: Vec<_> = long_flags(common).difference(&all).cloned().collect();
    assert!(
        stale.is_empty(),
        "docs/cli.md names flags no command has: {stale:?}"
    );
    assert!(all.len() > 40, "the parser found only {all:?}");
}

/// Every `(status, code)` the sidecar answers, from its sources: each `StatusCode::NAME,`
/// followed by a string literal (`ApiError::new(StatusCode::..., "code", ...)`).
fn answered_codes() -> BTreeSet<(u16, String)> {
    let dir = format!("{ROOT}/src/sidecar");
    let mut codes = BTreeSet::new();
    for file in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(file.unwrap().path()).unwrap();
        for after in text.split("StatusCode::").skip(1) {
            let (name, rest) = after.split_at(
                after
                    .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                    .unwrap(),
            );
            let Some(literal) = rest
                .strip_prefix(',')
                .map(str::trim_start)
                .and_then(|r| r.strip_prefix('"'))
            else {
                continue;
            };
            codes.insert((status(name), literal[..literal.find('"').unwrap()].to_string()));
        }
    }
    codes
}

/// The number of a `StatusCode` constant.
fn status(name: &str) -> u16 {
    match name {
        "BAD_REQUEST" => 400,
        "FORBIDDEN" => 403,
        "NOT_FOUND" => 404,
        "METHOD_NOT_ALLOWED" => 405,
        "CONFLICT" => 409,
        "GONE" => 410,
        "PAYLOAD_TOO_LARGE" => 413,
        "INTERNAL_SERVER_ERROR" => 500,
        "SERVICE_UNAVAILABLE" => 503,
        other => panic!("StatusCode::{other}: add its number here"),
    }
}

#[test]
fn every_error_code_the_sidecar_answers_is_in_the_api_error_table_with_its_status() {
    let api = read("docs/api.md");
    let table: BTreeSet<(u16, String)> = (api.lines())
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let status = cells.get(1)?.parse().ok()?;
            Some((
                status,
                cells.get(2)?.strip_prefix('`')?.strip_suffix('`')?.to_string(),
            ))
        })
        .collect();
    let answered = answered_codes();
    assert!(answered.len() >= 12, "the parser found only {answered:?}");
    let undocumented: Vec<_> = answered.difference(&table).collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/api.md's table: {undocumented:?}"
    );
    let stale: Vec<_> = table.difference(&answered).collect();
    assert!(
        stale.is_empty(),
        "in docs/api.md's table, never answered: {stale:?}"
    );
}

#[test]
fn every_metric_is_in_operations_md() {
    let metrics = read("src/metrics.rs");
    let names: BTreeSet<&str> = (metrics.split('"').skip(1).step_by(2))
        .filter(|s| s.starts_with("podlock_") && s.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .collect();
    assert!(names.len() >= 20, "the parser found only {names:?}");
    let ops = read("docs/operations.md");
    let missing: Vec<_> = names.iter().filter(|n| !ops.contains(&format!("`{n}"))).collect();
    assert!(missing.is_empty(), "not in docs/operations.md: {missing:?}");
}

/// Whether `word` occurs in `text` as a whole word.
fn has_word(text: &str, word: &str) -> bool {
    let part = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word)
        .any(|(i, _)| !text[..i].ends_with(part) && !text[i + word.len()..].starts_with(part))
}

/// Every property name and parameter name in an OpenAPI document.
fn openapi_names(v: &serde_yaml::Value, names: &mut BTreeSet<String>) {
    if let Some(map) = v.as_mapping() {
        if let Some(props) = v["properties"].as_mapping() {
            names.extend(props.keys().filter_map(|k| k.as_str().map(str::to_string)));
        }
        if let (Some(name), Some(_)) = (v["name"].as_str(), v.get("in")) {
            names.insert(name.to_string());
        }
        map.values().for_each(|child| openapi_names(child, names));
    } else if let Some(seq) = v.as_sequence() {
        seq.iter().for_each(|child| openapi_names(child, names));
    }
}

#[test]
fn every_field_of_the_openapi_document_is_in_api_md() {
    let spec: serde_yaml::Value = serde_yaml::from_str(&read("docs/openapi.yaml")).unwrap();
    let mut names = BTreeSet::new();
    openapi_names(&spec, &mut names);
    assert!(names.len() >= 20, "the walk found only {names:?}");
    let api = read("docs/api.md");
    let missing: Vec<_> = names.iter().filter(|n| !has_word(&api, n)).collect();
    assert!(
        missing.is_empty(),
        "in docs/openapi.yaml, not in docs/api.md: {missing:?}"
    );
}

#[test]
fn the_code_clients_md_quotes_is_in_the_examples() {
    let clients = read("docs/clients.md");
    let mut quoted = 0;
    for part in clients.split("From `").skip(1) {
        let file = &part[..part.find('`').unwrap()];
        let block = part
            .split("```")
            .nth(1)
            .expect("a code block after the file's name");
        let code = &block[block.find('\n').unwrap() + 1..];
        assert!(
            read(file).contains(code),
            "docs/clients.md quotes {file} as it is not:\n{code}"
        );
        quoted += 1;
    }
    assert_eq!(quoted, 4, "one quote of each example");
}

/// The docs a reader reaches from the README: README.md, CHANGELOG.md, SECURITY.md and
/// docs/*.md.
fn linked_docs() -> Vec<String> {
    let mut docs: Vec<String> = ["README.md", "CHANGELOG.md", "SECURITY.md"]
        .map(String::from)
        .into();
    docs.extend(crate::common::results::docs_dir());
    docs
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, all but letters, digits, `-` and
/// `_` dropped.
fn anchor(heading: &str) -> String {
    let lower = heading.trim().to_lowercase();
    let kept = lower
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'));
    kept.map(|c| if c == ' ' { '-' } else { c }).collect()
}

/// The anchors of a markdown text's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// Every relative link `[text](target)` of the doc at `path` (from the repository root) that
/// does not lead to a file of the repository, or to a heading of it: `read` gives a file's text.
fn broken_links(path: &str, text: &str, read: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let dir = std::path::Path::new(path).parent().unwrap();
    let mut broken = vec![];
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        for part in line.split("](").skip(1) {
            let Some(end) = part.find(')') else { continue };
            let target = &part[..end];
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
            let resolved = match file {
                "" => path.to_string(),
                f => {
                    let mut p = dir.to_path_buf();
                    for seg in f.split('/') {
                        match seg {
                            ".." => {
                                p.pop();
                            }
                            "." => {}
                            s => p.push(s),
                        }
                    }
                    p.to_string_lossy().into_owned()
                }
            };
            let exists =
                std::path::Path::new(&format!("{ROOT}/{resolved}")).exists() || read(&resolved).is_some();
            if !exists {
                broken.push(format!("{path}: ({target}): no file {resolved}"));
            } else if !fragment.is_empty() && resolved.ends_with(".md") {
                let target_text = read(&resolved).unwrap_or_default();
                if !anchors(&target_text).contains(fragment) {
                    broken.push(format!(
                        "{path}: ({target}): no heading #{fragment} in {resolved}"
                    ));
                }
            }
        }
    }
    broken
}

fn read_opt(path: &str) -> Option<String> {
    std::fs::read_to_string(format!("{ROOT}/{path}")).ok()
}

#[test]
fn every_relative_link_of_the_docs_leads_to_a_file_and_heading_and_the_readme_lists_every_doc() {
    let mut broken = vec![];
    for doc in linked_docs() {
        broken.extend(broken_links(&doc, &read(&doc), &read_opt));
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    let readme = read("README.md");
    let unlisted: Vec<String> = (linked_docs().into_iter())
        .filter(|d| d != "README.md" && !readme.contains(&format!("]({d}")))
        .collect();
    assert!(unlisted.is_empty(), "docs the README does not link: {unlisted:?}");
}

#[test]
fn the_link_check_finds_a_missing_file_and_a_missing_heading() {
    let docs = |p: &str| match p {
        "docs/a.md" => Some("# A\n\n## Fencing tokens\n".to_string()),
        _ => None,
    };
    let good = "[a](a.md#fencing-tokens) [web](https://x.y/z) [self](#intro)\n\n## Intro\n";
    assert_eq!(
        broken_links("docs/b.md", good, &|p| if p == "docs/b.md" {
            Some(good.into())
        } else {
            docs(p)
        }),
        Vec::<String>::new()
    );
    let bad = "[gone](gone.md) [a](a.md#fencing) [up](../nothing/here.md)";
    assert_eq!(broken_links("docs/b.md", bad, &docs).len(), 3, "{bad}");
    assert_eq!(anchor(" `GET /v1/locks/{name}/fence`"), "get-v1locksnamefence");
}
