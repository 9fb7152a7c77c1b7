//! The reconciler: publishes each DistributedLock's settings to etcd, mirrors its queue into
//! `status`, and deletes its etcd keys when the object is deleted (finalizer).

pub mod annotated;
pub mod deadline;
pub(super) mod holder_service;
mod publish;
pub mod release;
pub mod yielding;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tracing::{info, warn};

use crate::crd::{Condition, DistributedLock, DistributedLockStatus, Holder, HolderServiceStatus};
use crate::lock::rfc3339;
use crate::lock::{LockId, LockState, Settings, Withdrawn};
use crate::metrics::{OperatorMetrics, RECONCILED};
use crate::operator::context::{Context, event, lock_id};
use crate::operator::reconcile_error::Error;
use holder_service::Followed;

/// The finalizer that makes deletion wait until the lock's etcd keys are gone.
pub const FINALIZER: &str = "podlock.io/cleanup";

/// How often a lock is re-read even without an etcd event (a backstop, not the mechanism).
const RESYNC: Duration = Duration::from_secs(300);

/// At most this many holders are listed in `status.holders` (`holderCount` counts them all): a
/// semaphore's status stays far below the 64 KiB a client should have to read (about 150 bytes
/// a holder) however many slots it has.
pub const STATUS_HOLDERS: usize = 100;

/// The `reason` label of holds ended by their lock's deletion.
pub const LOCK_DELETED: &str = "lock_deleted";

/// Reconciles one DistributedLock.
pub async fn reconcile(dl: Arc<DistributedLock>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let id = lock_id(&dl);
    if let Some(noticed) = ctx.noticed.take(&id) {
        let waited = started.duration_since(noticed);
        ctx.metrics.status_trigger.observe(waited.as_secs_f64());
    }
    let ns = dl.namespace().unwrap_or_default();
    let api: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &ns);
    let result = finalizer(&api, FINALIZER, dl, |event| async {
        match event {
            Finalizer::Apply(dl) => apply(&dl, &api, &ctx).await,
            Finalizer::Cleanup(dl) => cleanup(&dl, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        kube::runtime::finalizer::Error::AddFinalizer(e)
        | kube::runtime::finalizer::Error::RemoveFinalizer(e) => Error::Kube(e),
        other => Error::Finalizer(other.to_string()),
    });
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    count(&ctx.metrics, &result);
    if result.is_ok() {
        ctx.backoff.succeeded(&id);
    }
    result
}

/// Counts a reconciliation in `reconcile_total`, by its error's cause.
fn count(metrics: &OperatorMetrics, result: &Result<Action, Error>) {
    let label = result.as_ref().map_or_else(Error::label, |_| RECONCILED);
    metrics.reconcile_total.with_label_values(&[label]).inc();
}

/// Requeues a failed reconciliation after a backoff of its own (see [`Backoff`]).
pub fn error_policy(dl: Arc<DistributedLock>, error: &Error, ctx: Arc<Context>) -> Action {
    let retry = ctx.backoff.failed(&lock_id(&dl));
    warn!(lock = %dl.name_any(), namespace = dl.namespace().unwrap_or_default(), %error, ?retry, "reconcile failed");
    Action::requeue(retry)
}

/// Acts on a force release (`podlock.io/release`) and a yield request (`podlock.io/yield`),
/// publishes the lock's settings to etcd, mirrors its queue into `status` and ends the holds
/// past their deadline (a maximum hold time's their sidecar did not end, a yield request's);
/// comes again when the next deadline is due.
async fn apply(dl: &DistributedLock, api: &Api<DistributedLock>, ctx: &Context) -> Result<Action, Error> {
    release::handle(dl, api, ctx).await?;
    yielding::handle(dl, api, ctx).await?;
    let id = lock_id(dl);
    ctx.isolation
        .ensure(&ctx.client, &ctx.store, &id.namespace)
        .await
        .map_err(|e| Error::Isolation(e.into()))?;
    let mut state = match publish::settings(ctx, api, dl, &id).await {
        Ok(state) => state,
        Err(e @ Error::Kube(_)) => return Err(e),
        Err(e) => {
            // Read the status afresh: the publish may have recorded a new epoch in it, which
            // this write must keep.
            let now = api.get_status(&dl.name_any()).await?.status;
            let old = now.unwrap_or_default();
            let status = DistributedLockStatus {
                phase: old.phase.clone().or(Some("Pending".into())),
                conditions: vec![condition(dl, READY, "False", "EtcdUnavailable", &e.to_string())],
                ..old
            };
            ctx.status.write_now(&id, status).await?;
            return Err(e);
        }
    };
    let timed = std::mem::take(&mut state.timed);
    // Holds past their deadline end whatever became of the mirror: a holder Service that
    // cannot be written must not keep a hold its deadline or a yield request ended (F6).
    let mirrored = mirror_status(dl, ctx, &id, state).await;
    let next = deadline::enforce(ctx, dl, &id, timed).await?;
    if let Err(e) = mirrored {
        // Come back for the next deadline on time, failing or not.
        next.inspect(|&n| ctx.backoff.due_in(&id, n));
        return Err(e);
    }
    Ok(Action::requeue(next.map_or(RESYNC, |n| n.min(RESYNC))))
}

/// Mirrors the queue into the object's `status` (offered to the status writer) and the lock's
/// gauges.
async fn mirror_status(
    dl: &DistributedLock,
    ctx: &Context,
    id: &LockId,
    state: LockState,
) -> Result<(), Error> {
    let old = dl.status.clone().unwrap_or_default();
    let ready = ready(dl, &state, &ctx.cluster);
    let (queue, epoch) = (state.queue, state.settings.map(|s| s.epoch));
    let newest = queue.holders.iter().map(|h| h.fencing_token).max();
    let holders: Vec<Holder> = queue.holders.into_iter().map(Holder::from).collect();
    // The route first: it is what moves traffic to the new holder.
    let route = route(ctx, dl, &old, &holders).await;
    let mut conditions = vec![ready];
    conditions.extend(route.condition);
    let status = DistributedLockStatus {
        phase: Some(if holders.is_empty() { "Free" } else { "Held" }.into()),
        holder_count: holders.len() as u32,
        holders: holders.into_iter().take(STATUS_HOLDERS).collect(),
        waiters: queue.waiters as u32,
        fencing_token: old.fencing_token.max(newest),
        // Never below etcd's: it holds every epoch published and not lost since.
        fencing_epoch: old.fencing_epoch.max(epoch),
        observed_generation: dl.metadata.generation,
        conditions,
        holder_service: route.status,
    };
    let labels = [id.namespace.as_str(), id.name.as_str()];
    let holders = ctx.metrics.lock_holders.with_label_values(&labels);
    holders.set(status.holder_count.into());
    ctx.metrics
        .lock_waiters
        .with_label_values(&labels)
        .set(status.waiters.into());
    // Written apart, latest state first (see `status/writer.rs`); the `HolderChanged` Event
    // follows the write that shows the new holder.
    ctx.status.offer(id, dl, &old, status);
    route.failed.map_or(Ok(()), |e| Err(e.into()))
}

/// The `Ready` condition of a published lock: whose settings are live, and whether they are
/// this spec's (another cluster sharing the lock etcd may have published its own).
fn ready(dl: &DistributedLock, state: &LockState, cluster: &str) -> Condition {
    let publisher = &state.publisher;
    if publisher.is_empty() || publisher == cluster {
        return condition(dl, READY, "True", "Published", "settings are live in etcd");
    }
    let spec = dl.spec.settings();
    let live = state.settings.map(|s| Settings { epoch: 0, ..s });
    let differs = match live {
        Some(live) if live != spec => format!(
            "; they differ from this spec (maxHolders {}, ttlSeconds {}, \
             heartbeatTimeoutSeconds {}), and change only with cluster {publisher}'s \
             DistributedLock",
            live.max_holders, live.ttl_seconds, live.heartbeat_timeout_seconds
        ),
        _ => String::new(),
    };
    let message = format!("the settings cluster {publisher} published are live in etcd{differs}");
    condition(dl, READY, "True", "PublishedByOtherCluster", &message)
}

/// Where the holder Service routes after a reconciliation.
struct Route {
    /// What `status.holderService` says.
    status: Option<HolderServiceStatus>,
    /// The `HolderService` condition, when a Service is asked for.
    condition: Option<Condition>,
    /// Why the Service could not be kept (after the status is written, the reconciliation
    /// fails so that it is retried).
    failed: Option<kube::Error>,
}

/// Points the lock's holder Service at `holders` (see [`holder_service`]).
async fn route(
    ctx: &Context,
    dl: &DistributedLock,
    old: &DistributedLockStatus,
    holders: &[Holder],
) -> Route {
    let kind = holder_service::CONDITION;
    match holder_service::follow(&ctx.client, dl, old.holder_service.as_ref(), holders).await {
        Ok(None) => Route {
            status: None,
            condition: None,
            failed: None,
        },
        Ok(Some(followed)) => {
            let (state, reason, message) = followed.condition();
            let status = match followed {
                Followed::Routing(s) => Some(s),
                Followed::NameTaken(_) => None,
            };
            let condition = Some(condition(dl, kind, state, reason, &message));
            Route {
                status,
                condition,
                failed: None,
            }
        }
        Err(e) => {
            let message = format!("cannot keep the holder Service: {e}");
            let condition = Some(condition(dl, kind, "False", "ServiceFailed", &message));
            // Keep naming the Service it made, so that it is removed if no longer asked for.
            let status = old.holder_service.clone();
            Route {
                status,
                condition,
                failed: Some(e),
            }
        }
    }
}

async fn cleanup(dl: &DistributedLock, ctx: &Context) -> Result<Action, Error> {
    let id = lock_id(dl);
    let withdrawn = ctx.store.withdraw(&id, &ctx.cluster).await?;
    let Withdrawn {
        ended,
        removed,
        others,
    } = withdrawn.ok_or(Error::SettingsChanging(id.clone()))?;
    ctx.status.forget(&id);
    ctx.deadlines.forget(&id);
    info!(lock = %id, ended, removed, ?others, "withdrew from the lock in etcd");
    if ended > 0 {
        ctx.metrics
            .forced_releases
            .with_label_values(&[LOCK_DELETED])
            .inc_by(ended as u64);
    }
    let _ = ctx
        .metrics
        .lock_holders
        .remove_label_values(&[&id.namespace, &id.name]);
    let _ = ctx
        .metrics
        .lock_waiters
        .remove_label_values(&[&id.namespace, &id.name]);
    let note = match removed {
        true => format!("removed from etcd; {ended} holds and waits ended"),
        false => format!(
            "{ended} holds and waits of this cluster ended; the lock stays in etcd for the pods \
             of cluster(s) {} that queue on it",
            others.join(", ")
        ),
    };
    event(ctx, dl, EventType::Normal, "Deleted", note).await;
    Ok(Action::await_change())
}

/// The condition type that says the lock's settings are live in etcd.
const READY: &str = "Ready";

/// A condition of type `kind`, keeping its transition time when its status does not change.
fn condition(dl: &DistributedLock, kind: &str, status: &str, reason: &str, message: &str) -> Condition {
    let previous = dl
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == kind));
    let since = match previous {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => rfc3339(SystemTime::now()),
    };
    Condition {
        type_: kind.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: since,
        observed_generation: dl.metadata.generation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconciliations_are_counted_by_the_cause_of_their_failure() {
        let metrics = OperatorMetrics::new();
        metrics.start_at_zero(&Error::LABELS, &[]);
        count(&metrics, &Ok(Action::await_change()));
        count(
            &metrics,
            &Err(crate::lock::LockError::from(crate::lock::Unavailable::KeepaliveEnded).into()),
        );
        count(&metrics, &Err(Error::Finalizer("unnamed object".into())));
        let text = metrics.render();
        for (result, n) in [
            ("ok", 1),
            ("etcd_unavailable", 1),
            ("finalizer", 1),
            ("kube_api", 0),
        ] {
            let line = format!("podlock_reconcile_total{{result=\"{result}\"}} {n}\n");
            assert!(text.contains(&line), "no {line} in {text}");
        }
    }
}
