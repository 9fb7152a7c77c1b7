//! What to warn about a pod on: the pod, the workload that controls it, and for a
//! ReplicaSet its Deployment too, where a user looks first.

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::Api;
use kube::{Resource, ResourceExt};
use tracing::warn;

/// The pod, its controller (a ReplicaSet, StatefulSet, Job, ...) and that ReplicaSet's
/// Deployment. A ReplicaSet that cannot be read only leaves its Deployment out.
pub async fn chain(client: &kube::Client, pod: &Pod) -> Vec<ObjectReference> {
    let namespace = pod.namespace().unwrap_or_default();
    let mut chain = vec![pod.object_ref(&())];
    let Some(owner) = controller(&pod.metadata) else {
        return chain;
    };
    chain.push(reference(&namespace, owner));
    if (owner.api_version.as_str(), owner.kind.as_str()) == ("apps/v1", "ReplicaSet") {
        let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &namespace);
        match sets.get_metadata_opt(&owner.name).await {
            Ok(Some(set)) => chain.extend(controller(&set.metadata).map(|d| reference(&namespace, d))),
            Ok(None) => {}
            Err(e) => {
                warn!(replicaset = owner.name, namespace, error = %e, "cannot read the ReplicaSet to find its Deployment")
            }
        }
    }
    chain
}

/// The owner that controls an object.
fn controller(meta: &ObjectMeta) -> Option<&OwnerReference> {
    (meta.owner_references.iter().flatten()).find(|o| o.controller == Some(true))
}

/// A reference to `owner`, of `namespace` (owners of a namespaced object are in its namespace).
fn reference(namespace: &str, owner: &OwnerReference) -> ObjectReference {
    ObjectReference {
        api_version: Some(owner.api_version.clone()),
        kind: Some(owner.kind.clone()),
        name: Some(owner.name.clone()),
        namespace: Some(namespace.to_string()),
        uid: Some(owner.uid.clone()),
        ..Default::default()
    }
}
