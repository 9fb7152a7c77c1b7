//! An owner for what the operator creates outside its Helm chart (the webhook configuration,
//! the webhook's Secret, the leader Lease), so that `helm uninstall` leaves none of it behind:
//! Kubernetes' garbage collector deletes an object once its owners are gone. The owner is the
//! operator's ClusterRole, which the chart creates and deletes: being cluster-scoped, it may own
//! the cluster-scoped webhook configuration as well as the namespaced Secret and Lease.
//!
//! An object created again after its owner is gone (a terminating replica re-applying the
//! webhook configuration) names an owner that no longer exists, and the collector deletes it.
//!
//! Every object the operator owns is written the one way [`server_side_apply`] says.

use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMetaExt;
use serde::de::DeserializeOwned;

/// How the operator writes the objects it owns: server-side apply as `podlock-operator`,
/// taking over any field another manager set (the operator is the one to say what they hold).
pub fn server_side_apply() -> PatchParams {
    PatchParams::apply("podlock-operator").force()
}

/// The owner reference to ClusterRole `name`, if one is named.
pub async fn cluster_role(
    client: &kube::Client,
    name: Option<&str>,
) -> anyhow::Result<Option<OwnerReference>> {
    let Some(name) = name else { return Ok(None) };
    let role = Api::<ClusterRole>::all(client.clone())
        .get(name)
        .await
        .map_err(|e| anyhow::anyhow!("cannot read ClusterRole {name} (--owner-cluster-role): {e}"))?;
    Ok(Some(OwnerReference {
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: "ClusterRole".into(),
        name: name.into(),
        uid: role.metadata.uid.unwrap_or_default(),
        ..Default::default()
    }))
}

/// Gives object `name` of `api`, which has no owner yet (made by an operator that had none,
/// or by an earlier release), `owner`. The operator made the object, so it writes the owner
/// by server-side apply like its other objects; the apply names the owner reference alone,
/// and leaves the rest of the object as it is.
pub async fn adopt<K>(api: &Api<K>, name: &str, owner: &OwnerReference) -> kube::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let metadata = ObjectMeta {
        owner_references: Some(vec![owner.clone()]),
        ..ObjectMeta::default()
    };
    let patch = Patch::Apply(metadata.into_request_partial::<K>());
    api.patch_metadata(name, &server_side_apply(), &patch)
        .await
        .map(|_| ())
}
