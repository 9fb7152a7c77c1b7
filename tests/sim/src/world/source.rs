//! What keeps a seed's run a function of the seed, held in the engine's source: no unordered
//! map or set (their iteration order is drawn per process), no wall-clock read but the
//! engine's clock (`src/lock/clock.rs`, which the world runs on Tokio's clock), no `Instant`
//! but Tokio's (which paused time moves), and no random draw but the one the world does not
//! reach. docs/design.md, "The seeded world".

use std::path::{Path, PathBuf};

/// What the engine's source may not say, and why.
const FORBIDDEN: [(&str, &str); 6] = [
    (
        "HashMap",
        "iterates in an order drawn per process: use a BTreeMap",
    ),
    (
        "HashSet",
        "iterates in an order drawn per process: use a BTreeSet",
    ),
    ("SystemTime::now", "reads the wall clock: use clock::now()"),
    (
        "std::time::Instant",
        "is not moved by paused time: use tokio::time::Instant",
    ),
    ("rand::", "draws outside the seed"),
    ("getrandom", "draws from the OS, outside the seed"),
];

/// Where a forbidden word is allowed, and why.
const ALLOWED: [(&str, &str, &str); 2] = [
    ("clock.rs", "SystemTime::now", "the engine's one wall-clock read"),
    (
        "protocol/names.rs",
        "getrandom",
        "unique_holder_id, for the sidecar's connection-bound holds; the world names its holders",
    ),
];

/// Every line of `src/lock/` that says something forbidden, as `file:line: word (why)`.
pub fn check() -> Result<(), String> {
    // podlock-sim lives in tests/sim of podlock's repository.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../src/lock");
    let mut found = vec![];
    for file in rust_files(&root) {
        let rel = file.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for (word, why) in FORBIDDEN {
                let allowed = ALLOWED.iter().any(|(f, w, _)| *f == rel && *w == word);
                if code.contains(word) && !allowed {
                    found.push(format!("src/lock/{rel}:{}: {word} {why}", n + 1));
                }
            }
        }
    }
    if found.is_empty() {
        return Ok(());
    }
    Err(format!(
        "sim world: the engine's source would make a seed's run differ from its replay:\n{}",
        found.join("\n")
    ))
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = vec![];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}
