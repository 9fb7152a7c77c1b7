//! The `status` of a `DistributedLock`: what etcd says about the lock, mirrored by the
//! operator, and the merge patch that writes it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::lock::{HolderInfo, Mode};

/// What etcd says about the lock, mirrored by the operator.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DistributedLockStatus {
    /// `Pending` until the lock is live in etcd, then `Free` or `Held`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Holders in acquisition order: the first 100 of them (`holderCount` counts them all).
    #[serde(default)]
    pub holders: Vec<Holder>,
    /// How many hold the lock.
    #[serde(default)]
    pub holder_count: u32,
    /// Contenders waiting behind the holders.
    #[serde(default)]
    pub waiters: u32,
    /// The largest fencing token issued for this lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<i64>,
    /// The highest token epoch the operator published the lock under (recorded before it
    /// publishes one): tokens are `epoch * 2^40 + etcd revision`, and a lock published again in
    /// an etcd that lost it (wiped, rebuilt, restored from an older snapshot) gets a higher
    /// epoch, so that its tokens keep rising.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_epoch: Option<u32>,
    /// The generation the status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: the lock's settings are published in etcd; with `spec.holderService`, also
    /// `HolderService`: the Service routes to the holders.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The Service that follows the holders, when `spec.holderService` asks for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_service: Option<HolderServiceStatus>,
}

/// The fields of [`DistributedLockStatus`] it leaves out while `None`.
const STATUS_OPTIONAL: [&str; 5] = [
    "phase",
    "fencingToken",
    "fencingEpoch",
    "observedGeneration",
    "holderService",
];

impl DistributedLockStatus {
    /// The body of a JSON merge patch (RFC 7386) of the `status` subresource that leaves it
    /// exactly this: each list replaces the one there, and each field this status leaves out
    /// is removed (`null`), as a server-side apply of the whole status does.
    pub fn merge_patch(&self) -> serde_json::Value {
        let mut status = serde_json::to_value(self).expect("a status serializes");
        let fields = status.as_object_mut().expect("a status is an object");
        for field in STATUS_OPTIONAL {
            fields.entry(field).or_insert(serde_json::Value::Null);
        }
        serde_json::json!({ "status": status })
    }
}

/// What the holder Service routes to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HolderServiceStatus {
    /// The Service's name.
    pub name: String,
    /// The pod IPs of the holders, the endpoints of its EndpointSlice.
    #[serde(default)]
    pub addresses: Vec<String>,
}

/// One holder of the lock.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    /// The holder id the app chose.
    pub holder_id: String,
    /// The holder's pod.
    pub pod: String,
    /// The holder's pod's cluster, when several clusters share the lock (absent: the only one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The hold's fencing token.
    pub fencing_token: i64,
    /// When the hold began (RFC 3339).
    pub acquired_at: String,
    /// `exclusive`, or `shared` with the other shared holders (a reader-writer lock).
    #[serde(default = "exclusive")]
    pub mode: String,
    /// The time an administrator asked the holder to yield by (`podlock.io/yield`), if one
    /// did: the operator ends the hold then unless it is released first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yield_deadline: Option<String>,
    /// How many of the lock's slots the hold takes (1 but for a weighted hold of a semaphore).
    #[serde(default = "one")]
    pub permits: u32,
}

fn one() -> u32 {
    1
}

fn exclusive() -> String {
    Mode::Exclusive.as_str().into()
}

impl From<HolderInfo> for Holder {
    fn from(h: HolderInfo) -> Self {
        Holder {
            holder_id: h.holder_id,
            pod: h.pod,
            cluster: h.cluster,
            fencing_token: h.fencing_token,
            acquired_at: h.acquired_at,
            mode: h.mode.as_str().into(),
            yield_deadline: h.yield_deadline,
            permits: h.permits,
        }
    }
}

/// A status condition (the subset of `metav1.Condition` podlock sets).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's type, `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// A CamelCase reason.
    pub reason: String,
    /// A message for people.
    pub message: String,
    /// When the status last changed (RFC 3339).
    pub last_transition_time: String,
    /// The generation the condition reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A merge patch names every field of the status, so that one left out is removed: a
    /// field added to the status without a place in `STATUS_OPTIONAL` fails here.
    #[test]
    fn a_status_merge_patch_names_every_field() {
        let full = DistributedLockStatus {
            phase: Some("Held".into()),
            fencing_token: Some(7),
            fencing_epoch: Some(1),
            observed_generation: Some(2),
            holder_service: Some(HolderServiceStatus::default()),
            ..Default::default()
        };
        let keys = |v: serde_json::Value| {
            let mut k: Vec<String> = v["status"].as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let empty = DistributedLockStatus::default().merge_patch();
        assert_eq!(keys(empty.clone()), keys(full.merge_patch()));
        assert!(empty["status"]["phase"].is_null());
        assert_eq!(full.merge_patch()["status"]["fencingEpoch"], 1);
    }
}
