//! The `DistributedLock` custom resource (`podlock.io/v1alpha1`), from which `podlock crd`
//! prints the CRD. Defaults and bounds live in the OpenAPI schema, so the API server rejects a
//! bad spec with a message naming the field.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::lock::{Bound, HEARTBEAT, MAX_HOLD, MAX_HOLDERS, Settings, TTL};
use schemars::{Schema, SchemaGenerator, json_schema};

mod status;

pub use status::{Condition, DistributedLockStatus, Holder, HolderServiceStatus};

/// A lock (or, with `maxHolders` > 1, a counting semaphore) that pods take through their
/// podlock sidecar.
// Each printcolumn(...) names the same keys; clippy mistakes that for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "podlock.io",
    version = "v1alpha1",
    kind = "DistributedLock",
    plural = "distributedlocks",
    singular = "distributedlock",
    shortname = "dlock",
    namespaced,
    status = "DistributedLockStatus",
    doc = "A fair, fenced lock or semaphore that pods take through their podlock sidecar",
    printcolumn(
        name = "HOLDER",
        type_ = "string",
        json_path = ".status.holders[0].pod",
        description = "First holder's pod"
    ),
    printcolumn(
        name = "MODE",
        type_ = "string",
        json_path = ".status.holders[0].mode",
        description = "How the first holder holds: exclusive, or shared with the other shared holders"
    ),
    printcolumn(
        name = "WAITERS",
        type_ = "integer",
        json_path = ".status.waiters",
        description = "Contenders waiting"
    ),
    printcolumn(
        name = "TOKEN",
        type_ = "integer",
        json_path = ".status.fencingToken",
        description = "Largest fencing token issued"
    ),
    printcolumn(
        name = "TTL",
        type_ = "integer",
        json_path = ".spec.ttlSeconds",
        description = "Lease TTL in seconds"
    ),
    printcolumn(name = "AGE", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct DistributedLockSpec {
    /// etcd lease TTL behind every holder and waiter, in seconds.
    #[serde(default = "default_ttl")]
    #[schemars(schema_with = "ttl_schema")]
    pub ttl_seconds: u32,
    /// 1: a mutex; N: a counting semaphore with N slots.
    #[serde(default = "default_max_holders")]
    #[schemars(schema_with = "max_holders_schema")]
    pub max_holders: u32,
    /// 0: a hold lives as long as the holder's pod; N: the app must heartbeat within N seconds
    /// or its hold is released.
    #[serde(default)]
    #[schemars(schema_with = "heartbeat_schema")]
    pub heartbeat_timeout_seconds: u32,
    /// 0: a hold lasts until it is released or lost otherwise; N: no hold lasts longer than N
    /// seconds (an acquire may ask for less with `maxHoldSeconds`, never more): at its deadline
    /// its sidecar ends it (`lost`, reason `deadline`), or the operator does if the sidecar
    /// cannot.
    #[serde(default)]
    #[schemars(schema_with = "max_hold_schema")]
    pub max_hold_seconds: u32,
    /// How long a holder asked to yield (`podlock.io/yield`) has to release before the
    /// operator ends its hold, when the request names no `podlock.io/yield-grace`.
    #[serde(default = "default_yield_grace")]
    #[schemars(schema_with = "yield_grace_schema")]
    pub yield_grace_seconds: u32,
    /// A Service the operator keeps pointing at the pods that hold the lock, so that an
    /// active/passive system routes to its current leader with a plain Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_service: Option<HolderService>,
}

/// `spec.holderService`: a Service without a selector whose one EndpointSlice the operator
/// keeps equal to the holders' pods.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HolderService {
    /// The Service's name (default: the lock's name). The operator will not take over a
    /// Service of that name that it did not make.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63), regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: Option<String>,
    /// The Service's ports; each needs a name when there is more than one.
    #[schemars(length(min = 1, max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.size() == 1 || self.all(p, has(p.name))",
         "message": "every port needs a name when there is more than one"},
        {"rule": "self.all(p, self.exists_one(q, q.port == p.port && q.protocol == p.protocol))",
         "message": "two ports have the same port and protocol"}
    ]))]
    pub ports: Vec<HolderServicePort>,
}

/// One port of the holder Service.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HolderServicePort {
    /// The port's name (a DNS label), required when the Service has more than one port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: Option<String>,
    /// The port the Service listens on.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// The holders' port that traffic goes to (default: `port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub target_port: Option<u16>,
    /// `TCP` (default), `UDP` or `SCTP`.
    #[serde(default)]
    pub protocol: Protocol,
}

/// A Service port's protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[allow(clippy::upper_case_acronyms)] // Kubernetes spells them so
pub enum Protocol {
    /// TCP.
    #[default]
    TCP,
    /// UDP.
    UDP,
    /// SCTP.
    SCTP,
}

impl Protocol {
    /// The protocol as Kubernetes spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::TCP => "TCP",
            Protocol::UDP => "UDP",
            Protocol::SCTP => "SCTP",
        }
    }
}

/// The schema of a bounded setting, from its one definition in `lock::keys`.
fn bounded(b: &Bound) -> Schema {
    json_schema!({
        "type": "integer",
        "format": "uint32",
        "minimum": b.min,
        "maximum": b.max,
        "default": b.default,
    })
}

fn ttl_schema(_: &mut SchemaGenerator) -> Schema {
    bounded(&TTL)
}

fn max_holders_schema(_: &mut SchemaGenerator) -> Schema {
    bounded(&MAX_HOLDERS)
}

fn heartbeat_schema(_: &mut SchemaGenerator) -> Schema {
    bounded(&HEARTBEAT)
}

fn max_hold_schema(_: &mut SchemaGenerator) -> Schema {
    bounded(&MAX_HOLD)
}

/// `yieldGraceSeconds`: at least a second, at most a day.
pub const YIELD_GRACE: Bound = Bound {
    field: "yieldGraceSeconds",
    min: 1,
    max: 86_400,
    default: 30,
};

fn yield_grace_schema(_: &mut SchemaGenerator) -> Schema {
    bounded(&YIELD_GRACE)
}

fn default_yield_grace() -> u32 {
    YIELD_GRACE.default
}

fn default_ttl() -> u32 {
    Settings::default().ttl_seconds
}

fn default_max_holders() -> u32 {
    Settings::default().max_holders
}

impl DistributedLockSpec {
    /// The settings the operator publishes to etcd (under the token epoch it chooses; 0 here).
    pub fn settings(&self) -> Settings {
        Settings {
            ttl_seconds: self.ttl_seconds,
            max_holders: self.max_holders,
            heartbeat_timeout_seconds: self.heartbeat_timeout_seconds,
            max_hold_seconds: self.max_hold_seconds,
            epoch: 0,
        }
    }
}

/// The CRD as YAML, exactly what `podlock crd` prints and `crds/` holds.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    serde_yaml::to_string(&DistributedLock::crd()).expect("CRD serializes")
}

/// Removes the JSON values at the paths of `taken` from DistributedLock `name` if each still
/// is its value, in one JSON patch (a `test`, then a `remove`, for each): a change made since
/// they were read is never undone. The API server answers 404 when the lock is gone, 422 when
/// a test fails.
pub async fn remove_if_still(
    api: &kube::Api<DistributedLock>,
    name: &str,
    taken: &[(String, &str)],
) -> Result<(), kube::Error> {
    let ops: Vec<serde_json::Value> = (taken.iter())
        .flat_map(|(path, value)| {
            [
                serde_json::json!({"op": "test", "path": path, "value": value}),
                serde_json::json!({"op": "remove", "path": path}),
            ]
        })
        .collect();
    let patch: json_patch::Patch = serde_json::from_value(ops.into()).expect("a JSON patch");
    let params = kube::api::PatchParams::default();
    api.patch(name, &params, &kube::api::Patch::Json::<()>(patch))
        .await
        .map(drop)
}
