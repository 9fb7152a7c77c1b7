//! The fleet of DistributedLocks: created through the API server in namespaces of their own,
//! and the operator that brings them to Ready.

use kube::Api;
use kube::api::ListParams;
use podlock::crd::DistributedLock;
use std::time::{Duration, Instant};

use crate::Sizes;
use crate::common::kube::ControlPlane;

/// The name of namespace `i`.
pub fn namespace(i: usize) -> String {
    format!("scale-{i:03}")
}

/// The name of lock `i` of a namespace.
pub fn lock(i: usize) -> String {
    format!("lock-{i:05}")
}

/// Creates the namespaces and `sizes.locks` DistributedLocks spread evenly over them (with
/// `kubectl apply`, a thousand per call); returns how long that took.
pub fn create(plane: &ControlPlane, sizes: &Sizes) -> Duration {
    let started = Instant::now();
    let per_ns = sizes.locks / sizes.namespaces;
    for n in 0..sizes.namespaces {
        create_in(plane, &plane.namespace(&namespace(n)), per_ns);
    }
    started.elapsed()
}

/// Creates `count` DistributedLocks in namespace `ns` (TTL 30 s), a thousand per apply.
pub fn create_in(plane: &ControlPlane, ns: &str, count: usize) {
    let docs: Vec<String> = (0..count)
        .map(|l| {
            format!(
                "apiVersion: podlock.io/v1alpha1\nkind: DistributedLock\nmetadata: {{name: {}, namespace: {ns}}}\nspec: {{ttlSeconds: 30}}\n",
                lock(l)
            )
        })
        .collect();
    for chunk in docs.chunks(1000) {
        let (ok, _, err) = plane.kubectl_stdin(&["apply", "-f", "-"], &chunk.join("---\n"));
        assert!(ok, "kubectl apply of DistributedLocks: {err}");
    }
}

/// Waits until `count` DistributedLocks report `Ready` (listed every second, 500 a page);
/// returns when that was.
pub async fn all_ready(plane: &ControlPlane, count: usize, limit: Duration) -> Instant {
    let api: Api<DistributedLock> = Api::all(plane.client().await);
    let deadline = Instant::now() + limit;
    loop {
        let ready = count_ready(&api).await;
        if ready >= count {
            return Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "only {ready} of {count} locks Ready after {limit:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn count_ready(api: &Api<DistributedLock>) -> usize {
    let mut ready = 0;
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.expect("list DistributedLocks");
        ready += (page.items.iter())
            .filter(|dl| {
                let conditions = dl
                    .status
                    .as_ref()
                    .map(|s| s.conditions.as_slice())
                    .unwrap_or_default();
                conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
            .count();
        match page.metadata.continue_ {
            Some(next) if !next.is_empty() => params = params.continue_token(&next),
            _ => return ready,
        }
    }
}

/// The operator's requests to the API server by kind, summed from the API server's own
/// `apiserver_request_total` and `apiserver_request_duration_seconds` (the operator is the only
/// client writing these here).
#[derive(Debug, Default, Clone, Copy)]
pub struct ApiWrites {
    /// PATCHes (server-side applies included) of `distributedlocks/status`.
    pub status: f64,
    /// The seconds the API server took over those PATCHes.
    pub status_seconds: f64,
    /// Creates and patches of Events.
    pub events: f64,
}

impl ApiWrites {
    /// The totals now.
    pub fn read(plane: &ControlPlane) -> Self {
        let (ok, text, err) = plane.kubectl(&["get", "--raw", "/metrics"]);
        assert!(ok, "API server metrics: {err}");
        let mut w = ApiWrites::default();
        for line in text.lines() {
            let value: f64 = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            let is = |label: &str| line.contains(label);
            // The operator writes the status by server-side apply: HTTP PATCHes that the API
            // server counts under the verb APPLY.
            let patch = is("verb=\"PATCH\"") || is("verb=\"APPLY\"");
            let status_patch = is("resource=\"distributedlocks\"") && is("subresource=\"status\"") && patch;
            let event_write = is("resource=\"events\"") && (is("verb=\"POST\"") || is("verb=\"PATCH\""));
            if line.starts_with("apiserver_request_total{") {
                if status_patch {
                    w.status += value;
                } else if event_write {
                    w.events += value;
                }
            } else if line.starts_with("apiserver_request_duration_seconds_sum{") && status_patch {
                w.status_seconds += value;
            }
        }
        w
    }

    /// The writes since `before`, per second over `secs`.
    pub fn rate_since(&self, before: &ApiWrites, secs: f64) -> ApiWrites {
        ApiWrites {
            status: (self.status - before.status) / secs,
            status_seconds: (self.status_seconds - before.status_seconds) / secs,
            events: (self.events - before.events) / secs,
        }
    }
}
