//! The operator's side of a maximum hold time (`maxHoldSeconds`): a hold still in etcd
//! [`GRACE`] after its deadline was not ended by its sidecar (gone, hung, or cut off from
//! etcd while its lease lives on), so the operator ends it, as it ends a force release: it
//! deletes the hold's key guarded by its create revision (a later hold of the same holder id,
//! under the same key, is never touched) and leaves a note, so that a sidecar still alive
//! reports `lost` with reason `deadline`. Each such end is an Event `DeadlineReleased` on the
//! DistributedLock and counts in `podlock_forced_releases_total{reason="deadline"}`.
//!
//! A hold asked to yield (`podlock.io/yield`, see [`yielding`]) is ended here too, at the
//! request's deadline as its entry states it (the operator's own clock set it): its Event is
//! `YieldReleased`, its metric reason and its `lost` reason `yield`.
//!
//! The operator reckons a hold's start from the grant its entry records (`acquiredAt`, the
//! moment its holder learned of it), else a lease TTL after it first saw the entry hold (see
//! [`Clocks`](crate::operator::clocks::Clocks)): never from an unrecorded grant's
//! `requestedAt`, which may lie long before its grant (it waited), nor from the operator's
//! first sight, which may come before the holder learns of a grant handed to it.

use kube::runtime::events::EventType;
use std::time::{Duration, SystemTime};
use tracing::info;

use crate::crd::DistributedLock;
use crate::lock::{Ending, Entry, LockId, QueueEntry};
use crate::operator::context::{Context, event};
use crate::operator::reconcile::yielding;
use crate::operator::reconcile_error::Error;

/// How long after a hold's deadline the operator ends it: its sidecar ends it at the deadline,
/// and a live sidecar's own end (or a clock of its node a little behind the operator's) must
/// win that race.
pub const GRACE: Duration = Duration::from_secs(2);

/// The `reason` label of holds ended this way in `podlock_forced_releases_total`.
pub const REASON: &str = crate::lock::DEADLINE;

/// Ends the holds of `timed` (the lock's holders with a deadline) that are past it, those of
/// this cluster's pods; returns how long until the next one is due, if one is.
pub async fn enforce(
    ctx: &Context,
    dl: &DistributedLock,
    lock: &LockId,
    timed: Vec<QueueEntry>,
) -> Result<Option<Duration>, Error> {
    let now = SystemTime::now();
    let begun = ctx.deadlines.started(lock, &timed, now);
    let mut next: Option<Duration> = None;
    for (held, begun) in timed.iter().zip(begun) {
        let Some(entry) = held.entry.as_ref().filter(|e| e.pod.cluster == ctx.cluster) else {
            continue; // another cluster's pod: its own operator ends it
        };
        let Some((due, why)) = due(entry, begun) else {
            continue;
        };
        match due.duration_since(now) {
            Ok(left) => next = Some(next.map_or(left, |n| n.min(left))),
            Err(_) => end(ctx, dl, held, entry, why).await?,
        }
    }
    Ok(next)
}

/// When the operator ends a hold with `entry` that began at `begun`, and why: its maximum
/// hold time's deadline and [`GRACE`] (its sidecar ends it at the deadline), or a yield
/// request's deadline, whichever comes first. Public for the seeded world (tests/sim), whose
/// operator decides by it.
pub fn due(entry: &Entry, begun: SystemTime) -> Option<(SystemTime, Ending)> {
    let max_hold = (entry.max_hold_seconds > 0).then(|| {
        let at = begun + Duration::from_secs(entry.max_hold_seconds.into()) + GRACE;
        (at, Ending::Deadline)
    });
    let asked = entry
        .yield_deadline
        .as_deref()
        .and_then(|by| humantime::parse_rfc3339(by).ok());
    let yielded = asked.map(|at| (at, Ending::Yield));
    max_hold.into_iter().chain(yielded).min_by_key(|(at, _)| *at)
}

/// Ends `held` (whose entry is `entry`) at its deadline, for `why`, if it still holds under
/// its key.
async fn end(
    ctx: &Context,
    dl: &DistributedLock,
    held: &QueueEntry,
    entry: &Entry,
    why: Ending,
) -> Result<(), Error> {
    if !ctx.store.release(held, why).await? {
        return Ok(()); // gone meanwhile: its sidecar ended it, or it was released
    }
    let (holder, pod, seconds) = (&entry.holder_id, &entry.pod.name, entry.max_hold_seconds);
    let (label, reason, note) = match why {
        Ending::Yield => (
            yielding::REASON,
            "YieldReleased",
            format!(
                "ended the hold of {holder} (pod {pod}, key revision {}) at the deadline of the \
                 request that it yield ({}): it had not released",
                held.revision,
                entry.yield_deadline.as_deref().unwrap_or("?")
            ),
        ),
        _ => (
            REASON,
            "DeadlineReleased",
            format!(
                "ended the hold of {holder} (pod {pod}, key revision {}) {}s after its deadline \
                 (maxHoldSeconds {seconds}): its sidecar had not ended it",
                held.revision,
                GRACE.as_secs()
            ),
        ),
    };
    ctx.metrics.forced_releases.with_label_values(&[label]).inc();
    info!(lock = %held.lock, holder, pod, token = held.revision, reason, "ended a hold past its deadline");
    event(ctx, dl, EventType::Normal, reason, note).await;
    Ok(())
}
