//! Force release: `kubectl annotate dlock NAME podlock.io/release=HOLDER` ends that holder's
//! hold of the lock (`=*`: every hold), the way an administrator ends a hung app's hold without
//! touching its pod. Whoever may patch the DistributedLock may do it (RBAC: `patch` on
//! `distributedlocks`, which the chart's `podlock-admin` role aggregates into `edit`).
//!
//! The operator acts at most once per annotation: it first removes the annotation (a JSON
//! patch that tests its value, so a value set again meanwhile is never lost), then reads who
//! holds and deletes exactly those keys, each guarded by the create revision it read. A crash
//! in between loses the request (no Event says it was done; annotate again) but can never end
//! a later hold that the same holder id took after the one the administrator meant. The
//! holder's sidecar reads the note the deletion leaves and reports `lost` saying an
//! administrator released it; the next waiter is granted as after any release. Each request
//! ends in an Event on the DistributedLock: `Released` (who, pod, token, and the field manager
//! that set the annotation) or a Warning naming what was wrong. When several clusters share
//! the lock etcd, an operator releases only its own cluster's pods' holds: another cluster's
//! holder is named in the Event, to be released from its own cluster.

use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::events::EventType;

use super::annotated::{self, Kind};
use crate::crd::DistributedLock;
use crate::lock::Ending;
use crate::operator::context::{Context, event, lock_id};
use crate::operator::reconcile_error::Error;

/// The annotation that asks for a release.
pub const ANNOTATION: &str = "podlock.io/release";

/// The `reason` label of holds ended this way in `podlock_forced_releases_total`.
pub const REASON: &str = "admin_release";

/// A force release's Events.
const KIND: Kind = Kind {
    done: "released",
    there: "release them there",
    done_reason: "Released",
    other_cluster: "ReleaseOtherCluster",
    not_held: "ReleaseNotHeld",
    failed: "ReleaseFailed",
};

/// What the controller hashes to see the annotation change (see `predicates`).
pub fn requested(dl: &DistributedLock) -> Option<u64> {
    annotated::hash_of(dl, &[ANNOTATION])
}

/// Acts on the annotation, if `dl` has it: removes it, ends the holds it names and records
/// an Event. An etcd failure is returned (after its Warning) so that the reconciliation is
/// counted as failed.
pub async fn handle(dl: &DistributedLock, api: &Api<DistributedLock>, ctx: &Context) -> Result<(), Error> {
    let Some(value) = dl.annotations().get(ANNOTATION) else {
        return Ok(());
    };
    if !annotated::take(dl, api, &[(ANNOTATION, value)]).await? {
        return Ok(()); // changed or removed meanwhile: that change brings its own reconciliation
    }
    let asked = annotated::asked(dl, ANNOTATION, value);
    if let Err(problem) = annotated::check(value) {
        let note = format!("{asked} ignored: {problem}");
        event(ctx, dl, EventType::Warning, "ReleaseInvalid", note).await;
        return Ok(());
    }
    let request = (&KIND, asked.as_str());
    let held = match ctx.store.holding(&lock_id(dl)).await {
        Ok(held) => held,
        Err(e) => return Err(annotated::failed(ctx, dl, request, &[], e).await),
    };
    let (named, elsewhere) = annotated::named(&held, value, &ctx.cluster);
    let mut released = vec![];
    for entry in named {
        match ctx.store.release(entry, Ending::Admin).await {
            Ok(true) => {
                ctx.metrics.forced_releases.with_label_values(&[REASON]).inc();
                released.push(annotated::describe(entry));
            }
            Ok(false) => {}
            Err(e) => return Err(annotated::failed(ctx, dl, request, &released, e).await),
        }
    }
    annotated::report(ctx, dl, request, &held, released, elsewhere).await;
    Ok(())
}
