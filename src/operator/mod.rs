//! The operator: reconciles `DistributedLock` objects with etcd and serves health and metrics.

mod admission;
mod backoff;
pub mod clocks;
mod context;
mod controller;
mod etcd_auth;
mod etcd_health;
mod etcd_version;
mod events;
pub mod inject;
pub mod isolation;
mod leader;
pub mod liveness;
mod owner;
mod readiness;
mod reconcile;
mod reconcile_error;
mod sidecar_missing;
mod status;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use clap::Args;
use kube::runtime::events::{Recorder, Reporter};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tracing::info;

use crate::etcd_args::EtcdArgs;
use crate::lock::Store;
use crate::metrics::OperatorMetrics;
use context::Context;
use controller::lead;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
pub use reconcile::FINALIZER;
pub use reconcile::{annotated, deadline, release};

/// Flags of `podlock operator`.
#[derive(Debug, Clone, Args)]
pub struct OperatorArgs {
    /// Address for /healthz, /readyz and /metrics.
    #[arg(long, env = "PODLOCK_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Only reconcile DistributedLocks of this namespace (default: every namespace).
    #[arg(long, env = "PODLOCK_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// The operator's own namespace (default: the service account's, else `default`).
    #[arg(long, env = "PODLOCK_OPERATOR_NAMESPACE")]
    pub operator_namespace: Option<String>,
    /// This replica's Pod, in `--operator-namespace` (the chart sets it from the downward API;
    /// default: `HOSTNAME`): where the Warning Event of an etcd below podlock's minimum goes.
    #[arg(long, env = "PODLOCK_POD_NAME")]
    pub pod_name: Option<String>,
    /// A ClusterRole that owns what the operator creates (the webhook configuration and its
    /// Secret, the leader Lease, each namespace's etcd credentials Secret), so that deleting
    /// it, as `helm uninstall` does, deletes them.
    #[arg(long, env = "PODLOCK_OWNER_CLUSTER_ROLE")]
    pub owner_cluster_role: Option<String>,
    /// On SIGTERM, how long to go on serving the webhook while unready, so that requests the
    /// API server already routed here are answered (endpoints move a moment after readiness).
    #[arg(long, env = "PODLOCK_SHUTDOWN_DRAIN_SECONDS", default_value_t = 5)]
    pub shutdown_drain_seconds: u64,
    /// With etcd auth: how often the leader makes each namespace's credentials Secret again if
    /// it was deleted (one create per namespace; the operator may not read Secrets).
    #[arg(long, env = "PODLOCK_CREDENTIALS_CHECK_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub credentials_check_seconds: u64,
    /// Turn etcd auth on if it is off, adding user `root` with `--etcd-password` (which
    /// `--etcd-user` must name): for an etcd podlock runs itself, like the chart's bundled one.
    #[arg(long, env = "PODLOCK_ETCD_ENABLE_AUTH")]
    pub etcd_enable_auth: bool,
    /// This cluster's name, when several clusters share the lock etcd (docs/operator.md):
    /// recorded with every hold of its pods; the operator ends only its own cluster's holds.
    #[arg(long, env = "PODLOCK_CLUSTER_NAME", default_value = "", value_parser = crate::lock::cluster_name)]
    pub cluster_name: String,
    #[command(flatten)]
    pub leader: leader::LeaderArgs,
    #[command(flatten)]
    pub webhook: admission::args::WebhookArgs,
    #[command(flatten)]
    pub etcd: EtcdArgs,
}

/// Every `reason` of `podlock_forced_releases_total`, each series shown from 0: a pod judged
/// gone, a lock deleted, an administrator's release, a deadline, a request to yield.
fn forced_reasons() -> Vec<&'static str> {
    let judged = liveness::Reason::ALL.map(liveness::Reason::label);
    let ended = [
        reconcile::LOCK_DELETED,
        release::REASON,
        reconcile::deadline::REASON,
        reconcile::yielding::REASON,
    ];
    [&judged[..], &ended].concat()
}

/// Runs the operator until SIGTERM or Ctrl-C, then drains (see `readiness.rs`).
pub async fn run(args: OperatorArgs) -> anyhow::Result<()> {
    args.leader.timing()?; // refuse unsafe leader-election margins before doing anything
    let client = kube::Client::try_default()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the Kubernetes API (KUBECONFIG or in-cluster): {e}"))?;
    let store = match args.etcd_enable_auth {
        true => etcd_auth::enable(&args.etcd).await?,
        false => Store::new(args.etcd.connect().await?),
    };
    let metrics = OperatorMetrics::new();
    metrics.start_at_zero(&reconcile_error::Error::LABELS, &forced_reasons());
    let owner = owner::cluster_role(&client, args.owner_cluster_role.as_deref()).await?;
    let ctx = context(&client, &store, &metrics, &args, owner.clone())?;
    let ready = Arc::new(readiness::Readiness::default());
    let probed = (metrics.etcd_reachable.clone(), ready.clone());
    tokio::spawn(etcd_health::watch(store.clone(), probed));
    let health = health_server(&args, store, metrics.clone(), ready.clone()).await?;
    let own_ns = (args.operator_namespace.clone()).unwrap_or_else(|| client.default_namespace().into());
    let checked = etcd_version::run(ctx.clone(), own_ns.clone(), args.pod_name.clone());
    tokio::spawn(checked);
    rustls::crypto::ring::default_provider().install_default().ok();
    let webhook = webhook(&client, &args, &own_ns, owner.clone(), &ctx, ready.clone()).await?;
    let leader_gauge = metrics.leader.clone();
    let check = Duration::from_secs(args.credentials_check_seconds);
    let lead = || lead(ctx.clone(), args.watch_namespace.clone(), check);
    let lease_ns = args.leader.leader_election_namespace.clone().unwrap_or(own_ns);
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(drain_on_signal(ready, stop.clone()));
    let leading = leader::run_when_leader(
        client,
        &args.leader,
        &lease_ns,
        owner.as_ref(),
        |l| leader_gauge.set(l.into()),
        lead,
        stop.cancelled(),
    );
    let (mut health, mut webhook) = (std::pin::pin!(health), std::pin::pin!(webhook));
    // The servers live as long as the operator: one that fails ends the process, rather than
    // leave a replica Ready whose webhook no longer injects.
    let drained = async {
        leading.await?;
        info!(drain = ?args.shutdown_drain_seconds, "stepped down; serving the webhook while unready, then exiting");
        tokio::time::sleep(Duration::from_secs(args.shutdown_drain_seconds)).await;
        anyhow::Ok(())
    };
    tokio::select! {
        done = drained => done?,
        failed = &mut health => anyhow::bail!("the health and metrics server failed: {failed:?}"),
        served = &mut webhook => match served {
            Err(e) => anyhow::bail!("the webhook server failed: {e:#}"),
            Ok(()) => anyhow::bail!("the webhook server stopped"),
        },
    }
    info!("operator stopped");
    Ok(())
}

/// On SIGTERM or Ctrl-C: unready at once, then `stop` (the leader steps down).
async fn drain_on_signal(ready: Arc<readiness::Readiness>, stop: tokio_util::sync::CancellationToken) {
    shutdown_signal().await;
    ready.drain();
    stop.cancel();
}

/// Loads the webhook's certificate, keeps it and the webhook configuration current, and
/// returns the webhook's server.
async fn webhook(
    client: &kube::Client,
    args: &OperatorArgs,
    own_ns: &str,
    owner: Option<OwnerReference>,
    ctx: &Arc<Context>,
    ready: Arc<readiness::Readiness>,
) -> anyhow::Result<impl std::future::Future<Output = anyhow::Result<()>> + use<>> {
    let source = admission::certs::Source::new(client, &args.webhook, own_ns, owner.clone());
    let tls = source.load().await?;
    let (ca, bundle) = tokio::sync::watch::channel(tls.ca.clone());
    tokio::spawn(admission::configuration::keep_configuration(
        client.clone(),
        args.webhook.clone(),
        own_ns.to_string(),
        args.watch_namespace.clone(),
        bundle,
        owner,
    ));
    let (cert, key) = (tls.cert.clone().into_bytes(), tls.key.clone().into_bytes());
    let server = axum_server::tls_rustls::RustlsConfig::from_pem(cert, key)
        .await
        .map_err(|e| anyhow::anyhow!("the webhook's certificate is unusable: {e}"))?;
    let period = Duration::from_secs(args.webhook.tls_reload_seconds);
    tokio::spawn(admission::certs::keep_current(
        source,
        tls,
        server.clone(),
        ca,
        period,
    ));
    let injector = admission::webhook::Injector {
        template: sidecar_template(args, ctx),
        ctx: ctx.clone(),
        credentials_wait: admission::webhook::credentials_wait(args.webhook.webhook_timeout_seconds),
    };
    Ok(admission::webhook::serve(
        args.webhook.webhook_listen,
        server,
        injector,
        ready,
    ))
}

/// What the reconciler shares.
fn context(
    client: &kube::Client,
    store: &Store,
    metrics: &OperatorMetrics,
    args: &OperatorArgs,
    owner: Option<OwnerReference>,
) -> anyhow::Result<Arc<Context>> {
    let ca = match &args.etcd.etcd_ca_file {
        Some(path) => Some(
            std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("cannot read --etcd-ca-file {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let reporter = Reporter {
        controller: "podlock-operator".into(),
        instance: std::env::var("HOSTNAME").ok(),
    };
    let recorder = Recorder::new(client.clone(), reporter);
    Ok(Arc::new(Context {
        client: client.clone(),
        store: store.clone(),
        metrics: metrics.clone(),
        recorder: recorder.clone(),
        backoff: backoff::Backoff::default(),
        isolation: isolation::Isolation::new(args.etcd.has_credentials(), ca, owner, &args.cluster_name),
        noticed: Arc::default(),
        returned: Arc::default(),
        deadlines: Default::default(),
        cluster: args.cluster_name.clone(),
        status: Arc::new(status::writer::StatusWriter::new(
            metrics.clone(),
            client.clone(),
            recorder.clone(),
        )),
    }))
}

/// Binds `--listen` and returns the server of `/healthz`, `/readyz`, `/checkz` and `/metrics`
/// on it.
async fn health_server(
    args: &OperatorArgs,
    store: Store,
    metrics: OperatorMetrics,
    ready: Arc<readiness::Readiness>,
) -> anyhow::Result<impl std::future::Future<Output = std::io::Result<()>> + use<>> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    let http = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(readiness::readyz).with_state((ready, metrics.etcd_reachable.clone())),
        )
        .route("/checkz", get(readiness::checkz))
        .route(
            "/metrics",
            get(|State(m): State<OperatorMetrics>| async move { m.render() }).with_state(metrics),
        )
        .with_state(store);
    info!(listen = %args.listen, "operator serving health and metrics");
    Ok(axum::serve(listener, http).into_future())
}

/// The sidecar the webhook injects.
fn sidecar_template(args: &OperatorArgs, ctx: &Context) -> inject::SidecarTemplate {
    let endpoints = args.webhook.sidecar_etcd_endpoints.clone();
    inject::SidecarTemplate {
        image: args.webhook.sidecar_image.clone(),
        instance: args.webhook.instance.clone(),
        etcd_endpoints: endpoints.unwrap_or_else(|| args.etcd.etcd_endpoints.join(",")),
        credentials_secret: ctx.isolation.enabled().then(|| isolation::SECRET.to_string()),
        etcd_ca: ctx.isolation.has_ca(),
        cluster: ctx.cluster.clone(),
        resources: args.webhook.sidecar_resources.clone(),
        log_level: args.webhook.sidecar_log_level.clone(),
        pod: inject::flags::PodSettings {
            port: args.webhook.sidecar_port,
            image_pull_secrets: args.webhook.sidecar_image_pull_secrets.clone(),
            security_context: args.webhook.sidecar_security_context.clone(),
        },
    }
}

async fn shutdown_signal() {
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => info!("interrupted: stopping"),
    }
}
