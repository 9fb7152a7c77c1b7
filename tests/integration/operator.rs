//! The operator and the DistributedLock CRD on a real kube-apiserver (no kubelet).

use kube::api::Api;
use podlock::crd::DistributedLock;
use serde_json::json;
use std::time::{Duration, Instant};

use crate::common::kube::{ControlPlane, Operator, with_crd};
use crate::common::{Sidecar, wait_until};

const CRD: &str = include_str!("../../crds/distributedlock.yaml");

#[test]
fn crds_dir_holds_exactly_what_podlock_crd_prints() {
    let out = std::process::Command::new(crate::common::podlock_bin())
        .arg("crd")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        CRD,
        "crds/ is stale: run `podlock crd > crds/distributedlock.yaml`"
    );
}

pub(crate) fn lock_yaml(ns: &str, name: &str, spec: &str) -> String {
    format!(
        "apiVersion: podlock.io/v1alpha1\nkind: DistributedLock\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec: {spec}\n"
    )
}

#[tokio::test]
async fn the_crd_rejects_invalid_specs_naming_the_field_and_fills_defaults() {
    let plane = with_crd();
    let ns = plane.namespace("crd-check");
    for (spec, field) in [
        ("{ttlSeconds: 1}", "spec.ttlSeconds"),
        ("{ttlSeconds: 3601}", "spec.ttlSeconds"),
        ("{maxHolders: 0}", "spec.maxHolders"),
        ("{maxHolders: 10001}", "spec.maxHolders"),
        ("{heartbeatTimeoutSeconds: -1}", "spec.heartbeatTimeoutSeconds"),
        ("{maxHoldSeconds: -1}", "spec.maxHoldSeconds"),
        ("{maxHoldSeconds: 604801}", "spec.maxHoldSeconds"),
        ("{ttlSeconds: soon}", "spec.ttlSeconds"),
        ("{holderService: {ports: []}}", "spec.holderService.ports"),
        (
            "{holderService: {ports: [{port: 0}]}}",
            "spec.holderService.ports[0].port",
        ),
        (
            "{holderService: {ports: [{port: 80}, {port: 81}]}}",
            "every port needs a name",
        ),
        (
            "{holderService: {ports: [{name: a, port: 80}, {name: b, port: 80}]}}",
            "same port",
        ),
        (
            "{holderService: {name: Leader, ports: [{port: 80}]}}",
            "spec.holderService.name",
        ),
        (
            "{holderService: {ports: [{port: 80, protocol: HTTP}]}}",
            "spec.holderService.ports[0].protocol",
        ),
        ("{yieldGraceSeconds: 0}", "spec.yieldGraceSeconds"),
    ] {
        let (ok, _, err) = plane.kubectl_stdin(&["apply", "-f", "-"], &lock_yaml(&ns, "bad", spec));
        assert!(!ok, "{spec} was accepted");
        assert!(err.contains(field), "{spec}: error does not name {field}: {err}");
    }
    let (ok, _, err) = plane.kubectl_stdin(&["apply", "-f", "-"], &lock_yaml(&ns, "plain", "{}"));
    assert!(ok, "{err}");
    let (_, spec, _) = plane.kubectl(&["get", "dlock", "plain", "-n", &ns, "-o", "jsonpath={.spec}"]);
    let spec: serde_json::Value = serde_json::from_str(&spec).unwrap();
    assert_eq!(
        spec,
        json!({"ttlSeconds": 15, "maxHolders": 1, "heartbeatTimeoutSeconds": 0, "maxHoldSeconds": 0,
            "yieldGraceSeconds": 30})
    );
}

/// Applies DistributedLock `name` with `spec` in `ns` and waits until its status shows it Free
/// (the operator has seen it).
pub(crate) async fn declare_until_free(
    plane: &ControlPlane,
    api: &Api<DistributedLock>,
    ns: &str,
    name: &str,
    spec: &str,
) {
    plane.kubectl_stdin(&["apply", "-f", "-"], &lock_yaml(ns, name, spec));
    status_until(api, name, "Free", |s| s.phase.as_deref() == Some("Free")).await;
}

/// Polls the lock's status until `check` holds; returns how long that took.
pub(crate) async fn status_until(
    api: &Api<DistributedLock>,
    name: &str,
    what: &str,
    check: impl Fn(&podlock::crd::DistributedLockStatus) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        if let Ok(dl) = api.get_status(name).await
            && dl.status.as_ref().is_some_and(&check)
        {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "status never showed {what}: {:?}",
            api.get_status(name).await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(crate) async fn operator_for(plane: &ControlPlane, ns: &str) -> Operator {
    Operator::start(plane, ns).await
}

#[tokio::test]
async fn status_follows_etcd_within_a_second() {
    let plane = with_crd();
    let ns = plane.namespace("status");
    let _op = operator_for(plane, &ns).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    declare_until_free(plane, &api, &ns, "work", "{ttlSeconds: 20}").await;
    let sidecar = |pod: &'static str| Sidecar::start(&plane.etcd.endpoint, pod, &["--namespace", "status"]);
    let (a, b) = (
        sidecar("pod-a").await,
        std::sync::Arc::new(sidecar("pod-b").await),
    );

    let mut lags = vec![];
    let t = a.must_acquire("work", json!({})).await;
    lags.push(
        status_until(&api, "work", "a holds", |s| {
            s.phase.as_deref() == Some("Held")
                && s.holders.first().is_some_and(|h| h.pod == "pod-a")
                && s.fencing_token == Some(t)
        })
        .await,
    );
    let b2 = b.clone();
    let waiting = tokio::spawn(async move { b2.must_acquire("work", json!({})).await });
    lags.push(status_until(&api, "work", "one waiter", |s| s.waiters == 1).await);
    let (_, list, _) = plane.kubectl(&["get", "dlock", "-n", &ns]);
    let header: Vec<&str> = list.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "HOLDER", "MODE", "WAITERS", "TOKEN", "TTL", "AGE"],
        "{list}"
    );
    let row: Vec<&str> = list.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..6],
        ["work", "pod-a", "exclusive", "1", &t.to_string(), "20"],
        "{list}"
    );

    assert_eq!(a.post("work", "release", json!({})).await.0, 200);
    let tb = waiting.await.unwrap();
    lags.push(
        status_until(&api, "work", "b holds", |s| {
            s.holders.first().is_some_and(|h| h.pod == "pod-b")
                && s.waiters == 0
                && s.fencing_token == Some(tb)
        })
        .await,
    );
    assert_eq!(b.post("work", "release", json!({})).await.0, 200);
    lags.push(
        status_until(&api, "work", "Free", |s| {
            s.phase.as_deref() == Some("Free") && s.holders.is_empty()
        })
        .await,
    );
    let dl = api.get_status("work").await.unwrap();
    assert_eq!(
        dl.status.unwrap().fencing_token,
        Some(tb),
        "the largest token stays after release"
    );
    eprintln!("status lag after each change: {lags:?}");
    let (_, events, _) = plane.kubectl(&[
        "get",
        "events",
        "-n",
        &ns,
        "--field-selector",
        "reason=HolderChanged",
        "-o",
        "name",
    ]);
    assert!(
        events.lines().count() >= 1,
        "no HolderChanged event (the recorder folds repeats into one series)"
    );
    let metrics = _op.metrics().await;
    for m in [
        "podlock_reconcile_total{result=\"ok\"}",
        "podlock_reconcile_duration_seconds_count",
        "podlock_operator_status_patch_seconds_count",
        "podlock_lock_holders{lock=\"work\",namespace=\"status\"} 0",
    ] {
        assert!(metrics.contains(m), "operator metrics lack {m}:\n{metrics}");
    }
    // The operator's part of each lag, stage by stage, was observed.
    let stages = [
        "podlock_operator_status_trigger_seconds_count",
        "podlock_operator_status_wait_seconds_count",
    ];
    let observed = _op.metric_values(stages).await;
    assert!(observed.iter().all(|n| *n > 0.0), "{stages:?}: {observed:?}");
    for lag in &lags {
        assert!(*lag < Duration::from_secs(1), "status lagged {lag:?}");
    }
}

#[tokio::test]
async fn deleting_the_object_ends_holds_and_leaves_no_etcd_keys() {
    let plane = with_crd();
    let ns = plane.namespace("deletion");
    let _op = operator_for(plane, &ns).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    declare_until_free(plane, &api, &ns, "doomed", "{}").await;
    let a = Sidecar::start(&plane.etcd.endpoint, "pod-a", &["--namespace", "deletion"]).await;
    let mut events = reqwest::get(format!("{}/v1/locks/doomed/events", a.addr))
        .await
        .unwrap();
    a.must_acquire("doomed", json!({})).await;
    let (ok, _, err) = plane.kubectl(&["delete", "dlock", "doomed", "-n", &ns, "--timeout=10s"]);
    assert!(ok, "{err}");
    let mut seen = String::new();
    let lost = tokio::time::timeout(Duration::from_secs(2), async {
        while !seen.contains("event: lost") {
            seen.push_str(&String::from_utf8_lossy(&events.chunk().await.unwrap().unwrap()));
        }
    })
    .await;
    assert!(lost.is_ok(), "no lost event: {seen}");
    assert_eq!(plane.etcd.count("/podlock/v1/config/deletion/doomed").await, 0);
    assert_eq!(plane.etcd.count("/podlock/v1/queue/deletion/doomed/").await, 0);
    assert_eq!(a.post("doomed", "acquire", json!({})).await.0, 404);
}

#[tokio::test]
async fn an_operator_restart_loses_nothing_and_cleans_orphans() {
    let plane = with_crd();
    let ns = plane.namespace("restart");
    let mut op = operator_for(plane, &ns).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    for name in ["keep", "gone"] {
        plane.kubectl_stdin(&["apply", "-f", "-"], &lock_yaml(&ns, name, "{}"));
        status_until(&api, name, "Free", |s| s.phase.as_deref() == Some("Free")).await;
    }
    let a = Sidecar::start(&plane.etcd.endpoint, "pod-a", &["--namespace", "restart"]).await;
    let token = a.must_acquire("keep", json!({})).await;
    op.kill();
    // While it is down: "gone" is deleted (its finalizer removed by hand), and a stray lock is
    // declared straight into etcd.
    plane.kubectl(&["delete", "dlock", "gone", "-n", &ns, "--wait=false"]);
    let (ok, _, err) = plane.kubectl(&[
        "patch",
        "dlock",
        "gone",
        "-n",
        &ns,
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    assert!(ok, "{err}");
    crate::common::declare(&plane.etcd.endpoint, &["stray", "--namespace", &ns]);
    let _op = operator_for(plane, &ns).await;
    wait_until(Duration::from_secs(5), || async {
        plane.etcd.count("/podlock/v1/config/restart/gone").await == 0
            && plane.etcd.count("/podlock/v1/config/restart/stray").await == 0
    })
    .await
    .expect("orphaned keys removed");
    status_until(&api, "keep", "the hold kept", |s| {
        s.holders.first().is_some_and(|h| h.fencing_token == token)
    })
    .await;
    assert_eq!(a.get("/v1/locks").await.1["locks"][0]["state"], "held");
}

#[tokio::test]
async fn locks_of_two_namespaces_are_independent() {
    let plane = with_crd();
    let (ns_a, ns_b) = (plane.namespace("team-a"), plane.namespace("team-b"));
    let (_op_a, _op_b) = (operator_for(plane, &ns_a).await, operator_for(plane, &ns_b).await);
    plane.kubectl_stdin(
        &["apply", "-f", "-"],
        &lock_yaml(&ns_a, "shared-name", "{ttlSeconds: 5}"),
    );
    plane.kubectl_stdin(
        &["apply", "-f", "-"],
        &lock_yaml(&ns_b, "shared-name", "{ttlSeconds: 9}"),
    );
    plane.kubectl_stdin(&["apply", "-f", "-"], &lock_yaml(&ns_b, "only-in-b", "{}"));
    let api_b: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns_b);
    status_until(&api_b, "only-in-b", "Free", |s| {
        s.phase.as_deref() == Some("Free")
    })
    .await;
    let a = Sidecar::start(&plane.etcd.endpoint, "pod-a", &["--namespace", "team-a"]).await;
    let b = Sidecar::start(&plane.etcd.endpoint, "pod-b", &["--namespace", "team-b"]).await;
    wait_until(Duration::from_secs(5), || async {
        a.get("/v1/locks/shared-name").await.0 == 200
    })
    .await
    .unwrap();
    let (_, ga) = a.post("shared-name", "acquire", json!({"waitSeconds": 0})).await;
    let (_, gb) = b.post("shared-name", "acquire", json!({"waitSeconds": 0})).await;
    assert_eq!(
        (ga["ttlSeconds"].as_u64(), gb["ttlSeconds"].as_u64()),
        (Some(5), Some(9)),
        "{ga} {gb}"
    );
    assert_eq!(a.post("only-in-b", "acquire", json!({})).await.0, 404);
    status_until(&api_b, "shared-name", "b's holder", |s| {
        s.holders.len() == 1 && s.holders[0].pod == "pod-b"
    })
    .await;
}

#[tokio::test]
async fn of_two_replicas_one_leads_and_a_killed_leader_is_replaced_within_the_lease() {
    let plane = with_crd();
    let ns = plane.namespace("ha");
    let (a, b) = (
        Operator::start(plane, &ns).await,
        Operator::start(plane, &ns).await,
    );
    wait_until(Duration::from_secs(10), || async {
        a.leads().await != b.leads().await
    })
    .await
    .unwrap_or_else(|e| panic!("exactly one replica leads: {e}\nA:\n{}\nB:\n{}", a.log(), b.log()));
    let (mut leader, follower) = if a.leads().await { (a, b) } else { (b, a) };
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    declare_until_free(plane, &api, &ns, "first", "{}").await;
    let metrics = follower.metrics().await;
    for zero in [
        "podlock_reconcile_total{result=\"ok\"} 0",
        "podlock_forced_releases_total{reason=\"pod_deleted\"} 0",
        "podlock_forced_releases_total{reason=\"lock_deleted\"} 0",
    ] {
        assert!(
            metrics.contains(zero),
            "the follower reconciled, or lacks {zero}:\n{metrics}"
        );
    }

    leader.kill();
    let killed = Instant::now();
    let handover = wait_until(Duration::from_secs(10), || follower.leads())
        .await
        .expect("the follower takes over");
    eprintln!("operator leader handover after kill -9: {handover:?} (lease 3 s)");
    assert!(
        handover < Duration::from_secs(3 + 2),
        "handover took {handover:?}"
    );
    declare_until_free(plane, &api, &ns, "second", "{}").await;
    eprintln!(
        "new leader reconciled a new lock {:?} after the kill",
        killed.elapsed()
    );
}

#[tokio::test]
async fn an_operator_whose_webhook_cannot_serve_exits_instead_of_staying_ready() {
    let plane = with_crd();
    let ns = plane.namespace("webhook-down");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hook = taken.local_addr().unwrap().to_string();
    let listen = format!("127.0.0.1:{}", crate::common::free_port());
    let mut operator = crate::common::spawn_dying_with_parent(
        std::process::Command::new(crate::common::podlock_bin())
            .args([
                "operator",
                "--etcd-endpoints",
                &plane.etcd.endpoint,
                "--listen",
                &listen,
            ])
            .args(["--watch-namespace", &ns, "--leader-election-namespace", &ns])
            .args(["--operator-namespace", &ns, "--webhook-listen", &hook])
            .args(["--webhook-url", &format!("https://{hook}/mutate")])
            .args(["--webhook-configuration", &format!("podlock-{ns}")])
            .env("KUBECONFIG", &plane.kubeconfig)
            .stderr(std::process::Stdio::piped()),
    );
    let exited = wait_until(Duration::from_secs(20), || {
        let done = operator.try_wait().unwrap().is_some();
        async move { done }
    })
    .await;
    if exited.is_err() {
        let _ = operator.kill();
    }
    let out = operator.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    exited.unwrap_or_else(|e| panic!("the operator ran on with its webhook down ({e}):\n{log}"));
    assert!(
        !out.status.success() && log.contains("webhook server failed"),
        "{log}"
    );
}
