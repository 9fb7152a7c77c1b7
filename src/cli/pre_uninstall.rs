//! `podlock pre-uninstall`: what the chart's `pre-delete` hook runs before `helm uninstall`
//! deletes anything, so that no DistributedLock keeps a finalizer nobody would remove. Every
//! lock carries `podlock.io/cleanup`, which only the operator removes; without an operator a
//! deleted lock, its namespace or the CRD would wait in `Terminating` for ever.
//!
//! In this order, so that no operator adds the finalizer back: the operator's Deployment is
//! scaled to 0 and its pods are waited for until none is left (a leader steps down at
//! SIGTERM, and a replica reconciles nothing once gone), and only then is the finalizer removed
//! from every lock. A lock being deleted then goes at once; its keys stay in etcd (the bundled
//! etcd's go with its volumes; an operator installed again over the same etcd removes them as
//! orphans). Every step may be repeated: a hook that failed halfway runs again whole.

use clap::Args;
use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use std::time::{Duration, Instant};
use tracing::info;

use crate::crd::{DistributedLock, remove_if_still};
use crate::operator::FINALIZER;

/// Flags of `podlock pre-uninstall`.
#[derive(Debug, Clone, Args)]
pub struct PreUninstallArgs {
    /// The operator's Deployment, to scale to 0.
    #[arg(long, env = "PODLOCK_OPERATOR_DEPLOYMENT")]
    pub deployment: String,
    /// The Deployment's namespace (default: the service account's, else `default`).
    #[arg(long, env = "PODLOCK_OPERATOR_NAMESPACE")]
    pub operator_namespace: Option<String>,
    /// Only the DistributedLocks of this namespace (the operator's own `--watch-namespace`).
    #[arg(long, env = "PODLOCK_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// How long to wait for the operator's pods to be gone.
    #[arg(long, default_value_t = 120)]
    pub timeout_seconds: u64,
}

/// Why the hook failed: `helm uninstall` then stops before deleting anything, and may be run
/// again.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No Kubernetes API.
    #[error("cannot reach the Kubernetes API (KUBECONFIG or in-cluster): {0}")]
    Client(kube::Error),
    /// A request about the operator's Deployment or pods failed.
    #[error("cannot stop the operator (Deployment {namespace}/{name}): {source}")]
    Stop {
        /// The Deployment's namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The API server's answer.
        source: kube::Error,
    },
    /// The operator's pods outlived the timeout.
    #[error("the operator's pods are still there after {waited:?}: {pods}")]
    StillRunning {
        /// How long it waited.
        waited: Duration,
        /// The pods left.
        pods: String,
    },
    /// The Deployment selects its pods by no label.
    #[error("Deployment {0} selects its pods by no matchLabels: cannot tell when they are gone")]
    NoSelector(String),
    /// A request about the locks failed.
    #[error("cannot remove {FINALIZER} from the DistributedLocks: {0}")]
    Locks(kube::Error),
}

/// Stops the operator, then removes its finalizer from every DistributedLock.
pub async fn run(args: PreUninstallArgs) -> Result<(), Error> {
    let client = kube::Client::try_default().await.map_err(Error::Client)?;
    let namespace = (args.operator_namespace.clone()).unwrap_or_else(|| client.default_namespace().into());
    let stop = |source| Error::Stop {
        namespace: namespace.clone(),
        name: args.deployment.clone(),
        source,
    };
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    match deployments.get_opt(&args.deployment).await.map_err(stop)? {
        Some(deployment) => {
            let timeout = Duration::from_secs(args.timeout_seconds);
            let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
            stop_operator(&deployments, &pods, &deployment, timeout).await?;
        }
        None => info!(
            deployment = args.deployment,
            namespace, "no operator Deployment: nothing to stop"
        ),
    }
    let locks: Api<DistributedLock> = match &args.watch_namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    remove_finalizers(&locks).await
}

/// Scales `deployment` to 0 and waits until none of its pods is left.
async fn stop_operator(
    deployments: &Api<Deployment>,
    pods: &Api<Pod>,
    deployment: &Deployment,
    timeout: Duration,
) -> Result<(), Error> {
    let (name, namespace) = (deployment.name_any(), deployment.namespace().unwrap_or_default());
    let stop = |source| Error::Stop {
        namespace: namespace.clone(),
        name: name.clone(),
        source,
    };
    let selector = pod_selector(deployment)?;
    let scale = Patch::Merge(json!({"spec": {"replicas": 0}}));
    deployments
        .patch_scale(&name, &PatchParams::default(), &scale)
        .await
        .map_err(stop)?;
    info!(
        deployment = name,
        namespace, "scaled the operator to 0 replicas; waiting for its pods to go"
    );
    let (started, list) = (Instant::now(), ListParams::default().labels(&selector));
    loop {
        let listed = pods.list(&list).await.map_err(stop)?;
        let left: Vec<String> = listed.iter().map(|p| p.name_any()).collect();
        if left.is_empty() {
            info!(waited = ?started.elapsed(), "the operator's pods are gone");
            return Ok(());
        }
        if started.elapsed() > timeout {
            let pods = left.join(", ");
            return Err(Error::StillRunning {
                waited: timeout,
                pods,
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The label selector of `deployment`'s pods, from its `matchLabels` (without any, every pod
/// of the namespace would be taken for the operator's).
fn pod_selector(deployment: &Deployment) -> Result<String, Error> {
    let spec = deployment.spec.as_ref();
    let labels = spec
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    if labels.is_empty() {
        return Err(Error::NoSelector(deployment.name_any()));
    }
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Ok(pairs.join(","))
}

/// Removes [`FINALIZER`] from every lock of `locks` that has it (none when the CRD is gone).
async fn remove_finalizers(locks: &Api<DistributedLock>) -> Result<(), Error> {
    let all = match locks.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(e)) if e.code == 404 => {
            info!("no DistributedLock CRD: no finalizer to remove");
            return Ok(());
        }
        Err(e) => return Err(Error::Locks(e)),
    };
    let finalized = all
        .iter()
        .filter(|dl| dl.finalizers().iter().any(|f| f == FINALIZER));
    let removals = futures::stream::iter(finalized.map(Ok)).map_ok(|dl| remove_finalizer(locks, dl));
    let removed: Vec<bool> = removals.try_buffer_unordered(16).try_collect().await?;
    let deleting = all
        .iter()
        .filter(|dl| dl.metadata.deletion_timestamp.is_some())
        .count();
    info!(
        removed = removed.iter().filter(|r| **r).count(),
        locks = all.len(),
        deleting,
        "removed {FINALIZER} from the DistributedLocks; those being deleted are gone with it"
    );
    Ok(())
}

/// Removes [`FINALIZER`] from `dl`, by a JSON patch that first tests it is still where it was
/// read; `false` when the lock is gone meanwhile.
async fn remove_finalizer(locks: &Api<DistributedLock>, dl: &DistributedLock) -> Result<bool, Error> {
    let index = dl
        .finalizers()
        .iter()
        .position(|f| f == FINALIZER)
        .expect("filtered");
    let path = format!("/metadata/finalizers/{index}");
    let api = match dl.namespace() {
        Some(ns) => Api::namespaced(locks.clone().into_client(), &ns),
        None => locks.clone(),
    };
    match remove_if_still(&api, &dl.name_any(), &[(path, FINALIZER)]).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(Error::Locks(e)),
    }
}
