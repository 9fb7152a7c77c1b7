//! Sidecar injection as pure functions: given an admitted object, the JSON patch the webhook
//! answers with, if any.
//!
//! The sidecar is added to Pods only, when they are created, so that every new pod gets the
//! current sidecar (a `helm upgrade` of podlock reaches the next pods) and workloads never
//! carry a frozen copy of it. A Pod annotated `podlock.io/inject: "true"` (from its own
//! metadata or its workload's pod template) gets a native sidecar (an init container with
//! `restartPolicy: Always`) named `podlock`, the labels `podlock.io/sidecar=true` (so the
//! operator's pod watch sees it) and `podlock.io/instance=<release>` (so the bundled etcd's
//! NetworkPolicy admits it, and not another release's pods), and `PODLOCK_ADDR` and
//! `PODLOCK_CONTAINER` in every app and init container (the init containers run after the
//! sidecar started, so they may take locks too).
//!
//! A Deployment, StatefulSet, DaemonSet or Job annotated in its own metadata (`kubectl
//! annotate deployment web podlock.io/inject=true`) gets only that annotation copied into its
//! pod template (marked as copied, [`STAMP`]), which rolls out pods that ask for the sidecar;
//! removing the workload's annotation removes the copy again. A Job's template cannot change
//! after creation: a Job is stamped when created only.
//!
//! A namespace labelled `podlock.io/inject=enabled` ([`NAMESPACE_LABEL`]) asks for the sidecar
//! in every pod created there: the webhook configuration sends its pods to the namespace's
//! webhook path, and each gets the sidecar unless it opts out with `podlock.io/inject: "false"`.
//!
//! Objects without the annotation (outside such a namespace), in `kube-system`, or of the
//! operator itself are never changed; injection is idempotent.
//!
//! The admitted object stays JSON, and only what is added (the sidecar, its volume, the
//! variables) is built from k8s-openapi's types: read into a typed `Pod` and written back, a
//! pod would lose the fields k8s-openapi does not know (a newer cluster's), and the patch, a
//! diff of the two, would remove them.

mod container;
pub mod flags;
mod mutation;
mod names;
mod stamp;
mod template;
#[cfg(test)]
mod tests;

use serde_json::Value;
// The tests (`use super::*`) build their objects with it.
#[cfg(test)]
use serde_json::json;

use container::{Options, give_containers_their_env, position, sidecar};
pub use mutation::Mutation;
use mutation::{annotation, ensure_object, escape};
pub use names::{
    CONTAINER_ENV, HEARTBEAT, INJECT, INSTANCE_LABEL, NAMESPACE_ENABLED, NAMESPACE_LABEL, OPERATOR_LABEL,
    PORT, SIDECAR_CONTAINER, SIDECAR_LABEL, STAMP, WORKLOADS,
};
pub use template::SidecarTemplate;

/// Why an object cannot be admitted: an annotation the sidecar cannot be set up from.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// [`PORT`] is not a port number.
    #[error("{PORT} must be a port number, got {0:?}", PORT = PORT)]
    InvalidPort(String),
    /// [`HEARTBEAT`] is not a whole number of seconds.
    #[error("{HEARTBEAT} must be whole seconds, got {0:?}", HEARTBEAT = HEARTBEAT)]
    InvalidHeartbeat(String),
}

/// What the webhook does with `object` (of `kind`, in `namespace`), being created when
/// `creating`, else updated. `namespace_injects`: the namespace is labelled
/// `podlock.io/inject=enabled` (the API server sent the object to that webhook's path), so a
/// pod gets the sidecar unless annotated `podlock.io/inject: "false"`.
pub fn mutate(
    tpl: &SidecarTemplate,
    kind: &str,
    creating: bool,
    namespace: &str,
    namespace_injects: bool,
    object: &Value,
) -> Result<Mutation, Error> {
    if namespace == "kube-system" || is_operator(object) {
        return Ok(Mutation::default());
    }
    match kind {
        // An existing pod is never changed: the API server would reject most changes, and a
        // pod created while the webhook was down must stay updatable.
        "Pod" if creating => inject(tpl, namespace_injects, object),
        kind if WORKLOADS.contains(&kind) => Ok(stamp::stamp(kind, creating, object)),
        _ => Ok(Mutation::default()),
    }
}

/// Whether a pod asks for the sidecar: annotated `"true"`, or in a namespace that injects and
/// not annotated `"false"`.
fn asks(pod: &Value, namespace_injects: bool) -> bool {
    match annotation(pod, "/metadata", INJECT) {
        Some("true") => true,
        Some("false") => false,
        _ => namespace_injects,
    }
}

/// The sidecar added to a new pod that asks for it.
fn inject(tpl: &SidecarTemplate, namespace_injects: bool, pod: &Value) -> Result<Mutation, Error> {
    if !asks(pod, namespace_injects) || has_sidecar(pod) {
        return Ok(Mutation::default());
    }
    if pod.pointer("/spec/hostNetwork") == Some(&Value::Bool(true)) {
        // On the node's network the sidecar's loopback port would be every such pod's.
        let warning = "podlock: hostNetwork pods get no sidecar (its loopback port would be node-wide)";
        return Ok(Mutation {
            patch: None,
            warning: Some(warning.into()),
        });
    }
    let options = options(pod, tpl.pod.port)?;
    let mut mutated = pod.clone();
    let labels = ensure_object(&mut mutated, "/metadata/labels");
    labels.insert(SIDECAR_LABEL.into(), "true".into());
    labels.insert(INSTANCE_LABEL.into(), tpl.instance.clone().into());
    let pod_spec = ensure_object(&mut mutated, "/spec");
    give_containers_their_env(pod_spec, options.port);
    container::add_pull_secrets(pod_spec, &tpl.pod.image_pull_secrets);
    if let Some(volume) = container::etcd_volume(tpl) {
        let volumes = pod_spec.entry("volumes").or_insert(Value::Array(vec![]));
        if let Some(volumes) = volumes.as_array_mut() {
            volumes.push(serde_json::to_value(volume).expect("a volume serializes"));
        }
    }
    let sidecar = serde_json::to_value(sidecar(tpl, &options)).expect("a container serializes");
    let init = pod_spec.entry("initContainers").or_insert(Value::Array(vec![]));
    if let Some(init) = init.as_array_mut() {
        init.insert(position(init), sidecar);
    }
    Ok(Mutation {
        patch: Some(json_patch::diff(pod, &mutated)),
        warning: None,
    })
}

/// Whether `pod` (in `namespace`) asked for the sidecar by its annotation and runs without it
/// where the webhook would have given it one: what the API server creates when it cannot reach
/// the webhook and `failurePolicy: Ignore` lets the pod through. The webhook's own rules, so
/// that the operator never warns about a pod the webhook leaves alone on purpose.
pub fn missed(namespace: &str, pod: &Value) -> bool {
    namespace != "kube-system"
        && !is_operator(pod)
        && asks(pod, false)
        && !has_sidecar(pod)
        && pod.pointer("/spec/hostNetwork") != Some(&Value::Bool(true))
}

/// Whether the operator's own label is on `object` or on its pod template.
fn is_operator(object: &Value) -> bool {
    ["/metadata", "/spec/template/metadata"].iter().any(|meta| {
        object
            .pointer(&format!("{meta}/labels/{}", escape(OPERATOR_LABEL.0)))
            .and_then(Value::as_str)
            == Some(OPERATOR_LABEL.1)
    })
}

/// Whether the pod already has a container named `podlock` (injected, or written by hand).
fn has_sidecar(pod: &Value) -> bool {
    ["initContainers", "containers"].iter().any(|list| {
        pod["spec"][list]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["name"] == SIDECAR_CONTAINER))
    })
}

/// The port and heartbeat annotations of a pod (`port`: the port where it sets none).
fn options(pod: &Value, port: u16) -> Result<Options, Error> {
    let port = match annotation(pod, "/metadata", PORT) {
        Some(p) => p.parse().map_err(|_| Error::InvalidPort(p.into()))?,
        None => port,
    };
    let heartbeat = match annotation(pod, "/metadata", HEARTBEAT) {
        Some(h) => Some(h.parse().map_err(|_| Error::InvalidHeartbeat(h.into()))?),
        None => None,
    };
    Ok(Options { port, heartbeat })
}
