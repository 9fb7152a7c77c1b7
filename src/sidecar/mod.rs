//! The sidecar: a loopback HTTP API over the lock engine for the containers of one pod.

mod api;
mod args;
mod connection;
mod error;
mod events;
mod fence;
pub mod lost_reason;
mod observe;
mod peer;
mod reconnect;
mod request;
mod routes;
mod startup;
mod state;

pub use args::SidecarArgs;
pub use routes::router;
pub use state::AppState;

use std::net::SocketAddr;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

/// Runs the sidecar until SIGTERM or Ctrl-C, then ends every hold before exiting. It listens
/// first and reaches etcd after (see `startup.rs`).
pub async fn run(args: SidecarArgs) -> anyhow::Result<()> {
    crate::lock::check_dns_subdomain("namespace", &args.namespace)?;
    let listener = bind(args.listen).await?;
    let health = match args.health_listen {
        Some(addr) => Some(bind_any_family(addr).await?),
        None => None,
    };
    info!(listen = %args.listen, namespace = args.namespace, standalone = args.standalone, "sidecar serving");
    let started = startup::Started::default();
    tokio::spawn(started.clone().connect(args));
    serve(started, listener, health).await
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
    started: startup::Started,
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
    // Each request knows its connection (`peer.rs`): a watch ends as soon as its client leaves.
    let api = started.api().into_make_service_with_connect_info::<peer::Peer>();
    let serve = axum::serve(listener, api).with_graceful_shutdown(async move {
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
