//! An operator replica that is stopped (a rollout, a drain) loses no injection: on SIGTERM it
//! goes unready at once (its endpoints leave the webhook's Service) but answers admission
//! requests for a drain window, and only then exits.

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;
use std::time::{Duration, Instant};

use crate::common::kube::{Operator, with_crd};
use crate::common::wait_until;

#[tokio::test]
async fn a_stopping_operator_goes_unready_but_injects_until_its_drain_window_ends() {
    let plane = with_crd();
    let ns = plane.namespace("drain");
    let mut op = Operator::start_with(
        plane,
        &ns,
        &plane.etcd.endpoint,
        &["--shutdown-drain-seconds", "3"],
    )
    .await;
    let url = format!("{}/readyz", op.addr);
    let readyz = || async { reqwest::get(&url).await.ok().map(|r| r.status().as_u16()) };
    wait_until(Duration::from_secs(15), || async { readyz().await == Some(200) })
        .await
        .unwrap_or_else(|e| panic!("never Ready ({e}):\n{}", op.log()));

    let stopped = Instant::now();
    op.signal(libc::SIGTERM);
    wait_until(Duration::from_millis(500), || async {
        readyz().await == Some(503)
    })
    .await
    .unwrap_or_else(|e| panic!("still Ready after SIGTERM ({e}):\n{}", op.log()));
    // Still injecting: the API server's admission request is answered.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "late", "namespace": ns,
        "annotations": {"podlock.io/inject": "true"}}, "spec": {"containers": [{"name": "app", "image": "app"}]}});
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &pod.to_string()).0);
    let pods: Api<Pod> = Api::namespaced(plane.client().await, &ns);
    let init = pods.get("late").await.unwrap().spec.unwrap().init_containers;
    assert_eq!(
        init.iter().flatten().filter(|c| c.name == "podlock").count(),
        1,
        "a pod created {:?} after SIGTERM was not injected:\n{}",
        stopped.elapsed(),
        op.log()
    );
    let status = op.exit_within(Duration::from_secs(8)).await;
    let took = stopped.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "did not exit cleanly: {status:?}\n{}",
        op.log()
    );
    assert!(
        took >= Duration::from_secs(3),
        "exited {took:?} after SIGTERM, before its drain window"
    );
}
