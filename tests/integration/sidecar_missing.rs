//! Issue #55: a pod that asked for the sidecar and runs without it (the API server could not
//! reach the webhook, and `failurePolicy: Ignore` let the pod through) is noticed by the
//! operator, which says so in a Warning Event on the pod and on its owners, and in
//! `podlock_pods_without_sidecar`. On a real kube-apiserver whose controller manager turns the
//! Deployment into a ReplicaSet and a Pod, with the webhook registered at a port where nothing
//! listens: exactly what an unreachable webhook does.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use std::time::{Duration, SystemTime};

use crate::common::kube::{ControlPlane, Operator, set_status, with_crd};
use crate::common::{free_port, wait_until};
use crate::dashboards::reports;
use crate::force_release::{event, events_of};
use crate::injection::webhook_ready;

const REASON: &str = "SidecarMissing";

/// A Deployment whose pods ask for the sidecar.
fn annotated_deployment(ns: &str, name: &str) -> String {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}, "annotations": {"podlock.io/inject": "true"}},
                              "spec": {"containers": [{"name": "app", "image": "app:1"}]}}}
    })
    .to_string()
}

/// A pod that asks for the sidecar and has it (written by hand, as the webhook writes it).
fn pod_with_its_sidecar(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"podlock.io/inject": "true"}},
        "spec": {
            "initContainers": [{"name": "podlock", "image": "podlock:test", "restartPolicy": "Always"}],
            "containers": [{"name": "app", "image": "app:1"}],
        }
    }))
    .unwrap()
}

/// The first pod of `selector`, once the controller manager has made one.
async fn first_pod(pods: &Api<Pod>, selector: &str) -> Pod {
    let params = ListParams::default().labels(selector);
    for _ in 0..300 {
        if let Some(pod) = pods.list(&params).await.unwrap().items.pop() {
            return pod;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no pod of {selector} within 30 s");
}

/// The `SidecarMissing` Events on `name` (events.k8s.io, where a repeat would show as a series).
async fn warnings_on(plane: &ControlPlane, ns: &str, name: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(plane.client().await, ns);
    let all = events.list(&ListParams::default()).await.unwrap().items;
    all.into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| e.reason.as_deref() == Some(REASON))
        .collect()
}

#[tokio::test]
async fn sidecar_missing_is_a_warning_on_the_pod_and_its_owners_once_and_a_metric() {
    let plane = with_crd();
    let ns = plane.namespace("sidecar-missing");
    let unreachable = format!("https://127.0.0.1:{}/mutate", free_port());
    let op = Operator::start_with(plane, &ns, &plane.etcd.endpoint, &["--webhook-url", &unreachable]).await;
    webhook_ready(plane, &ns).await;
    let pods: Api<Pod> = Api::namespaced(plane.client().await, &ns);

    // First a pod that has its sidecar: the operator reads one watch in order, so by the time
    // it warns about the Deployment's pod below, it has judged this one.
    let kept = pod_with_its_sidecar("kept");
    pods.create(&PostParams::default(), &kept).await.unwrap();
    let created = SystemTime::now();
    assert!(
        plane
            .kubectl_stdin(&["apply", "-f", "-"], &annotated_deployment(&ns, "web"))
            .0
    );
    let pod = first_pod(&pods, "app=web").await;
    let spec = pod.spec.as_ref().unwrap();
    assert!(
        spec.init_containers.is_none(),
        "the webhook was unreachable: {spec:?}"
    );
    let pod_name = pod.metadata.name.clone().unwrap();
    let replica_set = pod.metadata.owner_references.as_ref().unwrap()[0].name.clone();

    for (kind, name) in [
        ("Pod", &pod_name),
        ("ReplicaSet", &replica_set),
        ("Deployment", &"web".to_string()),
    ] {
        let (type_, message) = event(plane, &ns, name, REASON).await;
        assert_eq!(type_, "Warning", "{kind} {name}");
        for says in [pod_name.as_str(), "failurePolicy", "docs/troubleshooting.md"] {
            assert!(
                message.contains(says),
                "{kind} {name}: {message:?} does not say {says:?}"
            );
        }
    }
    eprintln!(
        "Warning Events on the pod and its owners {:.1} s after the Deployment was created",
        created.elapsed().unwrap().as_secs_f64()
    );
    reports(
        &op,
        &format!("podlock_pods_without_sidecar{{namespace=\"{ns}\"}} 1"),
    )
    .await;
    assert_eq!(events_of(plane, &ns, "kept"), vec![], "the pod with its sidecar");

    // Once per pod: the pod changing (its status, as a kubelet writes it) warns no more.
    set_status(&pods, &pod_name, "Running", SystemTime::now()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let warnings = warnings_on(plane, &ns, &pod_name).await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].series, None, "published again: {warnings:?}");

    // The pod gone (its Deployment deleted), the namespace counts none.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(plane.client().await, &ns);
    deployments
        .delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    let gone = wait_until(Duration::from_secs(30), || async {
        pods.get_opt(&pod_name).await.unwrap().is_none()
    })
    .await;
    gone.expect("the Deployment's pod deleted");
    reports(
        &op,
        &format!("podlock_pods_without_sidecar{{namespace=\"{ns}\"}} 0"),
    )
    .await;
}
