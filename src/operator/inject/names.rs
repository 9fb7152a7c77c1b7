//! The names injection reads and writes: the annotations and labels a user or a workload sets,
//! those the webhook adds, and the sidecar container's.

/// The annotation that asks for injection.
pub const INJECT: &str = "podlock.io/inject";
/// The namespace label (with [`NAMESPACE_ENABLED`]) that asks for the sidecar in every pod of
/// the namespace, as Istio's `istio-injection=enabled` does; a pod opts out with [`INJECT`]
/// `"false"`.
pub const NAMESPACE_LABEL: &str = "podlock.io/inject";
/// The value of [`NAMESPACE_LABEL`] that turns namespace-wide injection on.
pub const NAMESPACE_ENABLED: &str = "enabled";
/// The annotation that marks a pod template's [`INJECT`] as copied there from its workload.
pub const STAMP: &str = "podlock.io/inject-stamp";
/// The annotation that sets the sidecar's API port (default `--sidecar-port`, 4040).
pub const PORT: &str = "podlock.io/port";
/// The annotation that sets a default heartbeat window for the pod's holds.
pub const HEARTBEAT: &str = "podlock.io/heartbeat-timeout";
/// The variable that tells each app container its own name, to pass as `container`.
pub const CONTAINER_ENV: &str = "PODLOCK_CONTAINER";
/// The label that marks the operator's own pods, which are never injected.
pub const OPERATOR_LABEL: (&str, &str) = ("app.kubernetes.io/component", "podlock-operator");
/// The label that marks pods with a podlock sidecar (the operator's pod watch selects on it).
pub const SIDECAR_LABEL: &str = "podlock.io/sidecar";
/// The label that names the podlock installation (the chart's release) whose sidecar a pod has.
pub const INSTANCE_LABEL: &str = "podlock.io/instance";
/// The sidecar container's name.
pub const SIDECAR_CONTAINER: &str = "podlock";
/// The kinds whose pod template a workload annotation is copied into.
pub const WORKLOADS: [&str; 4] = ["Deployment", "StatefulSet", "DaemonSet", "Job"];
