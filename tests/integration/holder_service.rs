//! `spec.holderService` on a real kube-apiserver: the operator keeps a Service and its
//! EndpointSlice pointing at the pods that hold the lock, moves it within a second of a
//! handoff, never takes over a Service it did not make, and removes its own when no longer
//! asked for. No kubelet: the tests create Pods and write their IPs themselves (the real node
//! test routes traffic through the Service).

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::{Duration, Instant};

use crate::common::kube::{ControlPlane, Operator, running_pod, with_crd};
use crate::common::{percentile, wait_until};
use crate::operator::status_until;
use crate::pod_liveness::sidecar;
use podlock::crd::DistributedLock;

/// A lock `leader` whose holders a Service `leader` on port 80 routes to (their port 8080).
fn lock(ns: &str, holder_service: serde_json::Value) -> String {
    let lock = json!({
        "apiVersion": "podlock.io/v1alpha1", "kind": "DistributedLock",
        "metadata": {"name": "leader", "namespace": ns},
        "spec": {"ttlSeconds": 30, "holderService": holder_service},
    });
    lock.to_string()
}

/// A running pod `name` with IP `ip`; returns its uid.
async fn pod_with_ip(pods: &Api<Pod>, name: &str, ip: &str) -> String {
    let uid = running_pod(pods, name).await;
    let status = json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    uid
}

/// The addresses of the slice `name`, or `None` if there is no such slice.
async fn addresses(slices: &Api<EndpointSlice>, name: &str) -> Option<Vec<String>> {
    let slice = slices.get_opt(name).await.unwrap()?;
    Some(slice.endpoints.iter().flat_map(|e| e.addresses.clone()).collect())
}

async fn setup(ns: &str) -> (&'static ControlPlane, Operator, Api<Pod>, Api<EndpointSlice>) {
    let plane = with_crd();
    plane.namespace(ns);
    let spec = json!({"ports": [{"name": "http", "port": 80, "targetPort": 8080}]});
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &lock(ns, spec)).0);
    let op = Operator::start(plane, ns).await;
    let key = format!("/podlock/v1/config/{ns}/leader");
    wait_until(Duration::from_secs(10), || async {
        plane.etcd.count(&key).await == 1
    })
    .await
    .expect("lock published");
    let client = plane.client().await;
    (
        plane,
        op,
        Api::namespaced(client.clone(), ns),
        Api::namespaced(client, ns),
    )
}

#[tokio::test]
async fn the_holder_service_follows_every_handoff_within_a_second() {
    let ns = "holder-service";
    let (plane, op, pods, slices) = setup(ns).await;
    let ips = ["10.99.0.1", "10.99.0.2"];
    let mut sidecars = vec![];
    for (i, ip) in ips.iter().enumerate() {
        let name = format!("replica-{i}");
        let uid = pod_with_ip(&pods, &name, ip).await;
        sidecars.push(sidecar(plane, ns, &name, &uid).await);
    }
    sidecars[0].must_acquire("leader", json!({})).await;
    wait_until(Duration::from_secs(10), || async {
        addresses(&slices, "leader-holders").await == Some(vec![ips[0].into()])
    })
    .await
    .unwrap_or_else(|e| panic!("the slice never named the holder: {e}\n{}", op.log()));
    let services: Api<Service> = Api::namespaced(plane.client().await, ns);
    let svc = services.get("leader").await.unwrap();
    let spec = svc.spec.unwrap();
    assert_eq!(
        spec.selector, None,
        "the operator, not a selector, picks the endpoints"
    );
    let port = &spec.ports.unwrap()[0];
    assert_eq!((port.port, port.name.as_deref()), (80, Some("http")));
    let slice = slices.get("leader-holders").await.unwrap();
    assert_eq!(slice.ports.unwrap()[0].port, Some(8080));
    let labels = slice.metadata.labels.unwrap();
    assert_eq!(labels["kubernetes.io/service-name"], "leader");

    let mut moves = vec![];
    for round in 0..10 {
        let (from, to) = (round % 2, (round + 1) % 2);
        let waiter = sidecars[to].clone();
        let granted = tokio::spawn(async move { waiter.must_acquire("leader", json!({})).await });
        wait_until(Duration::from_secs(5), || async {
            sidecars[from].get("/v1/locks/leader").await.1["waiters"] == 1
        })
        .await
        .unwrap();
        let released = Instant::now();
        assert_eq!(sidecars[from].post("leader", "release", json!({})).await.0, 200);
        granted.await.unwrap();
        wait_until(Duration::from_secs(5), || async {
            addresses(&slices, "leader-holders").await == Some(vec![ips[to].into()])
        })
        .await
        .unwrap_or_else(|e| panic!("round {round}: the slice did not follow: {e}\n{}", op.log()));
        moves.push(released.elapsed());
    }
    let (p50, max) = (percentile(&mut moves, 0.5), percentile(&mut moves, 1.0));
    eprintln!("the holder Service's slice followed 10 handoffs: p50 {p50:?}, max {max:?} after the release");
    assert!(max < Duration::from_secs(1), "a move took {max:?}: {moves:?}");
    // The status is written apart from the slice (latest state first): it names the route
    // within the second too.
    let dl: Api<DistributedLock> = Api::namespaced(plane.client().await, ns);
    let routed = |s: &podlock::crd::DistributedLockStatus| {
        s.holder_service
            .as_ref()
            .is_some_and(|r| r.name == "leader" && r.addresses == [ips[0]])
    };
    let lag = status_until(&dl, "leader", "the route to the last holder", routed).await;
    assert!(
        lag < Duration::from_secs(1),
        "the status named the route {lag:?} after the slice"
    );
    let status = dl.get("leader").await.unwrap().status.unwrap();
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "HolderService")
        .unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("True", "Routing")
    );

    // Deleted by hand: put back at once. Then no longer asked for: removed.
    services.delete("leader", &DeleteParams::default()).await.unwrap();
    wait_until(Duration::from_secs(5), || async {
        services.get_opt("leader").await.unwrap().is_some()
    })
    .await
    .expect("a deleted holder Service is made again");
    let remove = json!([{"op": "remove", "path": "/spec/holderService"}]);
    let patch: json_patch::Patch = serde_json::from_value(remove).unwrap();
    dl.patch("leader", &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .unwrap();
    // The status stops naming it too (written by server-side apply, a field left out goes).
    wait_until(Duration::from_secs(10), || async {
        let status = dl.get("leader").await.unwrap().status.unwrap_or_default();
        services.get_opt("leader").await.unwrap().is_none()
            && addresses(&slices, "leader-holders").await.is_none()
            && status.holder_service.is_none()
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "the Service, slice or status.holderService outlived spec.holderService: {e}\n{}",
            op.log()
        )
    });
}

#[tokio::test]
async fn a_service_the_operator_did_not_make_is_left_alone_and_named_in_the_condition() {
    let ns = "holder-service-taken";
    let plane = with_crd();
    plane.namespace(ns);
    let services: Api<Service> = Api::namespaced(plane.client().await, ns);
    let theirs: Service = serde_json::from_value(json!({
        "metadata": {"name": "leader"},
        "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 5432}]}
    }))
    .unwrap();
    services.create(&PostParams::default(), &theirs).await.unwrap();
    let spec = json!({"ports": [{"port": 80}]});
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &lock(ns, spec)).0);
    let op = Operator::start(plane, ns).await;
    let dl: Api<DistributedLock> = Api::namespaced(plane.client().await, ns);
    let condition = || async {
        let status = dl.get("leader").await.unwrap().status.unwrap_or_default();
        status.conditions.into_iter().find(|c| c.type_ == "HolderService")
    };
    wait_until(Duration::from_secs(10), || async {
        condition().await.is_some_and(|c| c.reason == "ServiceNameTaken")
    })
    .await
    .unwrap_or_else(|e| panic!("no ServiceNameTaken condition: {e}\n{}", op.log()));
    let message = condition().await.unwrap().message;
    assert!(message.contains("spec.holderService.name"), "{message}");
    let svc = services.get("leader").await.unwrap();
    assert_eq!(svc.metadata.owner_references, None);
    let spec = svc.spec.unwrap();
    assert_eq!(spec.ports.unwrap()[0].port, 5432, "their Service is unchanged");
    assert!(spec.selector.is_some());
}
