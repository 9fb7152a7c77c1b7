//! `podlock lock NAME -- CMD`: token in the environment, exit status passed through, SIGTERM
//! to CMD when the hold is lost.

use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::Command;

use crate::common::{EtcdServer, Sidecar, declare, podlock_bin};

fn lock_cmd(sidecar: &Sidecar, args: &[&str]) -> Command {
    lock_cmd_under(sidecar, &[], args)
}

/// `podlock lock ARGS` run by `wrapper` (a command and its arguments, e.g. `unshare --pid
/// --fork`; none: run directly).
fn lock_cmd_under(sidecar: &Sidecar, wrapper: &[&str], args: &[&str]) -> Command {
    let mut cmd = match wrapper.split_first() {
        Some((program, wrapper_args)) => {
            let mut cmd = Command::new(program);
            cmd.args(wrapper_args).arg(podlock_bin());
            cmd
        }
        None => Command::new(podlock_bin()),
    };
    cmd.arg("lock")
        .args(args)
        .env("PODLOCK_ADDR", &sidecar.addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

#[tokio::test]
async fn runs_the_command_with_its_token_and_passes_its_exit_status() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["cmd"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let out = lock_cmd(
        &s,
        &[
            "cmd",
            "--",
            "sh",
            "-c",
            "echo token=$PODLOCK_FENCING_TOKEN; exit 7",
        ],
    )
    .output()
    .await
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let token: i64 = stdout
        .trim()
        .strip_prefix("token=")
        .unwrap()
        .parse()
        .expect("numeric token");
    assert!(token > 0);
    // Released on exit: the lock is free and the next run gets a larger token.
    assert_eq!(s.get("/v1/locks/cmd").await.1["held"], false);
    let out = lock_cmd(&s, &["cmd", "--", "sh", "-c", "echo $PODLOCK_FENCING_TOKEN"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    let next: i64 = String::from_utf8(out.stdout).unwrap().trim().parse().unwrap();
    assert!(next > token);
}

#[tokio::test]
async fn a_held_lock_with_no_wait_exits_1_without_running_the_command() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["busy"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    s.must_acquire("busy", serde_json::json!({"holderId": "someone"}))
        .await;
    let out = lock_cmd(&s, &["busy", "--wait", "0", "--", "sh", "-c", "echo ran"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "the command must not run");
    assert!(String::from_utf8_lossy(&out.stderr).contains("someone"));
}

#[tokio::test]
async fn a_lost_hold_sends_sigterm_to_the_command_and_exits_non_zero() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["lost"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let script = "trap 'echo got-sigterm; exit 0' TERM; echo started; while true; do sleep 0.05; done";
    let child = lock_cmd(&s, &["lost", "--", "sh", "-c", script]).spawn().unwrap();
    crate::common::wait_until(Duration::from_secs(5), || async {
        s.get("/v1/locks/lost").await.1["held"] == true
    })
    .await
    .unwrap();
    let deleted = Instant::now();
    declare(&etcd.endpoint, &["lost", "--delete"]);
    let out = tokio::time::timeout(Duration::from_secs(5), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    eprintln!(
        "podlock lock exited {:?} after the lock's deletion",
        deleted.elapsed()
    );
    assert!(deleted.elapsed() < Duration::from_secs(2));
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("got-sigterm"));
}

#[tokio::test]
async fn the_hold_records_the_container_from_podlock_container() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["named"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let mut run = lock_cmd(&s, &["named", "--", "sleep", "3"])
        .env("PODLOCK_CONTAINER", "app")
        .spawn()
        .unwrap();
    let c = etcd.client().await;
    let mut value = serde_json::Value::Null;
    for _ in 0..150 {
        let opts = etcd_client::GetOptions::new().with_prefix();
        let found = c
            .clone()
            .get("/podlock/v1/queue/default/named/", Some(opts))
            .await
            .unwrap();
        if let Some(kv) = found.kvs().first() {
            value = serde_json::from_slice(kv.value()).unwrap();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(value["container"], "app", "{value}");
    assert!(run.wait().await.unwrap().success());
    // A name Kubernetes would not accept is refused, naming the field.
    let out = lock_cmd(&s, &["named", "--", "true"])
        .env("PODLOCK_CONTAINER", "App_1")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("container"));
}

#[tokio::test]
async fn kill_9_of_podlock_lock_frees_the_lock_at_once_and_stops_the_command() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["crash", "--ttl-seconds", "30"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let script = format!("echo $$ > {}; exec sleep 30", pid_file.path().display());
    let mut run = lock_cmd(&s, &["crash", "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    let cmd_pid = crate::common::wait_until(Duration::from_secs(5), || async {
        std::fs::read_to_string(pid_file.path()).is_ok_and(|p| !p.trim().is_empty())
    })
    .await
    .map(|_| {
        std::fs::read_to_string(pid_file.path())
            .unwrap()
            .trim()
            .parse::<i32>()
            .unwrap()
    })
    .expect("the command started");
    let killed = Instant::now();
    run.start_kill().unwrap(); // SIGKILL: no release, no cleanup
    let token = s
        .must_acquire("crash", serde_json::json!({"holderId": "next", "waitSeconds": 5}))
        .await;
    let took = killed.elapsed();
    eprintln!("podlock lock killed (kill -9): the lock was free again {took:?} later (TTL 30 s)");
    assert!(took < Duration::from_secs(1) && token > 0);
    let gone = crate::common::wait_until(Duration::from_secs(2), || async {
        // SAFETY: signal 0 only checks that the process exists.
        unsafe { libc::kill(cmd_pid, 0) != 0 }
    })
    .await;
    assert!(gone.is_ok(), "the command outlived podlock lock and its hold");
}

/// Finding 1 of the safety review, for `podlock lock`: its default holder id was `HOSTNAME:pid`,
/// the same for two containers of a pod whose commands each run as PID 1. Two runs that share
/// a hostname and are each PID 1 (each in a PID namespace of its own, as in a container) are
/// two holders: the second waits for the first.
#[tokio::test]
async fn two_runs_as_pid_1_with_one_hostname_are_two_holders() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["once"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let as_pid_1 = |args: &[&str]| {
        let mut cmd = lock_cmd_under(&s, &["unshare", "--pid", "--fork"], args);
        cmd.env("HOSTNAME", "pod-a");
        cmd
    };
    let mut first = as_pid_1(&["once", "--", "sleep", "3"]).spawn().unwrap();
    crate::common::wait_until(Duration::from_secs(5), || async {
        s.get("/v1/locks/once").await.1["held"] == true
    })
    .await
    .expect("the first run holds");
    let second = as_pid_1(&["once", "--wait", "0", "--", "true"])
        .output()
        .await
        .unwrap();
    assert_eq!(
        second.status.code(),
        Some(1),
        "a second run with the same hostname and PID shared the first one's hold: {}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(first.wait().await.unwrap().success());
}

/// `podlock lock A B -- CMD` holds both locks while CMD runs, and tells CMD both names.
#[tokio::test]
async fn several_names_are_held_as_one_while_the_command_runs() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["a"]);
    declare(&etcd.endpoint, &["b"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let script = "echo \"$PODLOCK_LOCK $PODLOCK_FENCING_TOKEN\"; sleep 1";
    let run = lock_cmd(&s, &["a", "b", "--", "sh", "-c", script])
        .spawn()
        .unwrap();
    let held = crate::common::wait_until(Duration::from_secs(5), || async {
        s.get("/v1/locks/b").await.1["held"] == true
    });
    held.await.expect("b held while the command runs");
    let (status, body) = s
        .post(
            "a",
            "acquire",
            serde_json::json!({"holderId": "x", "waitSeconds": 0}),
        )
        .await;
    assert_eq!(status, 409, "a was free while the command ran: {body}");
    let out = run.wait_with_output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let (names, token) = stdout.trim().split_once(' ').unwrap();
    assert_eq!(names, "a,b");
    assert!(token.parse::<i64>().unwrap() > 0, "{stdout}");
    for lock in ["a", "b"] {
        assert_eq!(
            s.get(&format!("/v1/locks/{lock}")).await.1["held"],
            false,
            "{lock} outlived the run"
        );
    }
}

/// Issue #41: `podlock lock` inside `podlock lock` took the holder id the outer one exported
/// (`PODLOCK_HOLDER_ID`), acting as the outer run's holder (of the same lock: 409
/// `holder_in_use`). Each run is a holder of its own; an id the user sets is still taken.
/// Failed before with `inner Some("podlock:5ca1...")`, `outer` the same.
#[tokio::test]
async fn a_podlock_lock_nested_in_another_holds_under_its_own_id() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["outer"]);
    declare(&etcd.endpoint, &["inner"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let podlock = podlock_bin();
    let inner = format!(
        "{podlock} lock inner -- sh -c 'echo inner=$PODLOCK_HOLDER_ID'; echo outer=$PODLOCK_HOLDER_ID"
    );
    let out = lock_cmd(&s, &["outer", "--", "sh", "-c", &inner])
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let id = |prefix: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(String::from)
    };
    let (inner, outer) = (id("inner="), id("outer="));
    assert!(
        inner.is_some() && inner != outer,
        "inner {inner:?}, outer {outer:?}"
    );
    // An id the user chose is kept, nested or not.
    let chosen = format!("{podlock} lock inner --holder-id mine -- sh -c 'echo $PODLOCK_HOLDER_ID'");
    let out = lock_cmd(&s, &["outer", "--", "sh", "-c", &chosen])
        .output()
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "mine");
}

/// `--permits N` holds N of a semaphore's slots while the command runs; more than its
/// `maxHolders` is refused without running the command, the reason naming `permits`.
#[tokio::test]
async fn permits_take_that_many_slots_while_the_command_runs() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["pool", "--max-holders", "3"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let holders = "curl -s $PODLOCK_ADDR/v1/locks/pool";
    let out = lock_cmd(&s, &["pool", "--permits", "2", "--", "sh", "-c", holders])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["holders"][0]["permits"], 2, "{info}");
    let out = lock_cmd(&s, &["pool", "--permits", "4", "--", "sh", "-c", "echo ran"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "the command must not run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("permits 4 is above") && stderr.contains("maxHolders 3"),
        "{stderr}"
    );
}
