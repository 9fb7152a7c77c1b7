//! What the injected sidecar looks like: the operator's flags for it, gathered once.

use k8s_openapi::api::core::v1::ResourceRequirements;

use super::flags::PodSettings;

/// What the injected sidecar looks like.
#[derive(Debug, Clone)]
pub struct SidecarTemplate {
    /// The podlock image.
    pub image: String,
    /// The installation's name, the injected pods' [`INSTANCE_LABEL`](super::names::INSTANCE_LABEL).
    pub instance: String,
    /// etcd endpoints for the sidecar, comma-separated.
    pub etcd_endpoints: String,
    /// A Secret with the namespace's etcd credentials (`username`, `password`), if any.
    pub credentials_secret: Option<String>,
    /// Whether that Secret also has etcd's CA (`ca.crt`, with etcd TLS) for the sidecar.
    pub etcd_ca: bool,
    /// The cluster's name for the sidecar's holds (`PODLOCK_CLUSTER`; empty: none).
    pub cluster: String,
    /// The sidecar's requests and limits (`None`: 10m/16Mi, limits 200m/64Mi).
    pub resources: Option<ResourceRequirements>,
    /// The sidecar's log filter (`PODLOCK_LOG`; `None`: the sidecar's default, `info`).
    pub log_level: Option<String>,
    /// Its default port, pull secrets and securityContext.
    pub pod: PodSettings,
}
