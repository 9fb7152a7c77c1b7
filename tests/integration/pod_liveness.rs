//! Pod liveness on a real kube-apiserver: when a holder's pod dies, the operator ends the hold
//! and the next waiter gets the lock within a second, not after the TTL. No kubelet: the tests
//! create Pods and write their status themselves.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::common::kube::{
    ControlPlane, Operator, rfc3339, running_pod, running_pod_labelled, set_restarted, set_status, with_crd,
};
use crate::common::lag::LagProxy;
use crate::common::{Sidecar, percentile, wait_until};

/// The control plane, the CRD, a namespace with one lock (TTL 30 s, so a handoff within a
/// second can only come from the operator), and an operator for it.
pub(crate) async fn setup(ns: &str) -> (&'static ControlPlane, Operator, Api<Pod>) {
    setup_as(ns, None).await
}

/// Like [`setup`], the operator reaching the API server through `kubeconfig` if given.
async fn setup_as(
    ns: &str,
    kubeconfig: Option<&std::path::Path>,
) -> (&'static ControlPlane, Operator, Api<Pod>) {
    let plane = with_crd();
    plane.namespace(ns);
    let lock = format!(
        "apiVersion: podlock.io/v1alpha1\nkind: DistributedLock\nmetadata: {{name: job, namespace: {ns}}}\nspec: {{ttlSeconds: 30}}\n"
    );
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &lock).0);
    let kubeconfig = kubeconfig.unwrap_or(&plane.kubeconfig);
    let op = Operator::start_as(kubeconfig, ns, &plane.etcd.endpoint, &[]).await;
    let key = format!("/podlock/v1/config/{ns}/job");
    wait_until(Duration::from_secs(10), || async {
        plane.etcd.count(&key).await == 1
    })
    .await
    .expect("lock published");
    (plane, op, Api::namespaced(plane.client().await, ns))
}

/// A sidecar for pod `name` (uid `uid`) in namespace `ns`.
pub(crate) async fn sidecar(plane: &ControlPlane, ns: &str, name: &str, uid: &str) -> Arc<Sidecar> {
    Arc::new(Sidecar::start(&plane.etcd.endpoint, name, &["--namespace", ns, "--pod-uid", uid]).await)
}

/// A holder pod and a waiter pod on lock `job`; returns (holder sidecar, pending waiter grant).
async fn holder_and_waiter(
    plane: &ControlPlane,
    pods: &Api<Pod>,
    ns: &str,
    trial: usize,
) -> (Arc<Sidecar>, Arc<Sidecar>, tokio::task::JoinHandle<Instant>) {
    let (h, w) = (format!("holder-{trial}"), format!("waiter-{trial}"));
    let (hu, wu) = (running_pod(pods, &h).await, running_pod(pods, &w).await);
    let (hs, ws) = (
        sidecar(plane, ns, &h, &hu).await,
        sidecar(plane, ns, &w, &wu).await,
    );
    hs.must_acquire("job", json!({})).await;
    let w2 = ws.clone();
    let granted = tokio::spawn(async move {
        w2.must_acquire("job", json!({})).await;
        Instant::now()
    });
    wait_until(Duration::from_secs(5), || async {
        hs.get("/v1/locks/job").await.1["waiters"] == 1
    })
    .await
    .unwrap();
    (hs, ws, granted)
}

#[tokio::test]
async fn a_dead_holders_pod_hands_the_lock_over_within_a_second() {
    let ns = "liveness";
    let (plane, op, pods) = setup(ns).await;
    let kinds = ["deleted", "failed", "restarted"];
    let mut handoffs: Vec<(&str, Duration)> = vec![];
    for trial in 0..21 {
        let kind = kinds[trial % 3];
        let (holder, waiter, granted) = holder_and_waiter(plane, &pods, ns, trial).await;
        let name = format!("holder-{trial}");
        match kind {
            "deleted" => drop(pods.delete(&name, &DeleteParams::default()).await.unwrap()),
            "failed" => {
                set_status(
                    &pods,
                    &name,
                    "Failed",
                    SystemTime::now() - Duration::from_secs(60),
                )
                .await
            }
            _ => {
                // A kubelet reports whole seconds: restart in a later second than the grant.
                tokio::time::sleep(Duration::from_millis(1000)).await;
                set_restarted(&pods, &name, SystemTime::now()).await
            }
        }
        let changed = Instant::now();
        let Ok(at) = tokio::time::timeout(Duration::from_secs(5), granted).await else {
            panic!(
                "trial {trial} ({kind}): waiter not granted; operator log:\n{}",
                op.log()
            );
        };
        let at = at.unwrap();
        handoffs.push((kind, at.saturating_duration_since(changed)));
        // The old holder's sidecar was told, within the contract's second.
        wait_until(Duration::from_secs(1), || async {
            holder.get("/v1/locks").await.1["locks"] == json!([])
        })
        .await
        .unwrap_or_else(|e| panic!("{kind}: holder still believes it holds: {e}"));
        assert_eq!(waiter.post("job", "release", json!({})).await.0, 200);
    }
    let mut all: Vec<Duration> = handoffs.iter().map(|(_, d)| *d).collect();
    let (p50, p99) = (percentile(&mut all, 0.50), percentile(&mut all, 0.99));
    eprintln!(
        "pod liveness handoff over {} trials: p50 {p50:?}, p99 {p99:?}; each: {handoffs:?}",
        all.len()
    );
    assert!(p99 < Duration::from_secs(1), "p99 handoff {p99:?}");
    let metrics = op.metrics().await;
    for reason in ["pod_deleted", "pod_failed", "container_restarted"] {
        let line = format!("podlock_forced_releases_total{{reason=\"{reason}\"}} 7");
        assert!(metrics.contains(&line), "missing {line}:\n{metrics}");
    }
}

#[tokio::test]
async fn a_pod_replaced_while_the_operator_was_down_loses_its_holds() {
    let ns = "replaced";
    let (plane, mut op, pods) = setup(ns).await;
    let (_holder, _waiter, granted) = holder_and_waiter(plane, &pods, ns, 0).await;
    op.kill();
    pods.delete("holder-0", &DeleteParams::default()).await.unwrap();
    wait_until(Duration::from_secs(5), || async {
        pods.get_opt("holder-0").await.unwrap().is_none()
    })
    .await
    .unwrap();
    running_pod(&pods, "holder-0").await; // same name, new uid
    let restarted = Instant::now();
    let op = Operator::start(plane, ns).await;
    // The new operator leads once the killed one's Lease (3 s) has run out.
    let at = tokio::time::timeout(Duration::from_secs(10), granted)
        .await
        .expect("waiter granted")
        .unwrap();
    eprintln!(
        "replaced pod: waiter granted {:?} after the operator restarted",
        at - restarted
    );
    // The operator counts the release once etcd confirmed it, which may be just after the
    // waiter was granted.
    let counted = "podlock_forced_releases_total{reason=\"pod_replaced\"} 1";
    wait_until(Duration::from_secs(2), || async {
        op.metrics().await.contains(counted)
    })
    .await
    .unwrap_or_else(|e| panic!("{counted}: {e}\n{}", op.log()));
}

#[tokio::test]
async fn a_slow_pod_keeps_its_hold() {
    let ns = "slow";
    let (plane, _op, pods) = setup(ns).await;
    let (holder, _waiter, granted) = holder_and_waiter(plane, &pods, ns, 0).await;
    // Not ready, restarting nothing: merely slow.
    let slow = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": "app", "image": "app", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"running": {"startedAt": rfc3339(SystemTime::now() - Duration::from_secs(60))}}}]}});
    pods.patch_status("holder-0", &PatchParams::default(), &Patch::Merge(&slow))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !granted.is_finished(),
        "the waiter got a lock that a live pod holds"
    );
    assert_eq!(holder.get("/v1/locks").await.1["locks"][0]["state"], "held");
    granted.abort();
}

#[tokio::test]
async fn a_pod_recreated_under_its_name_keeps_its_holds_while_the_pod_watch_lags() {
    // A StatefulSet's pod is deleted and recreated under the same name; the operator's pod watch
    // is 3 s behind (its reads are not), so its cache still has the old pod when the new pod's
    // sidecar takes the lock.
    let lag = Duration::from_secs(3);
    let proxy = LagProxy::start(&with_crd().kubeconfig, lag);
    let ns = "recreated";
    let (plane, op, pods) = setup_as(ns, Some(&proxy.kubeconfig)).await;
    let old = running_pod(&pods, "web-0").await;
    tokio::time::sleep(lag + Duration::from_secs(1)).await; // the old pod reaches the cache
    pods.delete("web-0", &DeleteParams::default()).await.unwrap();
    let deleted = Instant::now();
    wait_until(Duration::from_secs(5), || async {
        pods.get_opt("web-0").await.unwrap().is_none()
    })
    .await
    .unwrap();
    let new = running_pod(&pods, "web-0").await;
    assert_ne!(old, new);
    let web = sidecar(plane, ns, "web-0", &new).await;
    let token = web.must_acquire("job", json!({})).await;
    assert!(
        deleted.elapsed() < lag,
        "the new pod took the lock only {:?} after the old one's deletion: the lagging watch may have caught up",
        deleted.elapsed()
    );
    // Long enough for the lagging watch to catch up and for any wrong revocation to show.
    tokio::time::sleep(lag + Duration::from_secs(1)).await;
    let (_, locks) = web.get("/v1/locks").await;
    assert_eq!(
        (
            locks["locks"][0]["state"].as_str(),
            locks["locks"][0]["fencingToken"].as_i64()
        ),
        (Some("held"), Some(token)),
        "the live pod's hold was ended: {locks}\noperator log:\n{}",
        op.log()
    );
    let metrics = op.metrics().await;
    assert!(
        metrics.contains("podlock_forced_releases_total{reason=\"pod_replaced\"} 0"),
        "a live pod was judged replaced:\n{metrics}"
    );
}

#[tokio::test]
async fn a_pod_whose_sidecar_was_written_by_hand_hands_the_lock_over_within_a_second() {
    let ns = "liveness-by-hand";
    let (plane, _op, pods) = setup(ns).await;
    // No `podlock.io/sidecar` label: the webhook never saw this pod (GitOps, a manifest with
    // the sidecar in it), so the operator's labelled pod watch does not either.
    let (h, w) = ("by-hand", "waiter");
    let hu = running_pod_labelled(&pods, h, json!({"app": "by-hand"})).await;
    let wu = running_pod(&pods, w).await;
    let (holder, waiter) = (sidecar(plane, ns, h, &hu).await, sidecar(plane, ns, w, &wu).await);
    holder.must_acquire("job", json!({})).await;
    let granted = tokio::spawn(async move {
        waiter.must_acquire("job", json!({"waitSeconds": 20})).await;
        Instant::now()
    });
    wait_until(Duration::from_secs(5), || async {
        holder.get("/v1/locks/job").await.1["waiters"] == 1
    })
    .await
    .unwrap();
    // Time for the operator to see the entry and watch the pod by name.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let deleted = Instant::now();
    pods.delete(h, &DeleteParams::default()).await.unwrap();
    let handoff = granted.await.unwrap() - deleted;
    println!("hand-written sidecar: handoff {handoff:?} after the pod's deletion (TTL 30 s)");
    assert!(handoff < Duration::from_millis(1500), "handoff took {handoff:?}");
}
