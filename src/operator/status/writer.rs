//! Writes the DistributedLocks' status apart from their reconciliation. A reconciliation
//! offers the lock's latest status and goes on: it no longer holds one of the controller's
//! slots while the API server answers, and a lock that changes again while its write waits is
//! written once, as it is then. Which write goes next, and how often one lock is written, is
//! [`plan`](super::plan)' policy; this runs it with a few writers.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch};
use kube::core::TypeMeta;
use kube::runtime::events::{EventType, Recorder};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::Notify;
use tracing::warn;

use super::event_limit::EventLimit;
use super::plan::{Ended, Outcome, Pending, Writes};
use crate::crd::{DistributedLock, DistributedLockStatus};
use crate::lock::LockId;
use crate::metrics::OperatorMetrics;
use crate::operator::backoff::Backoff;
use crate::operator::events;
use crate::operator::reconcile_error::Error;

/// How many status writes are under way at most: enough to keep a slow API server busy,
/// few enough that a backlog waits here, in the slots, where newer states replace older ones.
const WRITERS: usize = 8;

/// The status slots of every lock, and the writers' wake-ups.
pub struct StatusWriter {
    writes: Mutex<Writes>,
    /// A write was offered, or a lock was freed for its next one.
    offered: Notify,
    /// A write landed (for [`write_now`](Self::write_now), waiting for one under way).
    landed: Notify,
    /// Pauses of locks whose write failed.
    backoff: Backoff,
    metrics: OperatorMetrics,
    client: kube::Client,
    recorder: Recorder,
    /// When each lock last got a `HolderChanged` Event.
    holder_events: EventLimit,
}

impl StatusWriter {
    /// No slot filled yet; writes through `client`, records Events with `recorder`.
    pub fn new(metrics: OperatorMetrics, client: kube::Client, recorder: Recorder) -> Self {
        StatusWriter {
            writes: Mutex::default(),
            offered: Notify::new(),
            landed: Notify::new(),
            backoff: Backoff::default(),
            metrics,
            client,
            recorder,
            holder_events: EventLimit::default(),
        }
    }

    /// Offers `status` as the latest of the lock `dl`, whose cached status is `cached`.
    pub fn offer(
        &self,
        id: &LockId,
        dl: &DistributedLock,
        cached: &DistributedLockStatus,
        status: DistributedLockStatus,
    ) {
        use kube::Resource;
        let object = dl.object_ref(&());
        let mut writes = self.writes.lock().unwrap();
        if writes.offer(id, object, cached, status, Instant::now()) {
            self.offered.notify_one();
        }
        self.metrics.status_writes_pending.set(writes.pending() as i64);
    }

    /// Forgets the lock `id`, whose DistributedLock is gone.
    pub fn forget(&self, id: &LockId) {
        self.writes.lock().unwrap().forget(id);
        self.holder_events.forget(id);
    }

    /// Writes `status` now, after any write of the lock under way and never below the fencing
    /// epoch and token written before: for a write the reconciliation must see land (a new
    /// epoch recorded before etcd gets it).
    pub async fn write_now(&self, id: &LockId, mut status: DistributedLockStatus) -> Result<(), Error> {
        loop {
            let landed = self.landed.notified();
            if self.writes.lock().unwrap().begin(id, &mut status, Instant::now()) {
                break;
            }
            landed.await;
        }
        let (result, ended) = self.patch(id, &status).await;
        let outcome = match &result {
            Ok(()) => Outcome::Written,
            Err(_) => Outcome::Failed(std::time::Duration::ZERO),
        };
        self.ended(id, &status, outcome, ended);
        Ok(result?)
    }

    /// Runs the writers until dropped (with the leadership), starting from empty slots: writes
    /// dropped under way in an earlier term must not hold their lock, and the first
    /// reconciliations of the term offer every lock's status again.
    pub async fn run(self: Arc<Self>) {
        *self.writes.lock().unwrap() = Writes::default();
        let writers = (0..WRITERS).map(|_| self.work());
        futures::future::join_all(writers).await;
    }

    /// One writer: takes the write due, makes it, and so on; waits while none is due.
    async fn work(&self) {
        loop {
            let offered = self.offered.notified();
            let now = Instant::now();
            let next = self.writes.lock().unwrap().take(now);
            match next {
                Ok((id, pending)) => {
                    let waited = pending.waited(now).as_secs_f64();
                    self.metrics.status_wait.observe(waited);
                    // Another writer may find one more due.
                    self.offered.notify_one();
                    self.write(&id, pending).await;
                }
                Err(Some(due)) => {
                    let due = tokio::time::Instant::from_std(due);
                    tokio::select! {
                        _ = tokio::time::sleep_until(due) => {}
                        _ = offered => {}
                    }
                }
                Err(None) => offered.await,
            }
        }
    }

    /// Makes the write taken from the slots, then the `HolderChanged` Event it calls for.
    async fn write(&self, id: &LockId, pending: Pending) {
        let (result, mut ended) = self.patch(id, &pending.status).await;
        let outcome = match result {
            Ok(()) => {
                self.backoff.succeeded(id);
                Outcome::Written
            }
            Err(kube::Error::Api(e)) if e.code == 404 => Outcome::Gone,
            Err(error) => {
                let retry = self.backoff.failed(id);
                warn!(lock = %id, %error, ?retry, "could not write the lock's status; will write its latest");
                ended.retry = Some(pending.clone());
                Outcome::Failed(retry)
            }
        };
        let event = matches!(outcome, Outcome::Written) && pending.first_changed;
        self.ended(id, &pending.status, outcome, ended);
        if event && self.holder_events.allow(id) {
            self.holder_changed(&pending.object, &pending.status).await;
        }
    }

    /// PATCHes `status` (see [`patch_status`]), timed.
    async fn patch(&self, id: &LockId, status: &DistributedLockStatus) -> (Result<(), kube::Error>, Ended) {
        let started = Instant::now();
        let result = patch_status(&self.client, id, status).await;
        let took = started.elapsed();
        self.metrics.status_patch.observe(took.as_secs_f64());
        let ended = Ended {
            took,
            now: Instant::now(),
            retry: None,
        };
        (result, ended)
    }

    /// The `HolderChanged` Event, after the status that shows the change.
    async fn holder_changed(&self, object: &ObjectReference, status: &DistributedLockStatus) {
        let note = match status.holders.first() {
            Some(h) => format!(
                "held by {} (pod {}, token {})",
                h.holder_id, h.pod, h.fencing_token
            ),
            None => "free".into(),
        };
        events::publish(&self.recorder, object, EventType::Normal, "HolderChanged", note).await;
    }

    /// Records the end of a write and wakes whoever waits on the lock.
    fn ended(&self, id: &LockId, status: &DistributedLockStatus, outcome: Outcome, ended: Ended) {
        let mut writes = self.writes.lock().unwrap();
        writes.done(id, status, outcome, ended);
        self.metrics.status_writes_pending.set(writes.pending() as i64);
        drop(writes);
        self.landed.notify_waiters();
        self.offered.notify_one();
    }
}

/// Writes `status` whole, by server-side apply: the operator is the status' only writer, and
/// a field it leaves out (`holderService`, once no longer asked for) is removed, which a merge
/// patch of the same status would leave in place. Every list in it is atomic (the CRD marks
/// none as a map), so an applied list replaces the one there. (A field an earlier release
/// merged in keeps that manager as co-owner until the value changes; left out before then, it
/// stays, as it did with the merge patch.)
async fn patch_status(
    client: &kube::Client,
    id: &LockId,
    status: &DistributedLockStatus,
) -> Result<(), kube::Error> {
    let api: Api<DistributedLock> = Api::namespaced(client.clone(), &id.namespace);
    let apply = StatusApply {
        types: TypeMeta::resource::<DistributedLock>(),
        status,
    };
    let params = crate::operator::owner::server_side_apply();
    api.patch_status(&id.name, &params, &Patch::Apply(&apply)).await?;
    Ok(())
}

/// A server-side apply of the `status` subresource: the object's type and its status alone.
#[derive(Debug, serde::Serialize)]
struct StatusApply<'a> {
    #[serde(flatten)]
    types: TypeMeta,
    status: &'a DistributedLockStatus,
}
