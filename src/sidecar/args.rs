//! The flags of `podlock sidecar`.

use clap::Args;
use std::net::SocketAddr;

use crate::etcd_args::EtcdArgs;

/// Flags of `podlock sidecar`.
#[derive(Debug, Clone, Args)]
pub struct SidecarArgs {
    /// Address to serve the API on (loopback by default: only the pod's containers reach it).
    #[arg(long, env = "PODLOCK_LISTEN", default_value = "127.0.0.1:4040")]
    pub listen: SocketAddr,
    /// The pod's namespace (from the downward API); locks are looked up in it.
    #[arg(long, env = "PODLOCK_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// The pod's name (from the downward API); the default holder id. Default: the host name.
    #[arg(long, env = "PODLOCK_POD_NAME")]
    pub pod_name: Option<String>,
    /// The pod's uid (from the downward API), recorded with every hold.
    #[arg(long, env = "PODLOCK_POD_UID", default_value = "")]
    pub pod_uid: String,
    /// The pod's cluster, when several clusters share the lock etcd (injected from the
    /// operator's `--cluster-name`), recorded with every hold: only that cluster's operator
    /// judges the pod.
    #[arg(long, env = "PODLOCK_CLUSTER", default_value = "", value_parser = crate::lock::cluster_name)]
    pub cluster: String,
    /// Also serve /healthz, /readyz and /metrics (only those) here, e.g. 0.0.0.0:4041 for
    /// kubelet probes and Prometheus; the lock API stays on --listen.
    #[arg(long, env = "PODLOCK_HEALTH_LISTEN")]
    pub health_listen: Option<SocketAddr>,
    /// Heartbeat window for this pod's holds when the acquire does not set one (overrides the
    /// lock's default).
    #[arg(long, env = "PODLOCK_HEARTBEAT_TIMEOUT_SECONDS",
          value_parser = clap::value_parser!(u32).range(crate::lock::HEARTBEAT.range()))]
    pub heartbeat_timeout_seconds: Option<u32>,
    /// Serve locks that have no DistributedLock, with the default settings.
    #[arg(long, env = "PODLOCK_STANDALONE")]
    pub standalone: bool,
    #[command(flatten)]
    pub etcd: EtcdArgs,
}
