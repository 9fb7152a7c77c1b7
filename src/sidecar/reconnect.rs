//! Connecting anew when etcd refuses the sidecar's clients: its password, its user or etcd's
//! CA changed while it ran (a reinstall on fresh etcd volumes, a rotated password; #41). The
//! injected sidecar reads its credentials and etcd's CA as files of its namespace's mounted
//! Secret, which the kubelet rewrites in place within about a minute of the operator: each try
//! reads them again, so the pod locks again without a restart. Until a try gets in, requests
//! fail as they did (403 or 503, with etcd's reason).

use std::time::Duration;
use tokio::time::{Instant, sleep};
use tracing::{info, warn};

use crate::etcd_args::EtcdArgs;
use crate::lock::Link;
use crate::retry::{self, Pauses};

/// Clients that served this long without a refusal start the next run of pauses from the first.
/// Refused again sooner (a role that stays gone refuses the new clients as it did the old), the
/// pauses go on growing, so etcd is not asked for a password check on every request.
const SERVED: Duration = Duration::from_secs(60);

/// Waits for etcd to refuse `link`'s clients, then builds new ones from `etcd`'s flags (files
/// read again) and puts them in its place, pausing between tries (see [`retry::reconnect`]).
/// Runs for the sidecar's life.
pub(super) async fn run(link: Link, etcd: EtcdArgs) {
    let mut pauses = Pauses::new(retry::reconnect());
    let mut replaced: Option<Instant> = None;
    loop {
        let cause = link.refused().await;
        warn!(%cause, "etcd refused the sidecar's connection; reading its credentials and CA again, connecting anew");
        match replaced {
            Some(at) if at.elapsed() < SERVED => sleep(pauses.next_pause()).await,
            _ => pauses = Pauses::new(retry::reconnect()),
        }
        loop {
            match etcd.connect_all().await {
                Ok((client, members)) => break link.replace(client, members),
                Err(e) => {
                    let pause = pauses.next_pause();
                    warn!(error = format!("{e:#}"), retry_in = ?pause, "cannot connect anew yet");
                    sleep(pause).await;
                }
            }
        }
        replaced = Some(Instant::now());
        info!(%cause, "connected anew to etcd with the credentials and CA read again");
    }
}
