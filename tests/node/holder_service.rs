//! `spec.holderService` on the real node: the lock `work` has a Service `work` (port 80 to the
//! app's 8080, where each app serves its pod's name). Through the Service's ClusterIP, as
//! kube-proxy routes it, the answer comes from the holder, and after the holder's pod is deleted
//! from the next holder.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams};

use crate::common::node::Node;
use crate::workload::{handed_on, settled};

/// Polls `check` every 10 ms for up to 30 s; returns the first `Some` and when it came.
async fn first<T, F, Fut>(mut check: F) -> Option<(T, SystemTime)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        if let Some(found) = check().await {
            return Some((found, SystemTime::now()));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// What the Service's ClusterIP answers (the serving pod's name), on a new connection.
async fn answer(http: &reqwest::Client, ip: &str) -> Option<String> {
    let body = http
        .get(format!("http://{ip}/"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    Some(body.trim().to_string())
}

/// The pods the holder Service's slice routes to.
async fn routed(slices: &Api<EndpointSlice>) -> Vec<String> {
    let Ok(slice) = slices.get("work-holders").await else {
        return vec![];
    };
    let refs = slice.endpoints.into_iter().filter_map(|e| e.target_ref?.name);
    refs.collect()
}

/// The Service answers from the holder, and from the next holder once the first one's pod is
/// deleted; prints how long each step took after the deletion.
pub async fn the_service_follows_the_holder(node: &Node, client: &kube::Client) {
    let (pods, services, slices): (Api<Pod>, Api<Service>, Api<EndpointSlice>) = (
        Api::namespaced(client.clone(), "app"),
        Api::namespaced(client.clone(), "app"),
        Api::namespaced(client.clone(), "app"),
    );
    let holder = settled(node);
    let svc = services.get("work").await.expect("the holder Service exists");
    let ip = svc.spec.and_then(|s| s.cluster_ip).expect("a ClusterIP");
    // A new connection per request: a kept one would stay with the old pod.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let before = first(|| answer(&http, &ip)).await.map(|(a, _)| a);
    assert_eq!(
        before.as_deref(),
        Some(holder.pod.as_str()),
        "the Service at {ip} did not answer from the holder"
    );
    eprintln!("holder Service work ({ip}:80) answers: {}", holder.pod);
    let old = holder.pod.clone();
    let t0 = SystemTime::now();
    pods.delete(&old, &DeleteParams::default()).await.unwrap();
    let slice = first(|| async { routed(&slices).await.into_iter().find(|p| *p != old) });
    let route = first(|| async { answer(&http, &ip).await.filter(|a| *a != old && !a.is_empty()) });
    let (slice, route) = tokio::join!(slice, route);
    let ((in_slice, sliced), (answered, routed_at)) = (
        slice.expect("the slice never moved"),
        route.expect("the Service never answered from another pod"),
    );
    let granted = handed_on(
        node,
        &holder,
        t0,
        &format!("deleted holder pod {old} (Service test)"),
    );
    let after = |t: SystemTime| t.duration_since(t0).unwrap_or_default();
    eprintln!(
        "holder Service: the slice named {in_slice} {} ms and the ClusterIP answered from {answered} {} ms after the deletion (the grant: {} ms)",
        after(sliced).as_millis(),
        after(routed_at).as_millis(),
        granted.as_millis()
    );
    assert_eq!(
        in_slice, answered,
        "the Service routes to a pod that is not the next holder"
    );
    let behind = after(sliced).saturating_sub(granted);
    assert!(
        behind < Duration::from_secs(1),
        "the slice followed the grant after {behind:?}"
    );
}
