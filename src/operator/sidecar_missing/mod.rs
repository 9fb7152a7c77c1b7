//! Pods that asked for the sidecar and run without it. When the API server cannot reach the
//! webhook (a GKE private cluster without a firewall rule for it, EKS with an overlay CNI, no
//! ready operator replica), `failurePolicy: Ignore` creates an annotated pod as it is, and its
//! app finds no lock API. The leader notices such a pod within a watch event of its creation
//! and says so once per pod: a Warning Event `SidecarMissing` on the pod, on the workload that
//! controls it and on a ReplicaSet's Deployment, and `podlock_pods_without_sidecar{namespace}`
//! (the alert `PodlockPodsWithoutSidecar`).
//!
//! Its own pod watch: pod liveness selects on the label the webhook sets, which exactly these
//! pods lack. This one is metadata only, and leaves out pods with that label on the API server;
//! the rest it filters on the injection annotation, and reads only a pod that has it and no
//! label (is there a sidecar written by hand? `hostNetwork`?), once: a pod's containers cannot
//! change. Pods that ask through their namespace's `podlock.io/inject=enabled` label alone
//! are not looked at.

mod owners;
mod tally;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::events::EventType;
use kube::runtime::{WatchStreamExt, watcher};
use std::sync::Arc;
use tracing::{info, warn};

use super::context::Context;
use super::inject::{self, INJECT, SIDECAR_LABEL};
use crate::metrics::OperatorMetrics;
use tally::Tally;

/// The reason of the Warning Events.
pub const REASON: &str = "SidecarMissing";

/// Watches pods (of `namespace`, or all) for those that asked for the sidecar and run
/// without it, until the watch ends or this replica stops leading.
pub async fn run(ctx: Arc<Context>, namespace: Option<String>) {
    let pods: Api<PartialObjectMeta<Pod>> = match &namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let config = watcher::Config::default().labels(&format!("{SIDECAR_LABEL}!=true"));
    let mut events = watcher(pods, config).default_backoff().boxed();
    let mut tally = Tally::default();
    // A replica that no longer leads reports none: the new leader counts them.
    let _reset = Reset(ctx.metrics.clone());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => tally.relisting(),
            Ok(watcher::Event::InitApply(pod) | watcher::Event::Apply(pod)) => {
                notice(&ctx, &mut tally, &pod).await
            }
            Ok(watcher::Event::Delete(pod)) => {
                let fell = tally.forget(&pod.uid().unwrap_or_default());
                fell.iter().for_each(|ns| count(&ctx.metrics, &tally, ns));
            }
            Ok(watcher::Event::InitDone) => {
                let fell = tally.relisted();
                fell.iter().for_each(|ns| count(&ctx.metrics, &tally, ns));
            }
            Err(e) => warn!(error = %e, "pod watch for missing sidecars failed; retrying"),
        }
    }
}

/// Judges a pod the watch reports, unless judged already.
async fn notice(ctx: &Context, tally: &mut Tally, pod: &PartialObjectMeta<Pod>) {
    let uid = pod.uid().unwrap_or_default();
    if pod.annotations().get(INJECT).map(String::as_str) != Some("true") {
        // Its annotation removed: no longer counted.
        if let Some(ns) = tally.forget(&uid) {
            count(&ctx.metrics, tally, &ns);
        }
        return;
    }
    if tally.knows(&uid) {
        return;
    }
    let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    let Some(full) = read(&ctx.client, &ns, &name, &uid).await else {
        return;
    };
    let missing = inject::missed(&ns, &serde_json::to_value(&full).expect("a pod serializes"));
    tally.judge(&uid, &ns, missing);
    if missing {
        count(&ctx.metrics, tally, &ns);
        warn_about(ctx, &full).await;
    }
}

/// Pod `ns/name` as it is now, if it is still the one of `uid`. Metadata cannot tell a
/// sidecar written by hand, nor `hostNetwork`: the pod can. None when gone or replaced (the
/// watch reports that too), or unreadable (judged again at the pod's next change: a starting
/// pod changes often).
async fn read(client: &kube::Client, ns: &str, name: &str, uid: &str) -> Option<Pod> {
    match Api::<Pod>::namespaced(client.clone(), ns).get_opt(name).await {
        Ok(pod) => pod.filter(|p| p.uid().as_deref() == Some(uid)),
        Err(e) => {
            warn!(pod = name, namespace = ns, error = %e, "cannot read a pod to see whether it has its sidecar");
            None
        }
    }
}

/// The Warning Event on the pod and on its owners.
async fn warn_about(ctx: &Context, pod: &Pod) {
    let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    info!(
        pod = name,
        namespace = ns,
        "a pod asked for the sidecar and runs without it"
    );
    for object in owners::chain(&ctx.client, pod).await {
        super::events::publish(
            &ctx.recorder,
            &object,
            EventType::Warning,
            REASON,
            note(&ns, &name),
        )
        .await;
    }
}

/// What the Event says: what happened and what to do (well under an Event note's 1 kB).
fn note(namespace: &str, pod: &str) -> String {
    format!(
        "Pod {namespace}/{pod} asks for the podlock sidecar ({INJECT}: \"true\") but runs without it: \
         the API server did not reach podlock's webhook when it created the pod, and failurePolicy \
         Ignore let it through. Let the control plane reach the webhook (a firewall rule for port \
         9443 on GKE private clusters, operator.hostNetwork on EKS with an overlay CNI) or set \
         webhook.failurePolicy=Fail, then recreate the pod. See docs/troubleshooting.md, \
         SidecarMissing."
    )
}

/// Sets `namespace`'s `podlock_pods_without_sidecar`.
fn count(metrics: &OperatorMetrics, tally: &Tally, namespace: &str) {
    let gauge = metrics.pods_without_sidecar.with_label_values(&[namespace]);
    gauge.set(tally.missing_in(namespace) as i64);
}

/// Clears `podlock_pods_without_sidecar` when dropped.
struct Reset(OperatorMetrics);

impl Drop for Reset {
    fn drop(&mut self) {
        self.0.pods_without_sidecar.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_note_says_what_happened_and_what_to_do_within_an_events_limit() {
        let note = note(&"n".repeat(63), &"p".repeat(253));
        assert!(note.len() <= 1024, "{} bytes", note.len());
        for says in ["failurePolicy", "9443", "docs/troubleshooting.md", REASON] {
            assert!(note.contains(says), "{note}");
        }
    }
}
