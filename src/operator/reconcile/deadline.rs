//! The operator's side of a maximum hold time (`maxHoldSeconds`): a hold still in etcd
//! [`GRACE`] after its deadline was not ended by its sidecar (gone, hung, or cut off from
//! etcd while its lease lives on), so the operator ends it, as it ends a force release: it
//! deletes the hold's key guarded by its create revision (a later hold of the same holder id,
//! under the same key, is never touched) and leaves a note, so that a sidecar still alive
//! reports `lost` with reason `deadline`. Each such end is an Event `DeadlineReleased` on the
//! DistributedLock and counts in `podlock_forced_releases_total{reason="deadline"}`.
//!
//! The operator reckons a hold's start from the grant its entry records (`acquiredAt`), else
//! from when it first saw the entry hold: an unrecorded grant's `requestedAt` may lie long
//! before its grant (it waited), and ending it by that would cut the hold short.

use kube::runtime::events::EventType;
use std::time::{Duration, SystemTime};
use tracing::info;

use crate::crd::DistributedLock;
use crate::lock::{Ending, Entry, LockId, QueueEntry};
use crate::operator::context::{Context, event};
use crate::operator::reconcile_error::Error;

/// How long after a hold's deadline the operator ends it: its sidecar ends it at the deadline,
/// and a live sidecar's own end (or a clock of its node a little behind the operator's) must
/// win that race.
pub const GRACE: Duration = Duration::from_secs(2);

/// The `reason` label of holds ended this way in `podlock_forced_releases_total`.
pub const REASON: &str = "deadline";

/// Ends the holds of `timed` (the lock's holders with a maximum hold time) that are past their
/// deadline and [`GRACE`], those of this cluster's pods; returns how long until the next one is
/// due, if one is.
pub async fn enforce(
    ctx: &Context,
    dl: &DistributedLock,
    lock: &LockId,
    timed: Vec<QueueEntry>,
) -> Result<Option<Duration>, Error> {
    let now = SystemTime::now();
    let begun = ctx.deadlines.started(lock, &timed);
    let mut next: Option<Duration> = None;
    for (held, begun) in timed.iter().zip(begun) {
        let Some(entry) = held.entry.as_ref().filter(|e| e.pod.cluster == ctx.cluster) else {
            continue; // another cluster's pod: its own operator ends it
        };
        let due = begun + Duration::from_secs(entry.max_hold_seconds.into()) + GRACE;
        match due.duration_since(now) {
            Ok(left) => next = Some(next.map_or(left, |n| n.min(left))),
            Err(_) => end(ctx, dl, held, entry).await?,
        }
    }
    Ok(next)
}

/// Ends `held` (whose entry is `entry`) at its deadline, if it still holds under its key.
async fn end(ctx: &Context, dl: &DistributedLock, held: &QueueEntry, entry: &Entry) -> Result<(), Error> {
    if !ctx.store.release(held, Ending::Deadline).await? {
        return Ok(()); // gone meanwhile: its sidecar ended it, or it was released
    }
    ctx.metrics.forced_releases.with_label_values(&[REASON]).inc();
    let (holder, pod, seconds) = (&entry.holder_id, &entry.pod.name, entry.max_hold_seconds);
    info!(lock = %held.lock, holder, pod, token = held.revision, seconds, "ended a hold past its deadline");
    let note = format!(
        "ended the hold of {holder} (pod {pod}, key revision {}) {}s after its deadline \
         (maxHoldSeconds {seconds}): its sidecar had not ended it",
        held.revision,
        GRACE.as_secs()
    );
    event(ctx, dl, EventType::Normal, "DeadlineReleased", note).await;
    Ok(())
}
