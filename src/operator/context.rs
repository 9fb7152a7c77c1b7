//! What the reconciler and its parts (publishing settings, force releases) share: their
//! context, and the Events each of them records on a DistributedLock.

use kube::runtime::events::{EventType, Recorder};
use kube::{Resource, ResourceExt};
use std::sync::Arc;

use super::backoff::Backoff;
use super::clocks::Clocks;
use super::isolation::Isolation;
use super::liveness::noticed::Noticed;
use super::liveness::returned::Returned;
use super::status::writer::StatusWriter;
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
    /// Retry delays of locks whose reconciliation failed.
    pub backoff: Backoff,
    /// Per-namespace etcd credentials.
    pub isolation: Isolation,
    /// When each lock's unread etcd change was noticed.
    pub noticed: Arc<Noticed>,
    /// The locks a restore brought keys back to, to move to a new epoch.
    pub returned: Arc<Returned>,
    /// Writes each lock's status, latest state first.
    pub status: Arc<StatusWriter>,
    /// When each hold with a maximum hold time began, as the operator reckons it.
    pub deadlines: Clocks,
    /// This cluster's name (`--cluster-name`; empty: the only one): the operator ends only
    /// the holds of its pods.
    pub cluster: String,
}

/// The lock a DistributedLock declares.
pub fn lock_id(dl: &DistributedLock) -> LockId {
    let (namespace, name) = (dl.namespace().unwrap_or_default(), dl.name_any());
    LockId::new(&namespace, &name).expect("the API server admits only valid object names")
}

/// Records a Kubernetes Event of `type_` on the DistributedLock (a failure is logged only).
pub async fn event(ctx: &Context, dl: &DistributedLock, type_: EventType, reason: &str, note: String) {
    super::events::publish(&ctx.recorder, &dl.object_ref(&()), type_, reason, note).await;
}
