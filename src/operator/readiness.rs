//! When an operator replica may receive traffic, and how it leaves: Ready once its webhook
//! listens (the API server sends every annotated pod's creation to it through the Service),
//! not Ready while it drains. On SIGTERM a replica goes unready at once but keeps serving the
//! webhook for a drain window, so that admission requests already routed to it (endpoints
//! move a moment after readiness changes) are still answered: a rollout of the operator then
//! loses no injection. A replica is not Ready before etcd answered it once: an install whose
//! etcd is missing or unreachable then fails its `helm install --wait` instead of reporting
//! success. After that, etcd's health no longer gates readiness: the webhook needs no etcd,
//! and an etcd outage or election must not take every replica out of the webhook's Service
//! (pods created meanwhile would miss their sidecar).

use axum::extract::State;
use axum::http::StatusCode;
use prometheus::IntGauge;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::lock::Store;

/// Whether the replica should receive traffic.
#[derive(Debug, Default)]
pub struct Readiness {
    webhook_listening: AtomicBool,
    draining: AtomicBool,
    /// etcd answered a probe since the replica started (latched: later outages do not clear it).
    etcd_answered: AtomicBool,
}

impl Readiness {
    /// The webhook's listener is bound: requests to it are accepted from now on.
    pub fn webhook_listening(&self) {
        self.webhook_listening.store(true, Ordering::SeqCst);
    }

    /// The replica is shutting down: readiness fails, the servers go on for the drain window.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// etcd answered a probe ([`etcd_health`](super::etcd_health)).
    pub fn etcd_answered(&self) {
        self.etcd_answered.store(true, Ordering::SeqCst);
    }

    /// Why the replica is not ready, if it is not.
    fn not_ready(&self) -> Option<&'static str> {
        if self.draining.load(Ordering::SeqCst) {
            Some("draining: shutting down")
        } else if !self.webhook_listening.load(Ordering::SeqCst) {
            Some("the webhook does not listen yet")
        } else if !self.etcd_answered.load(Ordering::SeqCst) {
            Some(
                "etcd has not answered since this replica started (is --etcd-endpoints right, and etcd up and reachable?)",
            )
        } else {
            None
        }
    }
}

/// `GET /readyz`: 200 once the webhook listens and etcd answered a probe
/// ([`etcd_health`](super::etcd_health)), until shutdown; says whether etcd answered its last
/// probe. It never waits for etcd: the kubelet
/// gives a readiness probe 1 s, and one that waited that long for a down etcd took every
/// replica out of the webhook's and the metrics' Services (as `helm test` found).
pub async fn readyz(State((readiness, etcd)): State<(Arc<Readiness>, IntGauge)>) -> (StatusCode, String) {
    if let Some(why) = readiness.not_ready() {
        return (StatusCode::SERVICE_UNAVAILABLE, why.into());
    }
    let etcd = match etcd.get() {
        1 => "etcd answered its last probe",
        _ => "etcd did not answer its last probe; the webhook serves regardless",
    };
    (StatusCode::OK, format!("ready ({etcd})"))
}

/// `GET /checkz`: what `helm test` asks. 200 once a lock's round trip through etcd with the
/// operator's credentials works (lease, key, read, revoke); 503 naming the step and etcd's
/// answer otherwise. Unlike `/readyz`, this fails while etcd is down.
pub async fn checkz(State(store): State<Store>) -> (StatusCode, String) {
    let started = std::time::Instant::now();
    match tokio::time::timeout(CHECK_WITHIN, store.round_trip()).await {
        Ok(Ok(())) => (
            StatusCode::OK,
            format!(
                "etcd round trip with the operator's credentials in {:?}",
                started.elapsed()
            ),
        ),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("etcd: {e}")),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("etcd: no answer within {CHECK_WITHIN:?} (is it up, and reachable from the operator?)"),
        ),
    }
}

/// How long `/checkz` waits for etcd.
const CHECK_WITHIN: Duration = Duration::from_secs(3);
