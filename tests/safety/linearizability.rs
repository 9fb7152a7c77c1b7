//! The history, checked by Porcupine: `tests/linearizability/` holds a small Go program that
//! reads a history and checks it against a model of a reader-writer semaphore with fencing
//! tokens (see its `model.go`), one partition per lock. The test builds it with `go build`
//! (Go caches the build) and runs it once per run.

use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use super::history::{Op, Outcome};

/// Porcupine's verdict on one lock's history.
#[derive(Debug, Clone, Deserialize)]
pub struct LockVerdict {
    /// The lock.
    pub lock: String,
    /// `Ok`, `Illegal` or `Unknown` (the check timed out).
    pub result: String,
    /// How many operations its history had.
    pub ops: usize,
}

/// Porcupine's verdict on a run's history.
#[derive(Debug, Clone, Deserialize)]
pub struct Verdict {
    /// For the whole history.
    pub result: String,
    /// For each lock.
    pub locks: Vec<LockVerdict>,
    /// How long the check took.
    pub seconds: f64,
    /// Where its visualization went, when the result is not `Ok`.
    pub visualization: Option<String>,
}

/// The checker's source.
const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/linearizability");

/// Builds the checker (once per test process); its path.
fn checker() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("linearizability");
        let built = Command::new("go")
            .args(["build", "-o"])
            .arg(&out)
            .arg(".")
            .current_dir(SOURCE)
            .output()
            .expect("go (scripts/setup.sh installs it)");
        let why = String::from_utf8_lossy(&built.stderr);
        assert!(built.status.success(), "go build {SOURCE}: {why}");
        out
    })
}

/// The history as the checker reads it: times in nanoseconds from its first call, -1 for an
/// answer that never came.
fn encode(ops: &[Op]) -> Value {
    let origin = ops.iter().map(|o| o.call).fold(f64::INFINITY, f64::min);
    let ns = |t: f64| ((t - origin) * 1e9).round() as i64;
    let ops: Vec<Value> = (ops.iter())
        .map(|o| {
            let mut v = serde_json::to_value(o).unwrap();
            v["call"] = json!(ns(o.call));
            v["return"] = json!(o.ret.map_or(-1, ns));
            v.as_object_mut().unwrap().remove("ret");
            v
        })
        .collect();
    json!(ops)
}

/// Writes `ops` to `dir/history.json` and checks them; a visualization of any violation goes
/// to `dir/linearizability.html`.
pub fn check(ops: &[Op], dir: &Path) -> Verdict {
    std::fs::create_dir_all(dir).unwrap();
    let history = dir.join("history.json");
    std::fs::write(&history, encode(ops).to_string()).unwrap();
    let run = Command::new(checker())
        .arg("-history")
        .arg(&history)
        .arg("-html")
        .arg(dir.join("linearizability.html"))
        .output()
        .unwrap();
    let why = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "the linearizability checker failed: {why}");
    serde_json::from_slice(&run.stdout).unwrap_or_else(|e| panic!("its verdict: {e}: {why}"))
}

/// Where a run's history and any visualization go.
pub fn run_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("safety")
}

/// How many operations of one lock and API, and with what outcomes and modes.
#[derive(Debug, Default)]
pub struct Tally {
    /// Answered and done.
    pub ok: usize,
    /// Answered with a refusal.
    pub failed: usize,
    /// Never answered.
    pub ambiguous: usize,
    /// The modes they asked for.
    pub modes: Vec<&'static str>,
}

/// Each lock's operations by API.
pub fn tally(ops: &[Op]) -> BTreeMap<(&'static str, &'static str), Tally> {
    let mut by = BTreeMap::<_, Tally>::new();
    for op in ops {
        let t = by.entry((op.lock, op.api)).or_default();
        match op.outcome {
            _ if op.ret.is_none() => t.ambiguous += 1,
            Outcome::Ok => t.ok += 1,
            Outcome::Fail => t.failed += 1,
            Outcome::Unknown => t.ambiguous += 1,
        }
        if let Some(m) = op.mode.filter(|m| !t.modes.contains(m)) {
            t.modes.push(m);
        }
    }
    by
}

#[cfg(test)]
mod tests {
    use super::super::history::OpKind;
    use super::*;

    fn op(kind: OpKind, client: &str, token: i64, call: f64, ret: f64) -> Op {
        Op {
            lock: "counter",
            client: client.into(),
            row: 0,
            kind,
            api: "acquire",
            mode: Some("exclusive"),
            granted: None,
            permits: None,
            outcome: Outcome::Ok,
            token,
            limit: 1,
            call,
            ret: Some(ret),
        }
    }

    #[test]
    fn porcupine_catches_two_holders_of_a_mutex() {
        // b is granted while a holds and a is never told otherwise; tokens rise, so fencing
        // alone would not notice.
        let ops = [
            op(OpKind::Settle, "", 0, 0.0, 0.0),
            op(OpKind::Acquire, "a", 10, 1.0, 2.0),
            op(OpKind::Acquire, "b", 12, 3.0, 4.0),
            op(OpKind::Release, "b", 0, 5.0, 6.0),
            op(OpKind::Release, "a", 0, 7.0, 8.0),
        ];
        let dir = tempfile::tempdir().unwrap();
        let v = check(&ops, dir.path());
        assert_eq!(v.result, "Illegal", "{v:?}");
        assert_eq!(v.locks[0].result, "Illegal");
        let html = v.visualization.expect("a visualization of the violation");
        assert!(std::fs::metadata(html).unwrap().len() > 1000);
        // Released in turn instead: linearizable.
        let ops = [&ops[..2], &[op(OpKind::Release, "a", 0, 2.5, 2.6)], &ops[2..4]].concat();
        assert_eq!(check(&ops, dir.path()).result, "Ok");
    }
}
