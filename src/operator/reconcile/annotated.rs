//! What an administrator's request by annotation on a DistributedLock shares, whatever it
//! asks (a force release, `release`; a request to yield, `yielding`): the request is taken
//! once (its annotations removed by a JSON patch that tests their values, so a value set
//! again meanwhile is never lost), it names a holder id or every holder, only this cluster's
//! pods' holds are acted on, and it ends in one Event naming what was done and by whom.

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;
use tracing::info;

use crate::crd::{DistributedLock, remove_if_still};
use crate::lock::{QueueEntry, check_holder_id};
use crate::operator::context::{Context, event, lock_id};
use crate::operator::reconcile_error::Error;

/// The annotation's value that names every holder.
pub const ALL: &str = "*";

/// The Events' reasons of one kind of request, and what it does, for their notes.
pub struct Kind {
    /// What was done to a hold, for the note ("released").
    pub done: &'static str,
    /// What to do in a holder's own cluster, for the note ("release them there").
    pub there: &'static str,
    /// The Event's reason when it did something ("Released").
    pub done_reason: &'static str,
    /// The Warning's reason when every named hold is another cluster's.
    pub other_cluster: &'static str,
    /// The Warning's reason when nothing named holds.
    pub not_held: &'static str,
    /// The Warning's reason when etcd failed.
    pub failed: &'static str,
}

/// What the controller hashes to see a request's annotations change (see `predicates`).
pub fn hash_of(dl: &DistributedLock, annotations: &[&str]) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let all = dl.annotations();
    let values: Vec<Option<&String>> = annotations.iter().map(|a| all.get(*a)).collect();
    values[0]?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    values.hash(&mut h);
    Some(h.finish())
}

/// Removes the annotations `(name, value)` if each still has its value; returns whether it did.
pub async fn take(
    dl: &DistributedLock,
    api: &Api<DistributedLock>,
    taken: &[(&str, &str)],
) -> Result<bool, Error> {
    let paths: Vec<(String, &str)> = (taken.iter())
        .map(|(name, value)| {
            let escaped = name.replace('~', "~0").replace('/', "~1");
            (format!("/metadata/annotations/{escaped}"), *value)
        })
        .collect();
    match remove_if_still(api, &dl.name_any(), &paths).await {
        Ok(_) => Ok(true),
        // A test failed (another value, or none) or the object is gone.
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409 | 422) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Whether `value` names a holder id (or every holder); the problem otherwise.
pub fn check(value: &str) -> Result<(), String> {
    if value == ALL {
        return Ok(());
    }
    check_holder_id(value).map_err(|e| format!("{e} (or {ALL} for every holder)"))
}

/// The holds `value` names, split into this cluster's and the others'.
pub fn named<'a>(held: &'a [QueueEntry], value: &str, cluster: &str) -> (Vec<&'a QueueEntry>, Vec<String>) {
    let (named, elsewhere): (Vec<&QueueEntry>, Vec<&QueueEntry>) = (held.iter())
        .filter(|e| value == ALL || holder(e) == value)
        .partition(|e| cluster_of(e).is_none_or(|c| c == cluster));
    (named, elsewhere.into_iter().map(describe).collect())
}

/// The cluster an entry's pod names (`None`: not an entry, which any operator may end).
fn cluster_of(e: &QueueEntry) -> Option<&str> {
    e.entry.as_ref().map(|e| e.pod.cluster.as_str())
}

/// The holder id of an entry, as the lock's status shows it.
fn holder(e: &QueueEntry) -> &str {
    e.entry.as_ref().map_or("", |e| e.holder_id.as_str())
}

/// An entry for an Event: holder id, pod (and its cluster, if named) and token.
pub fn describe(e: &QueueEntry) -> String {
    let pod = e.entry.as_ref().map_or("?", |e| e.pod.name.as_str());
    let cluster = match cluster_of(e) {
        Some(c) if !c.is_empty() => format!(" of cluster {c}"),
        _ => String::new(),
    };
    format!("{} (pod {pod}{cluster}, token {})", holder(e), e.revision)
}

/// "ANNOTATION=VALUE (set by MANAGER at TIME)": the request, and the field manager that last
/// wrote its annotation, from the object's managed fields. (Who that was, the user, is in the
/// API server's audit log.)
pub fn asked(dl: &DistributedLock, annotation: &str, value: &str) -> String {
    let fields = dl.metadata.managed_fields.iter().flatten();
    let mut setter = fields.filter(|f| {
        let owned = f.fields_v1.as_ref().map(|v| &v.0["f:metadata"]["f:annotations"]);
        owned.is_some_and(|a| a.get(format!("f:{annotation}")).is_some())
    });
    let by = match setter.next_back() {
        Some(f) => {
            let at = (f.time.as_ref())
                .map(|t| format!(" at {}", t.0))
                .unwrap_or_default();
            let manager = f.manager.as_deref().unwrap_or("an unnamed manager");
            format!(" (set by {manager}{at})")
        }
        None => String::new(),
    };
    format!("{annotation}={value}{by}")
}

/// Records what a request did to `done` (holds described), or a Warning that it did nothing;
/// either names the holds left to the other clusters they belong to (`elsewhere`).
pub async fn report(
    ctx: &Context,
    dl: &DistributedLock,
    (kind, asked): (&Kind, &str),
    held: &[QueueEntry],
    done: Vec<String>,
    elsewhere: Vec<String>,
) {
    let left = match elsewhere.is_empty() {
        true => String::new(),
        false => format!(
            "; left to their own clusters' operators ({}): {}",
            kind.there,
            elsewhere.join(", ")
        ),
    };
    if !done.is_empty() {
        info!(lock = %lock_id(dl), ?done, ?elsewhere, "{} at an administrator's request", kind.done);
        let note = format!("{asked}: {} {}{left}", kind.done, done.join(", "));
        return event(ctx, dl, EventType::Normal, kind.done_reason, note).await;
    }
    if !elsewhere.is_empty() {
        let note = format!("{asked}: nothing {}{left}", kind.done);
        return event(ctx, dl, EventType::Warning, kind.other_cluster, note).await;
    }
    let holders: Vec<String> = held.iter().map(describe).collect();
    let now = match holders.is_empty() {
        true => "nobody holds the lock".to_string(),
        false => format!("the holders are {}", holders.join(", ")),
    };
    let note = format!("{asked}: nothing {}: {now}", kind.done);
    event(ctx, dl, EventType::Warning, kind.not_held, note).await;
}

/// Records that etcd failed a request (after `done`), and returns the error.
pub async fn failed(
    ctx: &Context,
    dl: &DistributedLock,
    (kind, asked): (&Kind, &str),
    done: &[String],
    e: crate::lock::LockError,
) -> Error {
    let so_far = match done.is_empty() {
        true => format!("nothing {}", kind.done),
        false => format!("{} {}", kind.done, done.join(", ")),
    };
    let note = format!("{asked}: {so_far}, then etcd failed: {e}; set the annotation again to retry");
    event(ctx, dl, EventType::Warning, kind.failed, note).await;
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
