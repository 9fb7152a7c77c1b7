//! The chart's README (`charts/podlock/README.md`) lists every value of `values.yaml` with its
//! type, default and the comment that documents it, in a table generated from `values.yaml`
//! between two markers. The test fails when the table differs from what `values.yaml` gives,
//! or when a value has no comment; `PODLOCK_REGENERATE=1` makes it write the table instead:
//!
//!     PODLOCK_REGENERATE=1 cargo test --test integration chart::readme

use super::CHART;

const BEGIN: &str = "<!-- values table: generated from values.yaml by tests/integration/chart/readme.rs -->";
const END: &str = "<!-- end of the values table -->";

/// One row: a value's dotted key, its description, type and default.
#[derive(Debug, PartialEq)]
pub(crate) struct Row {
    pub key: String,
    pub description: String,
    pub kind: &'static str,
    pub default: String,
}

/// The rows of `values` (the text of a values.yaml): a row per value written on its key's
/// line (a scalar, or a flow `{...}`/`[...]`) or as a block list, and per block mapping that
/// has a comment of its own; its keys get their rows after it. A value's description is the
/// comment block just above its key and the comment at the end of its line.
pub(crate) fn rows(values: &str) -> Vec<Row> {
    let parsed: serde_yaml::Value = serde_yaml::from_str(values).expect("values.yaml is YAML");
    let lines: Vec<&str> = values.lines().collect();
    let mut rows = vec![];
    let mut path: Vec<(usize, String)> = vec![]; // (indent, key) of the enclosing mappings
    let mut comment: Vec<String> = vec![];
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.is_empty() {
            comment.clear();
            continue;
        }
        if let Some(text) = trimmed.strip_prefix('#') {
            comment.push(text.trim().to_string());
            continue;
        }
        if trimmed.starts_with("- ") || trimmed == "-" {
            comment.clear(); // an item of a block list, which its key's row shows
            continue;
        }
        let Some((key, rest)) = split_key(trimmed) else {
            panic!("values.yaml line {}: not `key: value`: {line:?}", i + 1);
        };
        while path.last().is_some_and(|(at, _)| *at >= indent) {
            path.pop();
        }
        let (value, inline) = split_comment(rest);
        let mut description = std::mem::take(&mut comment);
        description.extend(inline);
        let dotted: Vec<&str> = path.iter().map(|(_, k)| k.as_str()).chain([key]).collect();
        let dotted = dotted.join(".");
        let next = lines[i + 1..]
            .iter()
            .map(|l| l.trim_start())
            .find(|l| !l.is_empty() && !l.starts_with('#'));
        let block_list = value.is_empty() && next.is_some_and(|l| l.starts_with('-'));
        let section = value.is_empty() && !block_list;
        if section {
            path.push((indent, key.to_string()));
            if description.is_empty() {
                continue;
            }
        }
        let node = lookup(&parsed, &dotted);
        rows.push(Row {
            key: dotted,
            description: description.join(" "),
            kind: kind(node),
            default: if section { String::new() } else { shown(node) },
        });
    }
    rows
}

/// `key: rest` of a mapping line.
fn split_key(line: &str) -> Option<(&str, &str)> {
    let (key, rest) = line.split_once(':')?;
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    (plain && (rest.is_empty() || rest.starts_with(' '))).then_some((key, rest.trim()))
}

/// A value and the comment after it (` # ...`), outside quotes.
fn split_comment(rest: &str) -> (&str, Option<String>) {
    let mut quote = None;
    for (i, c) in rest.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') if i == 0 || rest[..i].ends_with(' ') => {
                return (rest[..i].trim(), Some(rest[i + 1..].trim().to_string()));
            }
            _ => {}
        }
    }
    (rest.trim(), None)
}

/// The node at the dotted `key`.
fn lookup<'a>(root: &'a serde_yaml::Value, key: &str) -> &'a serde_yaml::Value {
    key.split('.').fold(root, |node, part| &node[part])
}

fn kind(node: &serde_yaml::Value) -> &'static str {
    use serde_yaml::Value::*;
    match node {
        Null => "null",
        Bool(_) => "boolean",
        Number(n) if n.is_f64() => "number",
        Number(_) => "integer",
        String(_) => "string",
        Sequence(_) => "list",
        Mapping(_) => "object",
        Tagged(_) => "tagged",
    }
}

/// A default as compact JSON (`"text"`, `{"a":1}`); `""` for the empty string.
fn shown(node: &serde_yaml::Value) -> String {
    let json: serde_json::Value = serde_yaml::from_value(node.clone()).unwrap();
    serde_json::to_string(&json).unwrap()
}

/// The table in Markdown.
pub(crate) fn table(rows: &[Row]) -> String {
    // A pipe would end the cell; `<release>` would be read as an HTML tag.
    let cell = |text: &str| text.replace('|', "\\|").replace('<', "&lt;").replace('>', "&gt;");
    let mut out = String::from("| key | type | default | description |\n|---|---|---|---|\n");
    for row in rows {
        let default = match row.default.as_str() {
            "" => String::new(),
            d => format!("`{}`", cell(d)),
        };
        out += &format!(
            "| `{}` | {} | {} | {} |\n",
            row.key,
            row.kind,
            default,
            cell(&row.description)
        );
    }
    out
}

/// The README with `table` between the markers.
fn with_table(readme: &str, table: &str) -> Option<String> {
    let (head, rest) = readme.split_once(BEGIN)?;
    let (_, tail) = rest.split_once(END)?;
    Some(format!("{head}{BEGIN}\n{table}{END}{tail}"))
}

#[test]
fn the_readme_lists_every_value_as_values_yaml_documents_it() {
    let values = std::fs::read_to_string(format!("{CHART}/values.yaml")).unwrap();
    let rows = rows(&values);
    let undocumented: Vec<&str> = rows
        .iter()
        .filter(|r| r.description.is_empty())
        .map(|r| r.key.as_str())
        .collect();
    assert!(
        undocumented.is_empty(),
        "values.yaml: give these values a comment (above the key or after the value): {undocumented:?}"
    );
    let path = format!("{CHART}/README.md");
    let readme = std::fs::read_to_string(&path).unwrap_or_default();
    let Some(expected) = with_table(&readme, &table(&rows)) else {
        panic!("{path} has no values table between {BEGIN:?} and {END:?}");
    };
    if std::env::var_os("PODLOCK_REGENERATE").is_some() {
        std::fs::write(&path, &expected).unwrap();
        eprintln!("wrote the values table of {path}: {} values", rows.len());
        return;
    }
    if readme != expected {
        let old: Vec<&str> = readme.lines().collect();
        let differ: Vec<String> = expected
            .lines()
            .filter(|l| !old.contains(l))
            .map(|l| format!("  wanted: {l}"))
            .take(10)
            .collect();
        panic!(
            "{path}'s values table differs from values.yaml; regenerate it:\n    \
             PODLOCK_REGENERATE=1 cargo test --test integration chart::readme\n{}",
            differ.join("\n")
        );
    }
    eprintln!("{path}: its table lists the {} values of values.yaml", rows.len());
}

#[test]
fn the_generator_reads_keys_comments_types_and_defaults() {
    let values = "\
# The image.
image:
  repository: r   # where from
  tag: \"\"            # default: the chart's
# Not the next key's: a blank line follows.

top: 3
# A section of its own.
section:
  # Two lines
  # of comment.
  list:
    - a
    - b
  flow: {a: 1}    # e.g. {b: \"#2\"}
  flag: true # on | off, for <release>
";
    let rows = rows(values);
    let brief: Vec<(&str, &str, &str, &str)> = rows
        .iter()
        .map(|r| (r.key.as_str(), r.kind, r.default.as_str(), r.description.as_str()))
        .collect();
    assert_eq!(
        brief,
        [
            ("image", "object", "", "The image."),
            ("image.repository", "string", "\"r\"", "where from"),
            ("image.tag", "string", "\"\"", "default: the chart's"),
            ("top", "integer", "3", ""),
            ("section", "object", "", "A section of its own."),
            ("section.list", "list", "[\"a\",\"b\"]", "Two lines of comment."),
            ("section.flow", "object", "{\"a\":1}", "e.g. {b: \"#2\"}"),
            ("section.flag", "boolean", "true", "on | off, for <release>"),
        ]
    );
    assert!(table(&rows).contains("| `section.flag` | boolean | `true` | on \\| off, for &lt;release&gt; |"));
}
