//! A workload's own podlock annotations, copied into its pod template so that its pods ask
//! for the sidecar (and a change rolls them out), and removed again with the workload's.

use serde_json::Value;

use super::mutation::{Mutation, annotation, ensure_object};
use super::names::{HEARTBEAT, INJECT, PORT, STAMP};

/// The annotations that travel from a workload's metadata to its pod template.
const COPIED: [&str; 3] = [INJECT, PORT, HEARTBEAT];

/// Where a workload keeps its pod template's metadata.
const TEMPLATE: &str = "/spec/template/metadata";

/// The patch that brings the template's copies in line with the workload's annotations: while
/// the workload asks for injection, each of its podlock annotations is copied (unless the
/// template has its own), and [`STAMP`] names the copies; once it no longer asks, the copies
/// go. A Job's template is immutable after creation, so a Job is stamped when created only.
pub(super) fn stamp(kind: &str, creating: bool, object: &Value) -> Mutation {
    if kind == "Job" && !creating {
        return Mutation::default();
    }
    let copied: Vec<&str> = annotation(object, TEMPLATE, STAMP)
        .map(|s| s.split(',').filter(|k| COPIED.contains(k)).collect())
        .unwrap_or_default();
    let asked = annotation(object, "/metadata", INJECT) == Some("true");
    if !asked && copied.is_empty() {
        return Mutation::default();
    }
    let mut mutated = object.clone();
    let annotations = ensure_object(&mut mutated, &format!("{TEMPLATE}/annotations"));
    let mut copies = vec![];
    for key in COPIED {
        let ours = copied.contains(&key);
        match annotation(object, "/metadata", key).filter(|_| asked) {
            Some(value) if ours || !annotations.contains_key(key) => {
                annotations.insert(key.into(), value.into());
                copies.push(key);
            }
            None if ours => {
                annotations.remove(key);
            }
            _ => {}
        }
    }
    match copies.is_empty() {
        true => annotations.remove(STAMP),
        false => annotations.insert(STAMP.into(), copies.join(",").into()),
    };
    let patch = json_patch::diff(object, &mutated);
    Mutation {
        patch: (!patch.0.is_empty()).then_some(patch),
        warning: None,
    }
}
