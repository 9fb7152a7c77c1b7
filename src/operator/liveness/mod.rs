//! Pod liveness: when the pod behind a hold is gone, failed, replaced, or the app container that
//! took the hold has since restarted, the operator ends the hold at once instead of waiting for
//! its lease TTL. The pod's sidecar, if still alive, sees its key deleted and reports `lost`.
//!
//! It watches pods labelled `podlock.io/sidecar=true` (the injection webhook sets it), and each
//! other pod that holds or waits on its own (see `named_pods.rs`); never every pod of
//! the cluster. It acts only on positive evidence: a watch event, or a successful read that finds the pod gone.
//! An unreachable API server releases nothing. A pod watch can lag behind etcd, so "another
//! uid under this name" from the cache is checked by a fresh read before anything ends: the
//! cached pod may be the old one and the entry the new pod's.
//!
//! It trusts etcd keys, not values: an entry's namespace is its key's (which etcd's
//! per-namespace roles confine), holds end by deleting their keys (guarded by create
//! revision), and a lease is revoked only when every key on it is in the dead pod's namespace.

pub(super) mod etcd_watch;
mod named_pods;
pub(super) mod noticed;
pub(super) mod returned;
mod verdict;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{info, warn};

use crate::lock::{self, Revoked};
use crate::metrics::OperatorMetrics;
use crate::operator::inject::SIDECAR_LABEL;
use etcd_watch::{PodIndex, PodKey};
use named_pods::{NamedPods, Seen};
use verdict::PodEntry;
pub use verdict::{Reason, verdict};

/// Watches pods and ends the holds of dead ones, until the pods stream ends.
pub async fn run(
    client: kube::Client,
    locks: lock::Store,
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
    let (seen_tx, mut seen) = tokio::sync::mpsc::channel(1024);
    let judge = Judge {
        named: Mutex::new(NamedPods::new(client.clone(), seen_tx)),
        client,
        locks,
        index,
        metrics,
        store,
    };
    let mut tidy = tokio::time::interval(TIDY_NAMED_PODS);
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
            Some(named) = seen.recv() => judge.seen(named).await,
            _ = tidy.tick() => judge.tidy(),
        }
    }
}

/// How often single-pod watches of pods without entries are ended.
const TIDY_NAMED_PODS: Duration = Duration::from_secs(10);

struct Judge {
    named: Mutex<NamedPods>,
    client: kube::Client,
    locks: lock::Store,
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
        // Not labelled, or not seen yet: ask the API server.
        self.fresh(ns, name, None).await;
    }

    /// Judges the entries of `ns/name` (those of `only`, or all) on a fresh read of the pod.
    /// Only a definite "not found" counts as deleted.
    async fn fresh(&self, ns: &str, name: &str, only: Option<&[PodEntry]>) {
        let read = Api::<Pod>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await;
        let pod = (ns.to_string(), name.to_string());
        let entries = match only {
            Some(e) => e.to_vec(),
            None => self.index.entries_of(&pod),
        };
        match read {
            Ok(Some(fresh)) => {
                if !labelled(&fresh) {
                    self.named.lock().expect("not poisoned").watch(&pod);
                }
                for (reason, entries) in self.judged(&fresh, &pod, entries) {
                    self.end(ns, name, entries, reason).await;
                }
            }
            Ok(None) => self.end(ns, name, entries, Reason::PodDeleted).await,
            Err(e) => {
                warn!(pod = %name, namespace = %ns, error = %e, "cannot read pod; leaving its holds alone")
            }
        }
    }

    /// Judges `pod`'s entries as the watch reports it; a verdict of "replaced" is confirmed on
    /// a fresh read first (the watch may be behind the entry).
    async fn pod(&self, pod: &Pod) {
        let key = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let entries = self.index.entries_of(&key);
        for (reason, entries) in self.judged(pod, &key, entries) {
            if reason == Reason::PodReplaced {
                self.fresh(&key.0, &key.1, Some(&entries)).await;
            } else {
                self.end(&key.0, &key.1, entries, reason).await;
            }
        }
    }

    /// The entries that must end given `pod`, by reason; remembers what they are bound to.
    fn judged(&self, pod: &Pod, key: &PodKey, entries: Vec<PodEntry>) -> Vec<(Reason, Vec<PodEntry>)> {
        let mut by_reason: Vec<(Reason, Vec<PodEntry>)> = vec![];
        for e in entries {
            let mut bound = e.bound.clone();
            let reason = verdict(pod, &e, &mut bound);
            if bound != e.bound {
                self.index.bind(key, &e.key, e.revision, &bound);
            }
            if let Some(r) = reason {
                match by_reason.iter_mut().find(|(reason, _)| *reason == r) {
                    Some((_, list)) => list.push(e),
                    None => by_reason.push((r, vec![e])),
                }
            }
        }
        by_reason
    }

    /// What a single-pod watch saw.
    async fn seen(&self, seen: Seen) {
        match seen {
            Seen::Pod(pod) => self.pod(&pod).await,
            Seen::Deleted(pod) => self.deleted(&pod).await,
            // Found or not, a read tells (a pod deleted before its watch began is judged here).
            Seen::Listed((ns, name)) => self.fresh(&ns, &name, None).await,
        }
    }

    /// Ends the single-pod watches of pods that no longer hold or wait.
    fn tidy(&self) {
        let mut named = self.named.lock().expect("not poisoned");
        named.retain(|pod| !self.index.entries_of(pod).is_empty());
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

    /// Ends `entries` of pod `ns/name` by deleting their keys (guarded by create revision);
    /// when the whole pod is gone, also revokes their leases where that is sound.
    async fn end(&self, ns: &str, name: &str, entries: Vec<PodEntry>, reason: Reason) {
        // Together: ended one by one, the pod's own waiter behind its own holder would be
        // admitted for a moment, and a sidecar still running could answer that grant.
        let keys: Vec<(&str, i64, i64)> = (entries.iter())
            .map(|e| (e.key.as_str(), e.revision, e.lease))
            .collect();
        let done = match self.locks.end_entries(&keys).await {
            Ok(done) => done,
            Err(err) => {
                warn!(pod = name, namespace = ns, keys = keys.len(), error = %err, "could not end the pod's holds");
                vec![false; keys.len()]
            }
        };
        let mut ended = 0u64;
        for e in entries.iter().zip(done).filter_map(|(e, done)| done.then_some(e)) {
            ended += 1;
            info!(lock = %e.lock, holder = e.holder_id, pod = name, namespace = ns, reason = reason.label(), "ended hold of a dead pod");
        }
        if ended > 0 {
            self.metrics
                .forced_releases
                .with_label_values(&[reason.label()])
                .inc_by(ended);
        }
        if reason.whole_pod() {
            let leases: BTreeSet<i64> = entries.iter().map(|e| e.lease).filter(|l| *l != 0).collect();
            for lease in leases {
                self.revoke_if_own(ns, name, lease).await;
            }
        }
    }

    /// Revokes `lease` (the dead pod's sidecar session, so that a sidecar still running, e.g.
    /// on a partitioned node, cannot go on with it) only if every key still on it is under the
    /// pod's namespace: exactly what that namespace's own etcd role may revoke. A key of
    /// another namespace on it means the lease is not this pod's: a tenant attached its key to
    /// someone else's lease, and revoking it would end holds the tenant could never touch.
    async fn revoke_if_own(&self, ns: &str, pod: &str, lease: i64) {
        let lease_hex = format_args!("{lease:x}");
        match self.locks.revoke_lease_in(lease, ns).await {
            Ok(Revoked::Revoked | Revoked::Gone) => {}
            Ok(Revoked::Foreign(foreign)) => {
                warn!(lease = lease_hex, pod, namespace = ns, %foreign, "not revoking a lease that carries a key of another namespace")
            }
            Err(e) => warn!(lease = lease_hex, pod, namespace = ns, error = %e, "lease revoke failed"),
        }
    }
}

/// Whether the main pod watch sees `pod`.
fn labelled(pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    labels.and_then(|l| l.get(SIDECAR_LABEL)).map(String::as_str) == Some("true")
}
