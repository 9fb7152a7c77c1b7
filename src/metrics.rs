//! Prometheus metrics of the contract (prefix `podlock_`), in one registry per process.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

/// The sidecar's metrics.
#[derive(Clone)]
pub struct SidecarMetrics {
    registry: Registry,
    /// `podlock_acquire_total{lock,result}`.
    pub acquire_total: IntCounterVec,
    /// `podlock_acquire_wait_seconds{lock}`: time from request to grant.
    pub acquire_wait: HistogramVec,
    /// `podlock_held_locks`: holds of this sidecar now.
    pub held_locks: IntGauge,
    /// `podlock_locks_lost_total{lock}`.
    pub locks_lost: IntCounterVec,
    /// `podlock_keepalive_failures_total`.
    pub keepalive_failures: IntCounter,
    /// `podlock_etcd_requests_total`: unary etcd requests made (not keepalives).
    pub etcd_requests: IntCounter,
    /// `podlock_watch_events_total`: etcd watch events received.
    pub watch_events: IntCounter,
    /// `podlock_etcd_watches_total`: etcd watches created (one per key watched).
    pub etcd_watches: IntCounter,
}

impl SidecarMetrics {
    /// Registers every sidecar metric in a new registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let acquire_total = IntCounterVec::new(
            Opts::new("podlock_acquire_total", "Acquire requests by lock and result"),
            &["lock", "result"],
        )
        .unwrap();
        let buckets = vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 300.0];
        let acquire_wait = HistogramVec::new(
            HistogramOpts::new(
                "podlock_acquire_wait_seconds",
                "Time from acquire request to grant",
            )
            .buckets(buckets),
            &["lock"],
        )
        .unwrap();
        let held_locks = IntGauge::new("podlock_held_locks", "Holds this sidecar has now").unwrap();
        let locks_lost = IntCounterVec::new(
            Opts::new(
                "podlock_locks_lost_total",
                "Holds that ended by anything but release",
            ),
            &["lock"],
        )
        .unwrap();
        let keepalive_failures =
            IntCounter::new("podlock_keepalive_failures_total", "Lease keepalives that failed").unwrap();
        let etcd_requests = IntCounter::new(
            "podlock_etcd_requests_total",
            "Unary etcd requests made (not keepalives)",
        )
        .unwrap();
        let watch_events =
            IntCounter::new("podlock_watch_events_total", "etcd watch events received").unwrap();
        let etcd_watches = IntCounter::new(
            "podlock_etcd_watches_total",
            "etcd watches created (one per key watched)",
        )
        .unwrap();
        for c in [
            Box::new(acquire_total.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(acquire_wait.clone()),
            Box::new(held_locks.clone()),
            Box::new(locks_lost.clone()),
            Box::new(keepalive_failures.clone()),
            Box::new(etcd_requests.clone()),
            Box::new(watch_events.clone()),
            Box::new(etcd_watches.clone()),
        ] {
            registry.register(c).unwrap();
        }
        SidecarMetrics {
            registry,
            acquire_total,
            acquire_wait,
            held_locks,
            locks_lost,
            keepalive_failures,
            etcd_requests,
            watch_events,
            etcd_watches,
        }
    }

    /// The registry's metrics in Prometheus text format.
    pub fn render(&self) -> String {
        render(&self.registry)
    }
}

impl Default for SidecarMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Raises a counter to `total`, a running total kept elsewhere.
pub fn set_counter(counter: &IntCounter, total: u64) {
    counter.inc_by(total.saturating_sub(counter.get()));
}

/// Encodes a registry in Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .expect("text encoding");
    String::from_utf8(buf).expect("prometheus text is UTF-8")
}

/// The operator's metrics.
#[derive(Clone)]
pub struct OperatorMetrics {
    registry: Registry,
    /// `podlock_reconcile_total{result}`: `ok` or `error`.
    pub reconcile_total: IntCounterVec,
    /// `podlock_reconcile_duration_seconds`.
    pub reconcile_duration: prometheus::Histogram,
    /// `podlock_lock_holders{namespace,lock}`.
    pub lock_holders: prometheus::IntGaugeVec,
    /// `podlock_lock_waiters{namespace,lock}`.
    pub lock_waiters: prometheus::IntGaugeVec,
    /// `podlock_forced_releases_total{reason}`: holds the operator ended.
    pub forced_releases: IntCounterVec,
    /// `podlock_operator_leader`: 1 while this replica leads.
    pub leader: IntGauge,
    /// `podlock_webhook_admissions_total{kind,outcome}`: admission requests the webhook
    /// answered; `outcome` is `changed`, `unchanged`, `warned` or `denied`.
    pub admissions: IntCounterVec,
}

impl OperatorMetrics {
    /// Registers every operator metric in a new registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let reconcile_total = IntCounterVec::new(
            Opts::new("podlock_reconcile_total", "Reconciliations by result"),
            &["result"],
        )
        .unwrap();
        let reconcile_duration = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "podlock_reconcile_duration_seconds",
                "Time one reconciliation took",
            )
            .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]),
        )
        .unwrap();
        let labels = &["namespace", "lock"];
        let lock_holders =
            prometheus::IntGaugeVec::new(Opts::new("podlock_lock_holders", "Holders of a lock"), labels)
                .unwrap();
        let lock_waiters =
            prometheus::IntGaugeVec::new(Opts::new("podlock_lock_waiters", "Waiters of a lock"), labels)
                .unwrap();
        let forced_releases = IntCounterVec::new(
            Opts::new(
                "podlock_forced_releases_total",
                "Holds the operator ended, by reason",
            ),
            &["reason"],
        )
        .unwrap();
        let leader = IntGauge::new("podlock_operator_leader", "1 while this replica leads").unwrap();
        let admissions = IntCounterVec::new(
            Opts::new(
                "podlock_webhook_admissions_total",
                "Admission requests the webhook answered, by kind and outcome",
            ),
            &["kind", "outcome"],
        )
        .unwrap();
        for c in [
            Box::new(leader.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(reconcile_total.clone()),
            Box::new(reconcile_duration.clone()),
            Box::new(lock_holders.clone()),
            Box::new(lock_waiters.clone()),
            Box::new(forced_releases.clone()),
            Box::new(admissions.clone()),
        ] {
            registry.register(c).unwrap();
        }
        OperatorMetrics {
            registry,
            reconcile_total,
            reconcile_duration,
            lock_holders,
            lock_waiters,
            forced_releases,
            leader,
            admissions,
        }
    }

    /// The registry's metrics in Prometheus text format.
    pub fn render(&self) -> String {
        render(&self.registry)
    }

    /// Creates every labelled counter at 0 (results, and forced releases for `reasons`), so
    /// that every metric is there from the first scrape and alerts see a series, not nothing.
    pub fn start_at_zero(&self, reasons: &[&str]) {
        for result in ["ok", "error"] {
            self.reconcile_total.with_label_values(&[result]);
        }
        for reason in reasons {
            self.forced_releases.with_label_values(&[reason]);
        }
    }
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self::new()
    }
}
