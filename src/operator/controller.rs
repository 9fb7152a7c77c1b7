//! The leader's work: the DistributedLock controller (reconcile on a spec, finalizer or
//! annotation change, on an etcd change of the lock, and on a resync), pod liveness, the etcd
//! watch that feeds both, pods that run without the sidecar they asked for, the status
//! writer, each namespace's credentials Secret, and, first,
//! the clean-up of locks deleted while no operator led.

use futures::StreamExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{Config, Controller};
use kube::runtime::{Predicate, WatchStreamExt, predicates, reflector, watcher};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

use super::context::{self, Context};
use super::liveness;
use super::reconcile::{self, error_policy, reconcile, release};
use super::sidecar_missing;
use crate::crd::DistributedLock;
use crate::lock::{LockId, Store};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// At most this many locks are reconciled at once: an etcd watch reconnect or a restart asks
/// for every lock, and 10,000 reconciliations at once would flood the API server and etcd.
const RECONCILE_CONCURRENCY: u16 = 16;

/// The leader's work: clean up orphans, then reconcile locks, watch pods and re-make deleted
/// credentials Secrets (every `credentials_check`) until dropped.
pub(super) async fn lead(ctx: Arc<Context>, namespace: Option<String>, credentials_check: Duration) {
    let ns = namespace.as_deref();
    let locks: Api<DistributedLock> = scoped(&ctx.client, ns);
    if let Err(e) = remove_orphans(&locks, &ctx.store, ns, &ctx.cluster).await {
        warn!(error = %e, "could not clean up etcd keys of deleted locks; will retry when leading again");
    }
    let marks = (ctx.noticed.clone(), ctx.returned.clone());
    let (feeds, pump) = liveness::etcd_watch::watch(ctx.store.clone(), ns, marks, &ctx.cluster);
    let liveness = liveness::run(
        ctx.client.clone(),
        ctx.store.clone(),
        feeds.index,
        feeds.pods,
        namespace.clone(),
        ctx.metrics.clone(),
    );
    // Only a change of the spec (its generation, which a deletion bumps too), of the finalizers
    // or of the annotations of a force release or a yield request starts a reconciliation. Without the filter, each
    // status patch of the operator's own came back as a watch event and cost one more
    // reconciliation (an etcd read that found nothing to write): half of a busy lock's
    // reconciliations, queued ahead of the ones status lag waits for.
    let (reader, writer) = reflector::store();
    let changes = watcher(locks, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            predicates::generation
                .combine(predicates::finalizers)
                .combine(release::requested)
                .combine(reconcile::yielding::requested),
            Default::default(),
        );
    let controller = Controller::for_stream(changes, reader)
        .with_config(
            Config::default()
                .debounce(Duration::from_millis(50))
                .concurrency(RECONCILE_CONCURRENCY),
        )
        // A holder Service or slice changed or deleted by hand is put back at once.
        .owns(scoped::<Service>(&ctx.client, ns), holder_service_objects())
        .owns(scoped::<EndpointSlice>(&ctx.client, ns), holder_service_objects())
        .reconcile_on(feeds.changed)
        .reconcile_all_on(feeds.resync)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    tokio::select! {
        _ = pump => {}
        _ = liveness => {}
        _ = sidecar_missing::run(ctx.clone(), namespace.clone()) => {}
        _ = controller => {}
        _ = ctx.isolation.keep_secrets(&ctx.client, credentials_check) => {}
        _ = ctx.status.clone().run() => {}
    }
}

/// An API of `K` in `ns`, or in every namespace.
fn scoped<K>(client: &kube::Client, ns: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Only the Services and EndpointSlices the operator made for `spec.holderService`.
fn holder_service_objects() -> watcher::Config {
    watcher::Config::default().labels(reconcile::holder_service::LABEL)
}

/// Withdraws this cluster from the locks whose DistributedLock no longer exists (deleted while
/// the operator was down): ends its own pods' keys there, and removes the locks no other
/// cluster's pod queues on (see `Store::withdraw`).
async fn remove_orphans(
    locks: &Api<DistributedLock>,
    store: &Store,
    ns: Option<&str>,
    cluster: &str,
) -> anyhow::Result<()> {
    let existing: BTreeSet<LockId> = locks
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|dl| dl.metadata.deletion_timestamp.is_none())
        .map(context::lock_id)
        .collect();
    for id in store.locks(ns).await?.difference(&existing) {
        if let Some(w) = store.withdraw(id, cluster).await?
            && (w.ended > 0 || w.removed)
        {
            info!(lock = %id, ended = w.ended, removed = w.removed, "withdrew from a deleted lock");
        }
    }
    Ok(())
}
