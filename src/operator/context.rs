//! What the reconciler and its parts (publishing settings, force releases) share: their
//! context, and the Events each of them records on a DistributedLock.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};
use std::sync::Arc;
use tracing::warn;

use super::backoff::Backoff;
use super::event_limit::EventLimit;
use super::isolation::Isolation;
use super::status_writer::StatusWriter;
use crate::crd::DistributedLock;
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
    /// Writes each lock's status, latest state first.
    pub status: Arc<StatusWriter>,
}

/// The lock a DistributedLock declares.
pub fn lock_id(dl: &DistributedLock) -> LockId {
    let (namespace, name) = (dl.namespace().unwrap_or_default(), dl.name_any());
    LockId::new(&namespace, &name).expect("the API server admits only valid object names")
}

/// Records a Kubernetes Event of `type_` on the DistributedLock (a failure is logged only).
pub async fn event(ctx: &Context, dl: &DistributedLock, type_: EventType, reason: &str, note: String) {
    event_on(ctx, &dl.object_ref(&()), type_, reason, note).await;
}

/// Records a Kubernetes Event of `type_` on `object` (a failure is logged only).
pub async fn event_on(ctx: &Context, object: &ObjectReference, type_: EventType, reason: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, object).await {
        warn!(object = ?object.name, error = %e, "could not publish a Kubernetes Event");
    }
}
