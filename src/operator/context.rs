//! What the reconciler and its parts (publishing settings, force releases) share: their
//! context, and the writes each of them makes to a DistributedLock (its status, its Events).

use kube::api::{Api, Patch};
use kube::core::TypeMeta;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};
use tracing::warn;

use super::backoff::Backoff;
use super::event_limit::EventLimit;
use super::isolation::Isolation;
use super::reconcile_error::Error;
use crate::crd::{DistributedLock, DistributedLockStatus};
use crate::lock::{LockId, Store};
use crate::metrics::OperatorMetrics;

/// What the reconciler shares.
pub struct Context {
    /// The Kubernetes client.
    pub client: kube::Client,
    /// etcd, where the locks live.
    pub store: Store,
    /// The operator's metrics.
    pub metrics: OperatorMetrics,
    /// Publishes Kubernetes Events.
    pub recorder: Recorder,
    /// When each lock last got a `HolderChanged` Event.
    pub holder_events: EventLimit,
    /// Retry delays of locks whose reconciliation failed.
    pub backoff: Backoff,
    /// Per-namespace etcd credentials.
    pub isolation: Isolation,
}

/// The lock a DistributedLock declares.
pub fn lock_id(dl: &DistributedLock) -> LockId {
    let (namespace, name) = (dl.namespace().unwrap_or_default(), dl.name_any());
    LockId::new(&namespace, &name).expect("the API server admits only valid object names")
}

/// Writes `status` whole, by server-side apply: the operator is the status' only writer, and
/// a field it leaves out (`holderService`, once no longer asked for) is removed, which a merge
/// patch of the same status would leave in place. Every list in it is atomic (the CRD marks
/// none as a map), so an applied list replaces the one there. (A field an earlier release
/// merged in keeps that manager as co-owner until the value changes; left out before then, it
/// stays, as it did with the merge patch.)
pub async fn patch_status(
    api: &Api<DistributedLock>,
    dl: &DistributedLock,
    status: &DistributedLockStatus,
) -> Result<(), Error> {
    let apply = StatusApply {
        types: TypeMeta::resource::<DistributedLock>(),
        status,
    };
    let params = super::owner::server_side_apply();
    api.patch_status(&dl.name_any(), &params, &Patch::Apply(&apply))
        .await?;
    Ok(())
}

/// A server-side apply of the `status` subresource: the object's type and its status alone.
#[derive(Debug, serde::Serialize)]
struct StatusApply<'a> {
    #[serde(flatten)]
    types: TypeMeta,
    status: &'a DistributedLockStatus,
}

/// Records a Kubernetes Event of `type_` on the DistributedLock (a failure is logged only).
pub async fn event(ctx: &Context, dl: &DistributedLock, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &dl.object_ref(&())).await {
        warn!(lock = %dl.name_any(), error = %e, "could not publish a Kubernetes Event");
    }
}
