//! Please yield: `kubectl annotate dlock NAME podlock.io/yield=HOLDER` (`=*`: every holder),
//! optionally with `podlock.io/yield-grace=30s`, asks that holder to release within the grace
//! (the lock's `spec.yieldGraceSeconds` when none is given). Whoever may force a release may
//! ask (RBAC: `patch` on `distributedlocks`).
//!
//! The operator takes the request once, as a force release is taken (see `annotated`), reads
//! who holds, and writes the deadline into each named holder's entry once its grant is
//! recorded: a compare-and-swap that keeps whatever else the entry says (`entry_swap` in the
//! engine; the protocol model's run "yield requests"). The holder's sidecar sees the write on its key's watch and sends its app
//! a `yield` event with the deadline; `podlock lock` passes it on to its command as SIGTERM. A
//! holder that releases by then ends as any release does. One still holding at the deadline
//! is ended by the operator as a force release is, with the Event `YieldReleased`, the metric
//! `podlock_forced_releases_total{reason="yield"}` and `lost` reason `yield` (see
//! `deadline`). The deadline lives in etcd, in the entry: an operator restarted meanwhile, or
//! another replica that leads next, keeps it. A request made again never moves a deadline
//! later. Only this cluster's pods' holds are asked; another cluster's are named in the Event.

use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::events::EventType;
use std::time::{Duration, SystemTime};

use super::annotated::{self, Kind};
use crate::crd::{DistributedLock, YIELD_GRACE};
use crate::operator::context::{Context, event, lock_id};
use crate::operator::reconcile_error::Error;

/// The annotation that asks a holder to yield.
pub const ANNOTATION: &str = "podlock.io/yield";

/// The annotation that says how long the holder has (`30s`, `2m`; the lock's
/// `spec.yieldGraceSeconds` otherwise).
pub const GRACE: &str = "podlock.io/yield-grace";

/// The `reason` label of holds ended at a yield request's deadline in
/// `podlock_forced_releases_total`, and the reason of their `lost` event.
pub const REASON: &str = crate::lock::YIELD;

/// A yield request's Events.
const KIND: Kind = Kind {
    done: "asked to yield",
    there: "ask them there",
    done_reason: "YieldAsked",
    other_cluster: "YieldOtherCluster",
    not_held: "YieldNotHeld",
    failed: "YieldFailed",
};

/// What the controller hashes to see the annotations change (see `predicates`).
pub fn requested(dl: &DistributedLock) -> Option<u64> {
    annotated::hash_of(dl, &[ANNOTATION, GRACE])
}

/// Acts on the annotations, if `dl` has them: removes them, writes the deadline into the
/// entries of the holds named and records an Event. An etcd failure is returned (after its
/// Warning) so that the reconciliation is counted as failed.
pub async fn handle(dl: &DistributedLock, api: &Api<DistributedLock>, ctx: &Context) -> Result<(), Error> {
    let Some(value) = dl.annotations().get(ANNOTATION) else {
        return Ok(());
    };
    let given = dl.annotations().get(GRACE);
    let mut taken = vec![(ANNOTATION, value.as_str())];
    taken.extend(given.map(|g| (GRACE, g.as_str())));
    if !annotated::take(dl, api, &taken).await? {
        return Ok(()); // changed or removed meanwhile: that change brings its own reconciliation
    }
    let asked = annotated::asked(dl, ANNOTATION, value);
    let checked = annotated::check(value).and_then(|()| grace(given, dl.spec.yield_grace_seconds));
    let grace = match checked {
        Ok(grace) => grace,
        Err(problem) => {
            let note = format!("{asked} ignored: {problem}");
            event(ctx, dl, EventType::Warning, "YieldInvalid", note).await;
            return Ok(());
        }
    };
    let by = SystemTime::now() + grace;
    let request = (&KIND, asked.as_str());
    let held = match ctx.store.holding(&lock_id(dl)).await {
        Ok(held) => held,
        Err(e) => return Err(annotated::failed(ctx, dl, request, &[], e).await),
    };
    let (named, elsewhere) = annotated::named(&held, value, &ctx.cluster);
    let mut asked_to = vec![];
    for entry in named {
        match ctx.store.ask_to_yield(entry, by).await {
            Ok(Some(deadline)) => asked_to.push(format!("{} by {deadline}", annotated::describe(entry))),
            Ok(None) => {} // released meanwhile
            Err(e) => return Err(annotated::failed(ctx, dl, request, &asked_to, e).await),
        }
    }
    annotated::report(ctx, dl, request, &held, asked_to, elsewhere).await;
    Ok(())
}

/// The grace a request gives: its `podlock.io/yield-grace` (whole seconds, `30`, as every
/// other seconds field takes them, or a duration, `30s`, `2m`), else the lock's default; the
/// problem with the annotation otherwise.
fn grace(given: Option<&String>, default_seconds: u32) -> Result<Duration, String> {
    let Some(given) = given else {
        return Ok(Duration::from_secs(default_seconds.into()));
    };
    let bad = |why: String| format!("{GRACE}={given:?} {why}");
    let grace = match given.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => humantime::parse_duration(given).map_err(|e| {
            bad(format!(
                "is not seconds or a duration ({e}); write e.g. 30, 30s or 2m"
            ))
        })?,
    };
    let (min, max) = (YIELD_GRACE.min.into(), YIELD_GRACE.max.into());
    if grace < Duration::from_secs(min) || grace > Duration::from_secs(max) {
        return Err(bad(format!("must lie between {min}s and {max}s")));
    }
    Ok(grace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grace_is_a_duration_within_bounds_else_the_locks_default() {
        assert_eq!(grace(None, 30), Ok(Duration::from_secs(30)));
        assert_eq!(grace(Some(&"2m".into()), 30), Ok(Duration::from_secs(120)));
        assert_eq!(grace(Some(&"45".into()), 30), Ok(Duration::from_secs(45)));
        assert!(grace(Some(&"0".into()), 30).is_err());
        let many = grace(Some(&"86401".into()), 30).unwrap_err();
        assert!(many.contains("between 1s and 86400s"), "{many}");
        let bad = grace(Some(&"soon".into()), 30).unwrap_err();
        assert!(bad.contains(GRACE) && bad.contains("30s"), "{bad}");
        let long = grace(Some(&"2d".into()), 30).unwrap_err();
        assert!(long.contains("between 1s and 86400s"), "{long}");
        assert!(grace(Some(&"0s".into()), 30).is_err());
    }
}
