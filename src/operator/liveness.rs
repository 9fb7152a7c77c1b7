//! Pod liveness: when the pod behind a hold is gone, failed, replaced, or the app container that
//! took the hold has since restarted, the operator ends the hold at once instead of waiting for
//! its lease TTL. The pod's sidecar, if still alive, sees its key deleted and reports `lost`.
//!
//! It watches only pods labelled `podlock.io/sidecar=true` (the injection webhook sets it) and
//! acts only on positive evidence: a watch event, or a successful read that finds the pod gone.
//! An unreachable API server releases nothing.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::SystemTime;
use tracing::{info, warn};

use super::etcd_watch::{PodEntry, PodIndex, PodKey};
use crate::lock::etcd::Etcd;
use crate::lock::queue::{self, Ticket};
use crate::metrics::OperatorMetrics;

/// The label that marks pods with a podlock sidecar.
pub const SIDECAR_LABEL: &str = "podlock.io/sidecar";

/// The sidecar container's name, which is not an app container.
pub const SIDECAR_CONTAINER: &str = "podlock";

/// Why the operator ended a hold (the `reason` label of `podlock_forced_releases_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The Pod object was deleted.
    PodDeleted,
    /// The pod reached phase `Failed`.
    PodFailed,
    /// The pod reached phase `Succeeded`.
    PodSucceeded,
    /// A pod of the same name now has another uid.
    PodReplaced,
    /// An app container started or terminated after the hold began.
    ContainerRestarted,
}

impl Reason {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::PodDeleted => "pod_deleted",
            Reason::PodFailed => "pod_failed",
            Reason::PodSucceeded => "pod_succeeded",
            Reason::PodReplaced => "pod_replaced",
            Reason::ContainerRestarted => "container_restarted",
        }
    }

    /// Whether the whole pod (its sidecar too) is gone: then its leases are revoked.
    fn whole_pod(self) -> bool {
        self != Reason::ContainerRestarted
    }
}

/// Why `entry` must end given the pod as the API server has it, if it must.
pub fn verdict(pod: &Pod, entry: &PodEntry) -> Option<Reason> {
    if pod.metadata.uid.as_deref() != Some(entry.uid.as_str()) {
        return Some(Reason::PodReplaced);
    }
    let status = pod.status.as_ref()?;
    match status.phase.as_deref() {
        Some("Failed") => return Some(Reason::PodFailed),
        Some("Succeeded") => return Some(Reason::PodSucceeded),
        _ => {}
    }
    // Kubernetes reports container times in whole seconds: only a later second is "after"; a
    // start in the same second as the hold may be the incarnation that took it, and is kept.
    let since = entry
        .since
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let after = |t: Option<&Time>| {
        t.is_some_and(|t| {
            SystemTime::from(t.0)
                .duration_since(SystemTime::UNIX_EPOCH)
                .is_ok_and(|d| d.as_secs() > since)
        })
    };
    let restarted = status
        .container_statuses
        .iter()
        .flatten()
        .filter(|c| c.name != SIDECAR_CONTAINER)
        .any(|c| {
            let state = c.state.as_ref();
            after(
                state
                    .and_then(|s| s.running.as_ref())
                    .and_then(|r| r.started_at.as_ref()),
            ) || after(
                state
                    .and_then(|s| s.terminated.as_ref())
                    .map(|t| &t.finished_at)
                    .and_then(Option::as_ref),
            ) || after(
                c.last_state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .and_then(|t| t.finished_at.as_ref()),
            )
        });
    restarted.then_some(Reason::ContainerRestarted)
}

/// Watches pods and ends the holds of dead ones, until the pods stream ends.
pub async fn run(
    client: kube::Client,
    etcd: Etcd,
    index: Arc<PodIndex>,
    mut new_entries: tokio::sync::mpsc::Receiver<PodKey>,
    namespace: Option<String>,
    metrics: OperatorMetrics,
) {
    let pods: Api<Pod> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (store, writer) = reflector::store();
    let config = watcher::Config::default().labels(&format!("{SIDECAR_LABEL}=true"));
    let mut events = reflector::reflector(writer, watcher(pods, config).default_backoff()).boxed();
    let judge = Judge {
        client,
        etcd,
        index,
        metrics,
        store,
    };
    loop {
        tokio::select! {
            ev = events.next() => match ev {
                Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => judge.pod(&pod).await,
                Some(Ok(watcher::Event::Delete(pod))) => judge.deleted(&pod).await,
                Some(Ok(watcher::Event::InitDone)) => {
                    for key in judge.index.pods() {
                        judge.check(&key).await;
                    }
                }
                Some(Ok(watcher::Event::Init)) => {}
                Some(Err(e)) => warn!(error = %e, "pod watch failed; retrying (nothing is released meanwhile)"),
                None => return,
            },
            Some(key) = new_entries.recv() => judge.check(&key).await,
        }
    }
}

struct Judge {
    client: kube::Client,
    etcd: Etcd,
    index: Arc<PodIndex>,
    metrics: OperatorMetrics,
    store: Store<Pod>,
}

impl Judge {
    /// Checks a pod that has (new) entries: from the watch's cache, or read directly.
    async fn check(&self, (ns, name): &PodKey) {
        if self.index.entries_of(&(ns.clone(), name.clone())).is_empty() {
            return;
        }
        if let Some(pod) = self.store.get(&ObjectRef::new(name).within(ns)) {
            return self.pod(&pod).await;
        }
        // Not labelled, or not seen yet: ask the API server. Only a definite "not found" counts.
        match Api::<Pod>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await
        {
            Ok(Some(pod)) => self.pod(&pod).await,
            Ok(None) => {
                let entries = self.index.entries_of(&(ns.clone(), name.clone()));
                self.end(ns, name, entries, Reason::PodDeleted).await;
            }
            Err(e) => {
                warn!(pod = %name, namespace = %ns, error = %e, "cannot read pod; leaving its holds alone")
            }
        }
    }

    async fn pod(&self, pod: &Pod) {
        let (ns, name) = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let entries = self.index.entries_of(&(ns.clone(), name.clone()));
        let mut by_reason: Vec<(Reason, Vec<PodEntry>)> = vec![];
        for e in entries {
            if let Some(r) = verdict(pod, &e) {
                match by_reason.iter_mut().find(|(reason, _)| *reason == r) {
                    Some((_, list)) => list.push(e),
                    None => by_reason.push((r, vec![e])),
                }
            }
        }
        for (reason, entries) in by_reason {
            self.end(&ns, &name, entries, reason).await;
        }
    }

    async fn deleted(&self, pod: &Pod) {
        let (ns, name) = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        // Entries of a newer pod of the same name (another uid) are not this deletion's business.
        let entries: Vec<_> = self
            .index
            .entries_of(&(ns.clone(), name.clone()))
            .into_iter()
            .filter(|e| e.uid == uid)
            .collect();
        self.end(&ns, &name, entries, Reason::PodDeleted).await;
    }

    /// Ends `entries` of pod `ns/name`: revokes the leases when the whole pod is gone, else
    /// deletes just those keys (guarded by their create revision).
    async fn end(&self, ns: &str, name: &str, entries: Vec<PodEntry>, reason: Reason) {
        if entries.is_empty() {
            return;
        }
        let mut ended = 0u64;
        if reason.whole_pod() {
            let leases: BTreeSet<i64> = entries.iter().map(|e| e.lease).collect();
            for lease in leases {
                match self.etcd.client().clone().lease_revoke(lease).await {
                    Ok(_) => ended += entries.iter().filter(|e| e.lease == lease).count() as u64,
                    Err(e) => warn!(lease = format_args!("{lease:x}"), error = %e, "lease revoke failed"),
                }
            }
        } else {
            for e in &entries {
                let ticket = Ticket {
                    key: e.key.clone(),
                    revision: e.revision,
                    lease: e.lease,
                };
                match queue::remove(&self.etcd, &ticket).await {
                    Ok(true) => ended += 1,
                    Ok(false) => {}
                    Err(err) => warn!(key = e.key, error = %err, "could not end hold"),
                }
            }
        }
        if ended > 0 {
            self.metrics
                .forced_releases
                .with_label_values(&[reason.label()])
                .inc_by(ended);
            for e in &entries {
                info!(lock = %e.lock, holder = e.holder_id, pod = name, namespace = ns, reason = reason.label(), "ended hold of a dead pod");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pod(uid: &str, phase: &str, app_started: SystemTime) -> Pod {
        let started = humantime::format_rfc3339_seconds(app_started).to_string();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": uid},
            "status": {"phase": phase, "containerStatuses": [
                {"name": "app", "image": "", "imageID": "", "ready": true, "restartCount": 0,
                 "state": {"running": {"startedAt": started}}},
                {"name": "podlock", "image": "", "imageID": "", "ready": true, "restartCount": 3,
                 "state": {"running": {"startedAt": humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(99)).to_string()}}}
            ]}
        }))
        .unwrap()
    }

    fn entry(uid: &str, since: SystemTime) -> PodEntry {
        PodEntry {
            lock: crate::lock::LockId {
                namespace: "ns".into(),
                name: "l".into(),
            },
            key: "k".into(),
            revision: 1,
            lease: 1,
            holder_id: "h".into(),
            uid: uid.into(),
            since,
        }
    }

    #[test]
    fn verdicts() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_300);
        let sec = Duration::from_secs(1);
        // (The podlock container restarted after the hold, too: it says nothing about the app.)
        assert_eq!(verdict(&pod("u", "Running", t - sec), &entry("u", t)), None);
        // Same second as the hold: may be the incarnation that took it; kept.
        assert_eq!(
            verdict(
                &pod("u", "Running", t + Duration::from_millis(500)),
                &entry("u", t)
            ),
            None
        );
        assert_eq!(
            verdict(&pod("u", "Running", t + sec), &entry("u", t)),
            Some(Reason::ContainerRestarted)
        );
        assert_eq!(
            verdict(&pod("v", "Running", t - sec), &entry("u", t)),
            Some(Reason::PodReplaced)
        );
        assert_eq!(
            verdict(&pod("u", "Failed", t - sec), &entry("u", t)),
            Some(Reason::PodFailed)
        );
        assert_eq!(
            verdict(&pod("u", "Succeeded", t - sec), &entry("u", t)),
            Some(Reason::PodSucceeded)
        );
    }
}
