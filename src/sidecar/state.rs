//! What every handler shares ([`AppState`]), and how the engine and that state are made once
//! etcd answers ([`start`]).

use tracing::warn;

use super::args::SidecarArgs;
use super::lost_reason;
use super::reconnect;
use crate::etcd_version;
use crate::lock::{Engine, EventKind, PodRef};
use crate::metrics::SidecarMetrics;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub(super) engine: Engine,
    pub(super) metrics: SidecarMetrics,
    pub(super) namespace: String,
    pub(super) default_holder: String,
    pub(super) default_heartbeat: Option<u32>,
}

/// Connects to etcd and builds the engine and the handlers' state; connects anew whenever etcd
/// refuses the engine's clients (see [`reconnect`]).
pub(super) async fn start(args: &SidecarArgs) -> anyhow::Result<(Engine, AppState)> {
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
    // Beside the API, which serves meanwhile; a version below the minimum is a warning only.
    let link = engine.link().clone();
    let read = move || {
        let link = link.clone();
        async move { link.etcd_versions().await }
    };
    let gauges = etcd_version::VersionGauges::registered(metrics.registry());
    drop(etcd_version::spawn_checks(gauges, read));
    let state = AppState {
        engine: engine.clone(),
        metrics,
        namespace: args.namespace.clone(),
        default_holder: pod_name,
        default_heartbeat: args.heartbeat_timeout_seconds,
    };
    Ok((engine, state))
}

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
                    let reason = lost_reason::label(ev.reason.as_deref().unwrap_or_default());
                    metrics
                        .locks_lost
                        .with_label_values(&[&ev.lock.name, reason])
                        .inc();
                    metrics.hold_ended(&ev.lock.name, ev.fencing_token);
                }
                EventKind::Deadline | EventKind::Yield => {} // a warning: the hold goes on
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
