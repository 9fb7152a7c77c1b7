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

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;
use tracing::info;

use crate::crd::{DistributedLock, remove_if_still};
use crate::lock::{Ending, QueueEntry, check_holder_id};
use crate::operator::context::{Context, event, lock_id};
use crate::operator::reconcile_error::Error;

/// The annotation that asks for a release.
pub const ANNOTATION: &str = "podlock.io/release";

/// The annotation's value that releases every hold.
pub const ALL: &str = "*";

/// The `reason` label of holds ended this way in `podlock_forced_releases_total`.
pub const REASON: &str = "admin_release";

/// What the controller hashes to see the annotation change (see `predicates`).
pub fn requested(dl: &DistributedLock) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let value = dl.annotations().get(ANNOTATION)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut h);
    Some(h.finish())
}

/// Acts on the annotation, if `dl` has it: removes it, ends the holds it names and records
/// an Event. An etcd failure is returned (after its Warning) so that the reconciliation is
/// counted as failed.
pub async fn handle(dl: &DistributedLock, api: &Api<DistributedLock>, ctx: &Context) -> Result<(), Error> {
    let Some(value) = dl.annotations().get(ANNOTATION) else {
        return Ok(());
    };
    if !take(dl, api, value).await? {
        return Ok(()); // changed or removed meanwhile: that change brings its own reconciliation
    }
    let asked = format!("{ANNOTATION}={value}{}", set_by(dl));
    if let Err(problem) = check(value) {
        let note = format!("{asked} ignored: {problem}");
        event(ctx, dl, EventType::Warning, "ReleaseInvalid", note).await;
        return Ok(());
    }
    let held = ctx.store.holding(&lock_id(dl)).await;
    let held = match held {
        Ok(held) => held,
        Err(e) => return Err(failed(ctx, dl, &asked, &[], e).await),
    };
    let (named, elsewhere): (Vec<&QueueEntry>, Vec<&QueueEntry>) = held
        .iter()
        .filter(|e| value == ALL || holder(e) == value)
        .partition(|e| cluster_of(e).is_none_or(|c| c == ctx.cluster));
    let elsewhere: Vec<String> = elsewhere.into_iter().map(describe).collect();
    let mut released = vec![];
    for entry in &named {
        match ctx.store.release(entry, Ending::Admin).await {
            Ok(true) => {
                ctx.metrics.forced_releases.with_label_values(&[REASON]).inc();
                released.push(describe(entry));
            }
            Ok(false) => {}
            Err(e) => return Err(failed(ctx, dl, &asked, &released, e).await),
        }
    }
    report(ctx, dl, &asked, &held, released, elsewhere).await;
    Ok(())
}

/// The cluster an entry's pod names (`None`: not an entry, which any operator may end).
fn cluster_of(e: &QueueEntry) -> Option<&str> {
    e.entry.as_ref().map(|e| e.pod.cluster.as_str())
}

/// Removes the annotation if it still has `value`; returns whether it did.
async fn take(dl: &DistributedLock, api: &Api<DistributedLock>, value: &str) -> Result<bool, Error> {
    let path = format!(
        "/metadata/annotations/{}",
        ANNOTATION.replace('~', "~0").replace('/', "~1")
    );
    match remove_if_still(api, &dl.name_any(), &path, value).await {
        Ok(_) => Ok(true),
        // The test failed (another value, or none) or the object is gone.
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409 | 422) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Whether `value` names a holder id (or every holder); the problem otherwise.
fn check(value: &str) -> Result<(), String> {
    if value == ALL {
        return Ok(());
    }
    check_holder_id(value).map_err(|e| format!("{e} (or {ALL} for every holder)"))
}

/// The holder id of an entry, as the lock's status shows it.
fn holder(e: &QueueEntry) -> &str {
    e.entry.as_ref().map_or("", |e| e.holder_id.as_str())
}

/// An entry for an Event: holder id, pod (and its cluster, if named) and token.
fn describe(e: &QueueEntry) -> String {
    let pod = e.entry.as_ref().map_or("?", |e| e.pod.name.as_str());
    let cluster = match cluster_of(e) {
        Some(c) if !c.is_empty() => format!(" of cluster {c}"),
        _ => String::new(),
    };
    format!("{} (pod {pod}{cluster}, token {})", holder(e), e.revision)
}

/// " (set by MANAGER at TIME)": the field manager that last wrote the annotation, from the
/// object's managed fields. (Who that was, the user, is in the API server's audit log.)
fn set_by(dl: &DistributedLock) -> String {
    let fields = dl.metadata.managed_fields.iter().flatten();
    let mut setter = fields.filter(|f| {
        let owned = f.fields_v1.as_ref().map(|v| &v.0["f:metadata"]["f:annotations"]);
        owned.is_some_and(|a| a.get(format!("f:{ANNOTATION}")).is_some())
    });
    match setter.next_back() {
        Some(f) => {
            let at = f
                .time
                .as_ref()
                .map(|t| format!(" at {}", t.0))
                .unwrap_or_default();
            format!(
                " (set by {}{at})",
                f.manager.as_deref().unwrap_or("an unnamed manager")
            )
        }
        None => String::new(),
    }
}

/// Records what a request did: `Released`, or a Warning that it ended nothing; either names
/// the holds left to the other clusters they belong to (`elsewhere`).
async fn report(
    ctx: &Context,
    dl: &DistributedLock,
    asked: &str,
    held: &[QueueEntry],
    released: Vec<String>,
    elsewhere: Vec<String>,
) {
    let left = match elsewhere.is_empty() {
        true => String::new(),
        false => format!(
            "; left to their own clusters' operators (release them there): {}",
            elsewhere.join(", ")
        ),
    };
    if !released.is_empty() {
        info!(lock = %lock_id(dl), ?released, ?elsewhere, "released at an administrator's request");
        let note = format!("{asked}: released {}{left}", released.join(", "));
        return event(ctx, dl, EventType::Normal, "Released", note).await;
    }
    if !elsewhere.is_empty() {
        let note = format!("{asked}: nothing released{left}");
        return event(ctx, dl, EventType::Warning, "ReleaseOtherCluster", note).await;
    }
    let holders: Vec<String> = held.iter().map(describe).collect();
    let now = match holders.is_empty() {
        true => "nobody holds the lock".to_string(),
        false => format!("the holders are {}", holders.join(", ")),
    };
    let note = format!("{asked}: nothing released: {now}");
    event(ctx, dl, EventType::Warning, "ReleaseNotHeld", note).await;
}

/// Records that etcd failed a request (after `released`), and returns the error.
async fn failed(
    ctx: &Context,
    dl: &DistributedLock,
    asked: &str,
    released: &[String],
    e: crate::lock::LockError,
) -> Error {
    let done = match released.is_empty() {
        true => "nothing released".to_string(),
        false => format!("released {}", released.join(", ")),
    };
    let note = format!("{asked}: {done}, then etcd failed: {e}; set the annotation again to retry");
    event(ctx, dl, EventType::Warning, "ReleaseFailed", note).await;
    e.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_names_a_holder_id_or_every_holder() {
        assert!(check("web-1").is_ok());
        assert!(check(ALL).is_ok());
        let bad = check("web 1").unwrap_err();
        assert!(bad.contains("holderId") && bad.contains('*'), "{bad}");
        assert!(check("").is_err());
    }
}
