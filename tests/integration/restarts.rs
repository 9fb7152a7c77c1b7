//! Container restarts on a real kube-apiserver: a hold ends when the container incarnation
//! that took it is gone, judged by restart count and container id (not by whole-second
//! timestamps), and only for the container the hold names when it names one.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use std::time::{Duration, SystemTime};

use crate::common::kube::{rfc3339, running_pod};
use crate::common::wait_until;
use crate::pod_liveness::{setup, sidecar};

/// A running container's status, as a kubelet reports it.
fn running(name: &str, id: &str, restarts: i32, started: SystemTime) -> Value {
    json!({"name": name, "image": name, "imageID": "", "ready": true, "started": true,
        "restartCount": restarts, "containerID": format!("containerd://{id}"),
        "state": {"running": {"startedAt": rfc3339(started)}}})
}

/// `running`, after a previous incarnation that finished at `finished`.
fn restarted(name: &str, id: &str, restarts: i32, at: SystemTime, old_id: &str) -> Value {
    let mut status = running(name, id, restarts, at);
    status["lastState"] = json!({"terminated": {"exitCode": 1, "reason": "Error",
        "startedAt": rfc3339(at - Duration::from_secs(60)), "finishedAt": rfc3339(at),
        "containerID": format!("containerd://{old_id}")}});
    status
}

async fn set_containers(pods: &Api<Pod>, name: &str, containers: Vec<Value>) {
    let status = json!({"status": {"phase": "Running", "containerStatuses": containers}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// Whether the sidecar still reports the hold with `token`.
async fn holds(s: &crate::common::Sidecar, token: i64) -> bool {
    let (_, locks) = s.get("/v1/locks").await;
    locks["locks"][0]["state"] == "held" && locks["locks"][0]["fencingToken"] == token
}

#[tokio::test]
async fn a_crash_and_restart_within_the_second_of_the_acquire_ends_the_hold() {
    let ns = "same-second";
    let (plane, op, pods) = setup(ns).await;
    let uid = running_pod(&pods, "web").await;
    let long_ago = SystemTime::now() - Duration::from_secs(60);
    set_containers(&pods, "web", vec![running("app", "c1", 0, long_ago)]).await;
    let web = sidecar(plane, ns, "web", &uid).await;
    let (status, grant) = web.post("job", "acquire", json!({})).await;
    assert_eq!(status, 200, "{grant}");
    let token = grant["fencingToken"].as_i64().unwrap();
    // The app crashes and is restarted within the second of its acquire: the kubelet's
    // timestamps (whole seconds) cannot tell the new incarnation from the one that acquired.
    let acquired = humantime::parse_rfc3339(grant["acquiredAt"].as_str().unwrap()).unwrap();
    let second = SystemTime::UNIX_EPOCH
        + Duration::from_secs(acquired.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs());
    tokio::time::sleep(Duration::from_millis(300)).await;
    set_containers(&pods, "web", vec![restarted("app", "c2", 1, second, "c1")]).await;
    let ended = wait_until(Duration::from_secs(2), || async { !holds(&web, token).await }).await;
    assert!(
        ended.is_ok(),
        "the dead incarnation's hold was kept; operator log:\n{}",
        op.log()
    );
    // Counted once etcd confirmed the release, which may be just after the sidecar saw it.
    let counted = "podlock_forced_releases_total{reason=\"container_restarted\"} 1";
    wait_until(Duration::from_secs(2), || async {
        op.metrics().await.contains(counted)
    })
    .await
    .unwrap_or_else(|e| panic!("{counted}: {e}\n{}", op.log()));
}

#[tokio::test]
async fn a_hold_bound_to_its_container_outlives_a_restart_of_another_container() {
    let ns = "own-container";
    let (plane, op, pods) = setup(ns).await;
    let uid = running_pod(&pods, "web").await;
    let long_ago = SystemTime::now() - Duration::from_secs(60);
    let app = running("app", "a1", 0, long_ago);
    set_containers(
        &pods,
        "web",
        vec![app.clone(), running("istio-proxy", "p1", 0, long_ago)],
    )
    .await;
    let web = sidecar(plane, ns, "web", &uid).await;
    let (status, grant) = web.post("job", "acquire", json!({"container": "app"})).await;
    assert_eq!(status, 200, "{grant}");
    let token = grant["fencingToken"].as_i64().unwrap();
    // The mesh proxy restarts, in a later second than the acquire.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let now = SystemTime::now();
    set_containers(
        &pods,
        "web",
        vec![app, restarted("istio-proxy", "p2", 1, now, "p1")],
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        holds(&web, token).await,
        "a restart of another container ended the hold; operator log:\n{}",
        op.log()
    );
    // Its own container's restart does end it.
    let proxy = restarted("istio-proxy", "p2", 1, now, "p1");
    set_containers(&pods, "web", vec![restarted("app", "a2", 1, now, "a1"), proxy]).await;
    wait_until(Duration::from_secs(2), || async { !holds(&web, token).await })
        .await
        .expect("the hold ends with its container");
}
