//! docs/openapi.yaml, fuzzed: Schemathesis (installed by scripts/setup.sh) generates requests
//! from the spec and sends them to a real sidecar, which must answer only what the spec lists
//! for each operation (status, content type and body schema), never a 5xx but a listed 503,
//! and never crash. Two runs: a sidecar that has not reached etcd yet (every operation, the
//! streaming ones too, since they answer 503 at once), then one serving on a real etcd. The
//! run is bounded (examples per operation, a seed, a request timeout, and a time limit on the
//! whole) and its summary is printed.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::{EtcdServer, Sidecar, bin_dir, declare, free_port};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The checks every response goes through: a 5xx other than 503 (see api_fuzz.toml), a status
/// the operation does not list, a content type it does not list, a body its schema refuses.
const CHECKS: &str =
    "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance";

/// The longest one run may take; it then counts as failed.
const RUN_LIMIT: Duration = Duration::from_secs(150);

/// Runs Schemathesis on `spec` against `url` with `extra` arguments; returns whether it passed
/// and what it printed. It also fails if the sidecar's process ended meanwhile (a crash).
async fn schemathesis(spec: &str, url: &str, extra: &[&str]) -> (bool, String) {
    let work = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let child = tokio::process::Command::new(bin_dir().join("schemathesis"))
        .arg("--config-file")
        .arg(format!("{ROOT}/tests/integration/api_fuzz.toml"))
        .args(["run", spec, "--url", url, "--checks", CHECKS])
        // One worker and a fixed seed, without a database of earlier runs' examples: the same
        // requests every run. A request that blocks (an acquire that waits) fails the run.
        .args(["--workers", "1", "--seed", "41", "--generation-database", "none"])
        .args(["--request-timeout", "10", "--no-color"])
        .args(extra)
        .current_dir(work.path())
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("schemathesis: run scripts/setup.sh");
    let out = tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("schemathesis ran over {RUN_LIMIT:?}"))
        .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let took = started.elapsed();
    (
        out.status.success(),
        format!("{printed}\n(schemathesis: {} in {took:.1?})", out.status),
    )
}

/// The end of Schemathesis's output: its warnings and summary, or all of it on a failure.
fn summary(printed: &str, passed: bool) -> &str {
    match printed
        .find("=== WARNINGS ===")
        .or(printed.find("=== SUMMARY ==="))
    {
        Some(i) if passed => &printed[printed[..i].rfind('\n').map_or(0, |n| n + 1)..],
        _ => printed,
    }
}

/// Asserts that a run passed and that `sidecar` still runs, printing the run's summary.
fn passed(what: &str, (ok, printed): (bool, String), sidecar: &mut Sidecar) {
    println!("--- schemathesis, {what} ---\n{}", summary(&printed, ok));
    assert!(
        sidecar.running(),
        "the sidecar ended during the run:\n{}",
        sidecar.log()
    );
    assert!(
        ok,
        "schemathesis found answers docs/openapi.yaml does not list ({what}): above"
    );
}

#[tokio::test]
async fn schemathesis_finds_no_answer_the_spec_does_not_list() {
    let spec = format!("{ROOT}/docs/openapi.yaml");

    // Before etcd: nothing listens at the sidecar's etcd endpoint, and with etcd auth its
    // client must reach etcd to start (without, it connects lazily and starts at once), so
    // every route but /healthz must answer a 503 the spec lists.
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let auth = ["--etcd-user", "fuzz", "--etcd-password", "fuzz"];
    let mut starting = Sidecar::spawn(&nowhere, "pod-fuzz", &auth).await;
    let (status, _) = starting.get("/v1/locks").await;
    assert_eq!(
        status,
        503,
        "the sidecar has not reached etcd:\n{}",
        starting.log()
    );
    let run = schemathesis(
        &spec,
        &starting.addr,
        &["--max-examples", "10", "--phases", "examples,coverage,fuzzing"],
    )
    .await;
    passed("before the sidecar reached etcd", run, &mut starting);
    drop(starting);

    // On etcd. The three streaming operations are left out: a granted POST .../hold, a GET
    // .../events and a GET .../watch stream until the client closes, which Schemathesis would
    // count as a timeout; tests/integration/openapi.rs checks their first event against the
    // spec instead.
    let etcd = EtcdServer::start().await;
    for lock in ["fuzz-a", "fuzz-b"] {
        declare(&etcd.endpoint, &[lock, "--max-holders", "10000"]);
    }
    let mut serving = Sidecar::start(&etcd.endpoint, "pod-fuzz", &[]).await;
    let run = schemathesis(
        &spec,
        &serving.addr,
        &[
            "--max-examples",
            "300",
            "--exclude-operation-id",
            "holdLock",
            "--exclude-operation-id",
            "watchLockEvents",
            "--exclude-operation-id",
            "observeLock",
        ],
    )
    .await;
    passed("on etcd", run, &mut serving);
    let (status, _) = serving.get("/v1/locks/fuzz-a").await;
    assert_eq!(status, 200, "the sidecar serves on after the run");
}
