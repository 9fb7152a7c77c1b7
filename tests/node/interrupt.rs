//! `scripts/demo.sh` interrupted as a terminal would (Ctrl-C: SIGINT to its process group) or
//! by a SIGTERM to its process group, at a step of its run: it exits within seconds and leaves
//! no process, mount, bridge, iptables chain, ipset or pod cgroup behind.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::node::{BED, can_run};

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/demo.sh");

/// How long the demo may take to exit after the signal: the node's teardown (containers killed,
/// the bridge, rules and cgroups removed) takes a few seconds; this leaves headroom.
const EXIT_WITHIN: Duration = Duration::from_secs(45);

/// How long the demo may take to reach the step to interrupt (its release build and images
/// included).
const REACH_WITHIN: Duration = Duration::from_secs(900);

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_interrupted_at_any_step_leaves_nothing_behind() {
    if !can_run() {
        return;
    }
    let _bed = BED.lock().await;
    // SIGTERM while the chart installs (the node is up, pods start); Ctrl-C once pods contend.
    // (The demo's step lines are "[demo] TEXT" with the tag in bold: match the text.)
    interrupt(libc::SIGTERM, "helm install podlock", Duration::from_secs(5));
    interrupt(libc::SIGINT, "three pods contend", Duration::from_secs(1));
}

/// Runs the demo in a process group of its own until its stderr shows `step`, waits `then`,
/// sends `signal` to the group, and checks that it exits promptly and leaves nothing behind.
fn interrupt(signal: i32, step: &str, then: Duration) {
    let tmp = tempfile::Builder::new()
        .prefix("podlock-demo-")
        .tempdir()
        .unwrap();
    let mut demo = Command::new("bash")
        .arg(DEMO)
        .env("TMPDIR", tmp.path()) // the demo's directory (mktemp -d) goes under `tmp`
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let group = demo.id() as i32;
    let reached_step = Arc::new(AtomicBool::new(false));
    let watchdog = reached_step.clone();
    std::thread::spawn(move || {
        std::thread::sleep(REACH_WITHIN);
        if !watchdog.load(Ordering::SeqCst) {
            // Ends the read below (the demo's stderr closes), which then fails the test.
            unsafe { libc::kill(-group, libc::SIGKILL) };
        }
    });
    let mut lines = BufReader::new(demo.stderr.take().unwrap()).lines();
    let reached = lines.by_ref().map_while(Result::ok).any(|line| {
        eprintln!("  | {line}");
        line.contains(step)
    });
    reached_step.store(true, Ordering::SeqCst);
    assert!(
        reached,
        "the demo ended, or did not reach {step:?} within {REACH_WITHIN:?}"
    );
    std::thread::sleep(then);
    let sent = Instant::now();
    unsafe { libc::kill(-group, signal) };
    // Keep reading, so that the demo never blocks on a full pipe while it tears down.
    let echo = std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| eprintln!("  | {l}")));
    let status = loop {
        if let Some(status) = demo.try_wait().unwrap() {
            break status;
        }
        if sent.elapsed() > EXIT_WITHIN {
            unsafe { libc::kill(-group, libc::SIGKILL) };
            panic!("the demo did not exit within {EXIT_WITHIN:?} of signal {signal} at {step:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = sent.elapsed();
    echo.join().unwrap();
    eprintln!(
        "signal {signal} at {step:?}: the demo exited ({status}) {:.1} s later",
        took.as_secs_f64()
    );
    assert!(
        matches!(status.code(), Some(130 | 143)),
        "the demo's exit: {status}"
    );
    let left = leftovers(tmp.path());
    assert!(
        left.is_empty(),
        "left behind after signal {signal} at {step:?}:\n{}",
        left.join("\n")
    );
}

/// What a node of the demo could leave: processes and mounts under its directory, processes in
/// the pods' cgroups, the bridge, the rules' chains, the kubepods cgroups, files of the demo.
fn leftovers(tmp: &Path) -> Vec<String> {
    let prefix = tmp.to_string_lossy().into_owned();
    let mut left = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&prefix) {
            left.push(format!(
                "process {}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    left.extend(
        mounts
            .lines()
            .filter(|m| m.contains(&prefix))
            .map(|m| format!("mount {m}")),
    );
    if Command::new("ip")
        .args(["link", "show", "podlock0"])
        .output()
        .unwrap()
        .status
        .success()
    {
        left.push("the bridge podlock0".into());
    }
    for table in ["filter", "nat"] {
        let rules = Command::new("iptables")
            .args(["-t", table, "-S"])
            .output()
            .unwrap();
        let rules = String::from_utf8_lossy(&rules.stdout).into_owned();
        left.extend(
            (rules.lines())
                .filter(|r| ["KUBE-", "CNI-", "PODLOCK-NODE"].iter().any(|c| r.contains(c)))
                .map(|r| format!("iptables -t {table}: {r}")),
        );
    }
    let sets = Command::new("ipset").args(["list", "-n"]).output().unwrap();
    left.extend(
        (String::from_utf8_lossy(&sets.stdout).lines())
            .filter(|s| s.starts_with("KUBE-") || s.starts_with("kube-router"))
            .map(|s| format!("ipset {s}")),
    );
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        if hierarchy.path().join("kubepods").exists() {
            left.push(format!("cgroup {}/kubepods", hierarchy.path().display()));
        }
    }
    left.extend(
        std::fs::read_dir(tmp)
            .unwrap()
            .flatten()
            .map(|f| format!("file {}", f.path().display())),
    );
    left
}
