//! Issue #55, item 1: the sidecar and the operator read etcd's version at start and, below
//! podlock's documented minimum, say so in their log (naming the version found, the minimum and
//! each missing fix), in `podlock_etcd_below_minimum` and, from the operator, in a Warning Event
//! on its own Pod. Against a real etcd 3.5.17 (`scripts/setup.sh`'s `etcd-v3.5.17`) and the
//! current one; with no sidecar or operator change, every assertion on the old etcd fails.

use serde_json::json;
use std::time::Duration;

use crate::common::kube::{Operator, with_crd};
use crate::common::{EtcdServer, Sidecar, bin_dir, declare, wait_until};
use crate::dashboards::reports;
use crate::force_release::event;
use podlock::lock::{FIXES, MINIMUM};

/// The etcd release `scripts/setup.sh` installs as `etcd`, as it says it (`3.6.16`).
fn current_release() -> String {
    let out = std::process::Command::new(bin_dir().join("etcd"))
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let version = text.lines().find_map(|l| l.strip_prefix("etcd Version: "));
    version
        .unwrap_or_else(|| panic!("no version in {text}"))
        .trim()
        .to_string()
}

/// Waits until `s`'s metrics show `line`.
async fn exports(s: &Sidecar, line: &str) {
    let seen = wait_until(Duration::from_secs(10), || async {
        s.get("/metrics")
            .await
            .1
            .as_str()
            .is_some_and(|m| m.contains(line))
    })
    .await;
    seen.unwrap_or_else(|e| panic!("no {line} ({e}):\n{}", s.log()));
}

/// Asserts that a line of `text` names the version found, the minimum and every fix 3.5 lacks.
fn names_every_missing_fix(text: &str) {
    let head = format!("etcd 3.5.17 is below podlock's documented minimum {MINIMUM}");
    let line = text.lines().find(|l| l.contains(&head));
    let line = line.unwrap_or_else(|| panic!("no {head:?} in:\n{text}"));
    for fix in &FIXES {
        let named = format!("{} (fixed in {})", fix.what, fix.since);
        assert!(line.contains(&named), "no {named:?} in:\n{line}");
    }
}

#[tokio::test]
async fn a_sidecar_on_etcd_3_5_warns_naming_each_missing_fix_and_one_on_the_current_does_not() {
    let (old, current) = (
        EtcdServer::start_release("3.5.17").await,
        EtcdServer::start().await,
    );
    let behind = Sidecar::start(&old.endpoint, "pod-behind", &[]).await;
    let current_sidecar = Sidecar::start(&current.endpoint, "pod-current", &[]).await;

    exports(&behind, "podlock_etcd_version_info{version=\"3.5.17\"} 1").await;
    exports(&behind, "podlock_etcd_below_minimum 1").await;
    names_every_missing_fix(&behind.log());

    let release = current_release();
    exports(
        &current_sidecar,
        &format!("podlock_etcd_version_info{{version=\"{release}\"}} 1"),
    )
    .await;
    exports(&current_sidecar, "podlock_etcd_below_minimum 0").await;
    let log = current_sidecar.log();
    assert!(log.contains("meets podlock's minimum"), "{log}");
    assert!(!log.contains("below podlock's documented minimum"), "{log}");
    // Locks work on the old etcd all the same: the warning is no refusal.
    declare(&old.endpoint, &["work"]);
    behind.must_acquire("work", json!({})).await;
}

#[tokio::test]
async fn the_operator_on_etcd_3_5_warns_in_an_event_on_its_own_pod() {
    let plane = with_crd();
    let ns = plane.namespace("etcd-version");
    // The operator's Pod as the API server has it (no kubelet runs it here).
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "operator-0", "namespace": ns},
        "spec": {"containers": [{"name": "operator", "image": "podlock:test"}]}});
    let (ok, _, err) = plane.kubectl_stdin(&["apply", "-f", "-"], &pod.to_string());
    assert!(ok, "{err}");
    let old = EtcdServer::start_release("3.5.17").await;
    let op = Operator::start_with(plane, &ns, &old.endpoint, &["--pod-name", "operator-0"]).await;

    reports(&op, "podlock_etcd_below_minimum 1").await;
    reports(&op, "podlock_etcd_version_info{version=\"3.5.17\"} 1").await;
    let (kind, message) = event(plane, &ns, "operator-0", "EtcdBelowMinimum").await;
    assert_eq!(kind, "Warning");
    names_every_missing_fix(&message);
    names_every_missing_fix(&op.log());
    // On the Pod itself, uid and all, as `kubectl describe pod` finds its Events.
    let json_of = |args: &[&str]| {
        let (ok, out, err) = plane.kubectl(&[args, &["-n", &ns, "-o", "json"]].concat());
        assert!(ok, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let pod_uid = json_of(&["get", "pod", "operator-0"])["metadata"]["uid"].clone();
    let events = json_of(&["get", "events", "--field-selector", "reason=EtcdBelowMinimum"]);
    assert_eq!(events["items"][0]["involvedObject"]["uid"], pod_uid, "{events}");
}
