//! The client examples in `examples/` against a real sidecar and etcd, writing to the fenced
//! store: each takes the lock, writes with its fencing token and releases (exit 0), says so and
//! exits 1 when it cannot acquire, and, when it loses the lock mid-work, stops writing and exits
//! 75. The loss is made for real: the hold's etcd key deleted, its lease revoked, the lock
//! deleted, or the sidecar stopped (SIGTERM), killed (SIGKILL) or frozen (SIGSTOP).

use serde_json::json;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::store::FencedStore;
use crate::common::{EtcdServer, Sidecar, declare, spawn_dying_with_parent, wait_until};

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
/// The examples' exit status when the lock was lost while they worked.
const EXIT_LOST: i32 = 75;
/// Where the examples' holds live in etcd (namespace `default`, lock `report`).
const REPORT_KEYS: &str = "/podlock/v1/queue/default/report/";

/// A client example: how to run it, and the `writer` it names in its writes to the store.
#[derive(Clone, Copy)]
struct Example {
    program: &'static str,
    args: &'static [&'static str],
    /// Its directory under examples/.
    dir: &'static str,
    writer: &'static str,
}

const PYTHON: Example = Example {
    program: "python3",
    args: &["python_client.py"],
    dir: "",
    writer: "python-example",
};
/// Run as the binary `go build` makes (`go run` answers 1 for every exit status but 0).
const GO: Example = Example {
    program: "go-example",
    args: &[],
    dir: "go",
    writer: "go-example",
};
const NODE: Example = Example {
    program: "node",
    args: &["node_client.mjs"],
    dir: "",
    writer: "node-example",
};
const JAVA: Example = Example {
    program: "java",
    args: &["PodlockClient.java"],
    dir: "",
    writer: "java-example",
};

impl Example {
    /// The example, started against `sidecar` and `store` with `env` set, dying with the test.
    fn spawn(&self, sidecar: &Sidecar, store: &FencedStore, env: &[(&str, &str)]) -> Child {
        let program = match self.program {
            "go-example" => go_example().to_str().unwrap(),
            interpreter => interpreter,
        };
        spawn_dying_with_parent(
            Command::new(program)
                .args(self.args)
                .current_dir(format!("{EXAMPLES}/{}", self.dir))
                .env("PODLOCK_ADDR", &sidecar.addr)
                .env("STORE_URL", &store.url)
                .env("PODLOCK_CONTAINER", "app") // as the injector sets it
                .envs(env.iter().copied())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        )
    }
}

/// The Go example, built once per test run.
fn go_example() -> &'static Path {
    static BUILT: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, binary) = BUILT.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("podlock-go-example-")
            .tempdir()
            .unwrap();
        let binary = dir.path().join("go-example");
        let out = Command::new("go")
            .args(["build", "-o"])
            .arg(&binary)
            .arg(".")
            .current_dir(format!("{EXAMPLES}/go"))
            .output()
            .expect("go is installed");
        assert!(out.status.success(), "go build: {}", text(&out));
        (dir, binary)
    });
    binary
}

/// `examples/curl.sh` run by `sh` (dash on Debian) with nothing on its PATH but curl, sed and
/// uname, against `sidecar` and the store at `store`.
fn curl_sh(sidecar: &Sidecar, store: &str) -> Command {
    static PATH: OnceLock<tempfile::TempDir> = OnceLock::new();
    let path = PATH.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("podlock-curl-path-")
            .tempdir()
            .unwrap();
        for tool in ["curl", "sed", "uname"] {
            let found = Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .unwrap();
            assert!(found.status.success(), "{tool} is installed");
            let at = String::from_utf8(found.stdout).unwrap();
            std::os::unix::fs::symlink(at.trim(), dir.path().join(tool)).unwrap();
        }
        dir
    });
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("curl.sh")
        .current_dir(EXAMPLES)
        .env_clear()
        .env("PATH", path.path())
        .env("PODLOCK_ADDR", &sidecar.addr)
        .env("STORE_URL", store)
        .env("PODLOCK_CONTAINER", "app")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Waits up to `limit` for `child` to exit; its output, or a panic naming `what` (it is killed).
async fn exit_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{what} still ran {limit:?} later:\n{}", text(&out));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.wait_with_output().unwrap()
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test]
async fn every_example_takes_the_lock_writes_fenced_and_releases_or_says_why_not() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["report"]);
    let s = Sidecar::start(&etcd.endpoint, "example-pod", &[]).await;
    let store = FencedStore::start().await;
    let curl = curl_sh(&s, &store.url).output().unwrap();
    assert!(curl.status.success(), "curl.sh: {}", text(&curl));
    let mut tokens = vec![];
    for example in [PYTHON, GO, NODE, JAVA] {
        let child = example.spawn(&s, &store, &[("WORK_ITEMS", "3")]);
        let out = exit_within(child, Duration::from_secs(60), example.program).await;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(0), "{}: {}", example.program, text(&out));
        assert!(stdout.ends_with("released\n"), "{}: {stdout}", example.program);
        let token: i64 = (stdout.lines())
            .find_map(|l| l.strip_prefix("acquired report with fencing token "))
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{}: no token in {stdout}", example.program));
        tokens.push(token);
        assert_eq!(store.accepted_from(example.writer).len(), 3, "{}", example.writer);
        // A hold bound to its connection is released as the connection closes, at once.
        let free = wait_until(Duration::from_secs(2), || async {
            s.get("/v1/locks/report").await.1["held"] == false
        });
        free.await
            .unwrap_or_else(|e| panic!("{} left the lock held: {e}", example.program));

        let child = example.spawn(&s, &store, &[("LOCK", "undeclared")]);
        let out = exit_within(child, Duration::from_secs(60), example.program).await;
        assert_eq!(out.status.code(), Some(1), "{}: {}", example.program, text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("could not acquire undeclared: lock_not_found"),
            "{}: {stderr}",
            example.program
        );
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens rise: {tokens:?}");
    let state = store.state().await;
    assert_eq!(state["accepted"], 13, "{state}");
    assert_eq!(state["rejected"], 0, "{state}");
}

/// How long the holder keeps the lock once an example waits for it: longer than any fixed
/// request timeout an example had (the Python one gave up after 2 s, dropping its place).
const HELD: Duration = Duration::from_secs(4);

/// Each example, started while another holder keeps the lock for `HELD`, waits in the queue
/// all that time (its waitSeconds is 30), then gets the lock, writes with its token and
/// releases.
#[tokio::test]
async fn every_example_waits_in_the_queue_while_the_lock_is_held_for_seconds() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["report"]);
    let s = Sidecar::start(&etcd.endpoint, "example-pod", &[]).await;
    let store = FencedStore::start().await;
    for example in [PYTHON, GO, NODE, JAVA] {
        let what = example.program;
        let held = json!({"holderId": "holder"});
        let holder_token = s.must_acquire("report", held.clone()).await;
        let mut child = example.spawn(&s, &store, &[("WORK_ITEMS", "3")]);
        let waiting = wait_until(Duration::from_secs(30), || async {
            s.get("/v1/locks/report").await.1["waiters"] == 1
        });
        (waiting.await).unwrap_or_else(|e| panic!("{what} never waited: {e}"));
        let waits_from = now();
        tokio::time::sleep(HELD).await;
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            panic!("{what} gave up waiting ({status}): {}", text(&out));
        }
        let lock = s.get("/v1/locks/report").await.1;
        assert_eq!(lock["waiters"], 1, "{what} still waits in the queue: {lock}");
        let released_at = now();
        assert_eq!(s.post("report", "release", held).await.0, 200);
        let out = exit_within(child, Duration::from_secs(30), what).await;
        assert_eq!(out.status.code(), Some(0), "{what}: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let token: i64 = (stdout.lines())
            .find_map(|l| l.strip_prefix("acquired report with fencing token "))
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{what}: no token in {stdout}"));
        assert!(token > holder_token, "{what}: token {token} after {holder_token}");
        let writes = store.accepted_from(example.writer);
        assert_eq!(writes.len(), 3, "{what}: {writes:?}");
        let first = writes[0] - released_at;
        assert!(
            first > 0.0,
            "{what} wrote {first:.3} s before the holder released"
        );
        eprintln!(
            "{what}: waited {:.3} s in the queue; first write {first:.3} s after the release",
            released_at - waits_from
        );
    }
    let state = store.state().await;
    assert_eq!(state["accepted"], 12, "{state}");
    assert_eq!(state["rejected"], 0, "{state}");
}

/// `curl.sh` needs no bash nor python3 (it runs by dash with only curl, sed and uname), names a
/// holder of its own on each run (two runs at once wait in turn, each with its own token), and
/// releases the lock whenever it exits: after a failed write, and on SIGTERM mid-write.
#[tokio::test]
async fn curl_sh_holds_as_a_holder_of_its_own_and_releases_on_any_exit() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["report"]);
    let s = Sidecar::start(&etcd.endpoint, "example-pod", &[]).await;
    let store = FencedStore::start().await;
    let free = || async { s.get("/v1/locks/report").await.1["held"] == false };

    // Two runs queued behind a holder: each waits, then holds and writes in turn.
    let held = json!({"holderId": "holder"});
    s.must_acquire("report", held.clone()).await;
    let runs: Vec<Child> = (0..2)
        .map(|_| spawn_dying_with_parent(&mut curl_sh(&s, &store.url)))
        .collect();
    let waiting = wait_until(Duration::from_secs(10), || async {
        s.get("/v1/locks/report").await.1["waiters"] == 2
    });
    waiting.await.expect("both runs wait in the queue");
    tokio::time::sleep(HELD).await;
    assert_eq!(s.post("report", "release", held).await.0, 200);
    let mut holders = vec![];
    for run in runs {
        let out = exit_within(run, Duration::from_secs(30), "curl.sh").await;
        assert_eq!(out.status.code(), Some(0), "curl.sh: {}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(stdout.ends_with("released\n"), "curl.sh: {stdout}");
        let line = (stdout.lines())
            .find_map(|l| l.strip_prefix("acquired report with fencing token "))
            .unwrap_or_else(|| panic!("curl.sh: no grant in {stdout}"));
        let (token, holder) = line.split_once(" as ").unwrap();
        holders.push((token.parse::<i64>().unwrap(), holder.to_string()));
    }
    eprintln!("two curl.sh runs at once held as {holders:?}");
    assert_ne!(holders[0].0, holders[1].0, "each run its own token");
    assert_ne!(holders[0].1, holders[1].1, "each run its own holder id");
    assert_eq!(store.accepted_from("curl-example").len(), 2);
    wait_until(Duration::from_secs(2), free)
        .await
        .expect("lock free after both");

    // A write that fails (no store there): exit 1, and the lock released on the way out.
    let gone = format!("http://127.0.0.1:{}", crate::common::free_port());
    let out = curl_sh(&s, &gone).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "curl.sh: {}", text(&out));
    assert!(text(&out).contains("the write failed"), "{}", text(&out));
    let lock = s.get("/v1/locks/report").await.1;
    assert_eq!(
        lock["held"], false,
        "curl.sh left the lock held after a failed write: {lock}"
    );

    // SIGTERM to the run (its process group, as a terminal's or a pod's stop does) while its
    // write hangs on a store that never answers: exit 143, and the lock released.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    let run = spawn_dying_with_parent(curl_sh(&s, &silent_url).process_group(0));
    silent.set_nonblocking(true).unwrap();
    let start = Instant::now();
    let _write = loop {
        if let Ok((write, _)) = silent.accept() {
            break write; // kept open, unanswered
        }
        assert!(start.elapsed() < Duration::from_secs(10), "curl.sh never wrote");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(s.get("/v1/locks/report").await.1["held"], true);
    // SAFETY: kill(2) on the process group the run leads.
    unsafe { libc::kill(-(run.id() as i32), libc::SIGTERM) };
    let out = exit_within(run, Duration::from_secs(10), "curl.sh").await;
    assert_eq!(out.status.code(), Some(143), "curl.sh: {}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).ends_with("released\n"),
        "{}",
        text(&out)
    );
    let lock = s.get("/v1/locks/report").await.1;
    assert_eq!(
        lock["held"], false,
        "curl.sh left the lock held after SIGTERM: {lock}"
    );
}

/// How an example loses its lock.
#[derive(Debug, Clone, Copy)]
enum Loss {
    /// Its queue key deleted in etcd (as a force release or a stray `etcdctl del` does).
    KeyDeleted,
    /// Its lease revoked in etcd (as the operator does when its pod dies).
    LeaseRevoked,
    /// Its lock deleted (`podlock declare --delete`, as deleting the DistributedLock does).
    LockDeleted,
    /// Its sidecar stopped by SIGTERM (it reports `lost`, then exits).
    SidecarStopped,
    /// Its sidecar killed by SIGKILL: the connections drop without a word.
    SidecarKilled,
    /// Its sidecar frozen by SIGSTOP: connections open, nothing answers.
    SidecarFrozen,
}

impl Loss {
    /// The longest the example may take to learn of the loss (and may still write meanwhile):
    /// a `lost` event comes within 1 s; a frozen sidecar is noticed by its silence (three missed
    /// 1 s keep-alive lines) or an unanswered heartbeat (every 5/3 s, 2 s to answer).
    fn noticed_within(self) -> Duration {
        match self {
            Loss::SidecarFrozen => Duration::from_secs(6),
            _ => Duration::from_secs(1),
        }
    }

    async fn inflict(self, etcd: &EtcdServer, sidecar: &mut Sidecar) {
        let mut client = etcd.client().await;
        let prefix = || Some(etcd_client::GetOptions::new().with_prefix());
        match self {
            Loss::KeyDeleted => {
                let opts = etcd_client::DeleteOptions::new().with_prefix();
                let deleted = client.delete(REPORT_KEYS, Some(opts)).await.unwrap();
                assert_eq!(deleted.deleted(), 1, "the example's key, alone");
            }
            Loss::LeaseRevoked => {
                let found = client.get(REPORT_KEYS, prefix()).await.unwrap();
                let lease = found.kvs().first().expect("the example's key").lease();
                client.lease_revoke(lease).await.unwrap();
            }
            Loss::LockDeleted => declare(&etcd.endpoint, &["report", "--delete"]),
            Loss::SidecarStopped => assert!(sidecar.terminate().success()),
            Loss::SidecarKilled => sidecar.kill9(),
            Loss::SidecarFrozen => sidecar.signal(libc::SIGSTOP),
        }
    }
}

/// Runs `example` with endless work, makes it lose its lock once it writes, and checks that it
/// wrote nothing once it could have known, and exited 75 saying so.
async fn stops_work_on(example: Example, loss: Loss) {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["report"]);
    let mut s = Sidecar::start(&etcd.endpoint, "example-pod", &[]).await;
    let store = FencedStore::start().await;
    let child = example.spawn(&s, &store, &[("WORK_ITEMS", "100000")]);
    let working = wait_until(Duration::from_secs(60), || async {
        store.accepted_from(example.writer).len() >= 3
    });
    working
        .await
        .unwrap_or_else(|e| panic!("{} never wrote: {e}", example.program));
    let lost_at = now();
    loss.inflict(&etcd, &mut s).await;
    let limit = loss.noticed_within() + Duration::from_secs(5);
    let out = exit_within(child, limit, example.program).await;
    let exited = now() - lost_at;
    let what = format!("{} on {loss:?}", example.program);
    assert_eq!(out.status.code(), Some(EXIT_LOST), "{what}: {}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lost report: "), "{what}: {stderr}");
    let writes = store.accepted_from(example.writer);
    let last = writes.last().unwrap() - lost_at;
    eprintln!(
        "{what}: {} writes; the last {last:+.3} s from the loss; exited {exited:.3} s after it: {}",
        writes.len(),
        stderr.trim()
    );
    assert!(
        last < loss.noticed_within().as_secs_f64(),
        "{what}: wrote {last:.3} s after the loss"
    );
    let account = format!("stopped after {} writes", writes.len());
    assert!(stderr.contains(&account), "{what}: the store has {account}");
}

#[tokio::test]
async fn python_stops_work_when_its_key_is_deleted() {
    stops_work_on(PYTHON, Loss::KeyDeleted).await;
}

#[tokio::test]
async fn python_stops_work_when_its_sidecar_is_killed() {
    stops_work_on(PYTHON, Loss::SidecarKilled).await;
}

#[tokio::test]
async fn python_stops_work_when_its_sidecar_freezes() {
    stops_work_on(PYTHON, Loss::SidecarFrozen).await;
}

#[tokio::test]
async fn go_stops_work_when_its_lease_is_revoked() {
    stops_work_on(GO, Loss::LeaseRevoked).await;
}

#[tokio::test]
async fn go_stops_work_when_its_sidecar_is_killed() {
    stops_work_on(GO, Loss::SidecarKilled).await;
}

#[tokio::test]
async fn go_stops_work_when_its_sidecar_freezes() {
    stops_work_on(GO, Loss::SidecarFrozen).await;
}

#[tokio::test]
async fn node_stops_work_when_its_lock_is_deleted() {
    stops_work_on(NODE, Loss::LockDeleted).await;
}

#[tokio::test]
async fn node_stops_work_when_its_sidecar_is_killed() {
    stops_work_on(NODE, Loss::SidecarKilled).await;
}

#[tokio::test]
async fn node_stops_work_when_its_sidecar_freezes() {
    stops_work_on(NODE, Loss::SidecarFrozen).await;
}

#[tokio::test]
async fn java_stops_work_when_its_sidecar_stops() {
    stops_work_on(JAVA, Loss::SidecarStopped).await;
}

#[tokio::test]
async fn java_stops_work_when_its_sidecar_is_killed() {
    stops_work_on(JAVA, Loss::SidecarKilled).await;
}

#[tokio::test]
async fn java_stops_work_when_its_sidecar_freezes() {
    stops_work_on(JAVA, Loss::SidecarFrozen).await;
}
