//! The sidecar: a loopback HTTP API over the lock engine for the containers of one pod.

mod api;
mod connection;
mod error;
mod events;
mod fence;
mod reconnect;
mod request;
mod start;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use clap::Args;
use std::net::SocketAddr;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use crate::etcd_args::EtcdArgs;
use crate::lock::{Engine, EventKind, PodRef};
use crate::metrics::SidecarMetrics;

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

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    engine: Engine,
    metrics: SidecarMetrics,
    namespace: String,
    default_holder: String,
    default_heartbeat: Option<u32>,
}

/// The health routes, served on --listen and on --health-listen.
fn health_router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(api::readyz))
        .route("/metrics", get(api::metrics))
}

/// The sidecar's routes on `state`.
pub fn router(state: AppState) -> Router {
    health_router()
        .route("/v1/locks", get(api::list))
        .route("/v1/locks/{name}", get(api::inspect))
        .route("/v1/locks/{name}/acquire", post(api::acquire))
        .route("/v1/locks/{name}/hold", post(connection::hold))
        .route("/v1/locks/{name}/release", post(api::release))
        .route("/v1/locks/{name}/heartbeat", post(api::heartbeat))
        .route("/v1/locks/{name}/events", get(events::events))
        .route("/v1/locks/{name}/fence", get(fence::fence))
        .fallback(api::not_found)
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(DefaultBodyLimit::max(1024 * 1024))
        .with_state(state)
}

/// Runs the sidecar until SIGTERM or Ctrl-C, then ends every hold before exiting. It listens
/// first and reaches etcd after (see [`start`]).
pub async fn run(args: SidecarArgs) -> anyhow::Result<()> {
    crate::lock::check_dns_subdomain("namespace", &args.namespace)?;
    let listener = bind(args.listen).await?;
    let health = match args.health_listen {
        Some(addr) => Some(bind_any_family(addr).await?),
        None => None,
    };
    info!(listen = %args.listen, namespace = args.namespace, standalone = args.standalone, "sidecar serving");
    let started = start::Started::default();
    tokio::spawn(started.clone().connect(args));
    serve(started, listener, health).await
}

/// Connects to etcd and builds the engine and the handlers' state; connects anew whenever etcd
/// refuses the engine's clients (see [`reconnect`]).
async fn start(args: &SidecarArgs) -> anyhow::Result<(Engine, AppState)> {
    let pod_name = args.pod_name.clone().unwrap_or_else(hostname);
    let (client, members) = args.etcd.connect_all().await?;
    let pod = PodRef {
        namespace: args.namespace.clone(),
        name: pod_name.clone(),
        uid: args.pod_uid.clone(),
        cluster: args.cluster.clone(),
    };
    let engine = Engine::new(client, members, pod, args.standalone);
    tokio::spawn(reconnect::run(engine.link().clone(), args.etcd.clone()));
    let metrics = SidecarMetrics::new();
    spawn_hold_metrics(&engine, &metrics);
    let state = AppState {
        engine: engine.clone(),
        metrics,
        namespace: args.namespace.clone(),
        default_holder: pod_name,
        default_heartbeat: args.heartbeat_timeout_seconds,
    };
    Ok((engine, state))
}

async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))
}

/// Binds `addr`; `[::]` (every address of both families, as injected) falls back to `0.0.0.0`
/// where the kernel has no IPv6 at all.
async fn bind_any_family(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    match bind(addr).await {
        Err(e) if addr.ip() == std::net::Ipv6Addr::UNSPECIFIED => {
            warn!(error = %e, "no IPv6 here; serving health and metrics on IPv4 only");
            bind(SocketAddr::from(([0, 0, 0, 0], addr.port()))).await
        }
        bound => bound,
    }
}

/// Serves the API (and the health routes on `health`) until a signal, or until a listener
/// fails: then every hold ends and the process exits non-zero, rather than linger with its
/// probes or its API gone.
async fn serve(
    started: start::Started,
    listener: tokio::net::TcpListener,
    health: Option<tokio::net::TcpListener>,
) -> anyhow::Result<()> {
    let health_app = started.health();
    let health = async move {
        match health {
            Some(listener) => axum::serve(listener, health_app).await,
            None => std::future::pending().await,
        }
    };
    let mut term = signal(SignalKind::terminate())?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let stopping = started.clone();
    let shutdown = || async move {
        if let Some(engine) = stopping.engine() {
            engine.shutdown().await;
        }
    };
    // On a signal the holds end first (their `lost` events still reach open streams, which
    // then end), and only then does the server stop.
    let ending = shutdown.clone();
    let serve = axum::serve(listener, started.api()).with_graceful_shutdown(async move {
        let _ = stop_rx.await;
        ending().await;
    });
    let mut serve = std::pin::pin!(serve.into_future());
    tokio::select! {
        served = &mut serve => {
            shutdown().await;
            anyhow::bail!("the API listener failed: {served:?}");
        }
        failed = health => {
            shutdown().await;
            anyhow::bail!("the health listener failed: {failed:?}");
        }
        _ = term.recv() => info!("SIGTERM: ending every hold"),
        _ = tokio::signal::ctrl_c() => info!("interrupted: ending every hold"),
    }
    let _ = stop_tx.send(());
    // Connections still open after the holds ended (an idle keep-alive client) do not hold up
    // the exit for long.
    if tokio::time::timeout(SHUTDOWN_GRACE, serve).await.is_err() {
        warn!("connections still open {SHUTDOWN_GRACE:?} after the holds ended; exiting");
    }
    Ok(())
}

/// How long the server may take to close its connections once every hold has ended.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Feeds the engine's hold events to the metrics: lost holds, and when holds begin and end.
fn spawn_hold_metrics(engine: &Engine, metrics: &SidecarMetrics) {
    let mut events = engine.subscribe(None);
    let metrics = metrics.clone();
    tokio::spawn(async move {
        while let Some(ev) = events.recv().await {
            match ev.kind {
                EventKind::Acquired => metrics.hold_began(&ev.lock.name, ev.fencing_token),
                EventKind::Released => metrics.hold_ended(&ev.lock.name, ev.fencing_token),
                EventKind::Lost => {
                    metrics.locks_lost.with_label_values(&[&ev.lock.name]).inc();
                    metrics.hold_ended(&ev.lock.name, ev.fencing_token);
                }
            }
        }
        warn!("the hold metrics fell behind the engine's events and stopped counting");
    });
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "podlock".into())
}
