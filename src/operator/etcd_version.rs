//! The operator's part of the etcd version check (`src/etcd_version.rs`): besides the log line
//! and `podlock_etcd_below_minimum`, a Warning Event `EtcdBelowMinimum` on the operator's own
//! Pod, where `kubectl describe pod` and `kubectl get events` show it beside the replica that
//! found it. Every replica checks, leading or not: each reaches etcd through its own endpoints.
//!
//! The Pod is `--pod-name` (the chart sets `PODLOCK_POD_NAME` from the downward API), else
//! `HOSTNAME` (a Pod's name, unless it runs with `hostNetwork`), in the operator's namespace,
//! and only if the API server has a Pod of that name: an Event on an object that does not exist
//! (an operator run outside the cluster, a node's host name) would be found by no one, so then
//! the log line and the metric say it alone.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Resource;
use kube::api::Api;
use kube::runtime::events::EventType;
use std::sync::Arc;
use tracing::info;

use super::context::Context;
use crate::etcd_version::{VersionGauges, spawn_checks};

/// The reason of the Warning Event.
pub const REASON: &str = "EtcdBelowMinimum";

/// Checks etcd's version now and every `RECHECK`; each time etcd is newly found below the
/// minimum, records the Warning Event on pod `name` of `namespace` (if it exists).
pub async fn run(ctx: Arc<Context>, namespace: String, name: Option<String>) {
    let store = ctx.store.clone();
    let read = move || {
        let store = store.clone();
        async move { store.etcd_versions().await }
    };
    let gauges = VersionGauges::registered(ctx.metrics.registry());
    let mut warnings = spawn_checks(gauges, read);
    while let Some(warning) = warnings.recv().await {
        let Some(pod) = own_pod(&ctx.client, &namespace, name.as_deref()).await else {
            info!(pod = ?name, "no Pod of this operator found (--pod-name); the etcd version warning is in the log and metrics only");
            continue;
        };
        super::events::publish(&ctx.recorder, &pod, EventType::Warning, REASON, warning).await;
    }
}

/// The operator's own Pod, `name` or else `HOSTNAME` in `namespace`, if the API server has it.
async fn own_pod(client: &kube::Client, namespace: &str, name: Option<&str>) -> Option<ObjectReference> {
    let name = name
        .map(str::to_string)
        .or_else(|| std::env::var("HOSTNAME").ok())?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    match pods.get_opt(&name).await {
        Ok(pod) => pod.map(|p| p.object_ref(&())),
        Err(e) => {
            info!(pod = name, error = %e, "cannot read the operator's own Pod");
            None
        }
    }
}
