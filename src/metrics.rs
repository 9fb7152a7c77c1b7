//! Prometheus metrics of the contract (prefix `podlock_`), in one registry per process.

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    /// `podlock_locks_lost_total{lock, reason}` (reasons: [`crate::sidecar::lost_reason`]).
    pub locks_lost: IntCounterVec,
    /// `podlock_keepalive_failures_total`.
    pub keepalive_failures: IntCounter,
    /// `podlock_etcd_requests_total`: unary etcd requests made (not keepalives).
    pub etcd_requests: IntCounter,
    /// `podlock_etcd_requests_resent_total`: of those, attempts sent again after an earlier
    /// one failed or went unanswered for 500 ms.
    pub etcd_requests_resent: IntCounter,
    /// `podlock_watch_events_total`: etcd watch events received.
    pub watch_events: IntCounter,
    /// `podlock_etcd_watches_total`: etcd watches created (one per key watched).
    pub etcd_watches: IntCounter,
    /// `podlock_handoffs_total{lock}`: grants that waited in the queue for an earlier holder.
    pub handoffs: IntCounterVec,
    /// `podlock_hold_seconds{lock}`: how long holds lasted, observed as each ends.
    pub hold_seconds: HistogramVec,
    /// `podlock_hold_age_seconds{lock}`: how long this sidecar's oldest hold of the lock has
    /// lasted so far (no series while it holds none).
    pub hold_age: GaugeVec,
    /// When each open hold began, by lock and fencing token (for `hold_age`, `hold_seconds`).
    open_holds: Arc<Mutex<HashMap<(String, i64), Instant>>>,
}

impl SidecarMetrics {
    /// Registers every sidecar metric in a new registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let (handoffs, hold_seconds, hold_age) = hold_metrics();
        let counter = |name: &str, help: &str| registered(&registry, IntCounter::new(name, help).unwrap());
        SidecarMetrics {
            acquire_total: registered(
                &registry,
                IntCounterVec::new(
                    Opts::new("podlock_acquire_total", "Acquire requests by lock and result"),
                    &["lock", "result"],
                )
                .unwrap(),
            ),
            acquire_wait: registered(&registry, acquire_wait()),
            held_locks: registered(
                &registry,
                IntGauge::new("podlock_held_locks", "Holds this sidecar has now").unwrap(),
            ),
            locks_lost: registered(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "podlock_locks_lost_total",
                        "Holds that ended by anything but release, by reason",
                    ),
                    &["lock", "reason"],
                )
                .unwrap(),
            ),
            keepalive_failures: counter("podlock_keepalive_failures_total", "Lease keepalives that failed"),
            etcd_requests: counter(
                "podlock_etcd_requests_total",
                "Unary etcd requests made (not keepalives)",
            ),
            etcd_requests_resent: counter(
                "podlock_etcd_requests_resent_total",
                "Of the etcd requests, attempts sent again after an earlier one failed or went unanswered",
            ),
            watch_events: counter("podlock_watch_events_total", "etcd watch events received"),
            etcd_watches: counter(
                "podlock_etcd_watches_total",
                "etcd watches created (one per key watched)",
            ),
            handoffs: registered(&registry, handoffs),
            hold_seconds: registered(&registry, hold_seconds),
            hold_age: registered(&registry, hold_age),
            open_holds: Arc::default(),
            registry,
        }
    }

    /// The registry's metrics in Prometheus text format, with the open holds' ages as of now.
    pub fn render(&self) -> String {
        self.hold_age.reset();
        let now = Instant::now();
        for ((lock, _), began) in self.open_holds.lock().unwrap().iter() {
            let gauge = self.hold_age.with_label_values(&[lock]);
            gauge.set(gauge.get().max(now.duration_since(*began).as_secs_f64()));
        }
        render(&self.registry)
    }

    /// The registry, for metrics a module of its own registers (`etcd_version.rs`).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Notes that the hold of `lock` with fencing token `token` began now.
    pub fn hold_began(&self, lock: &str, token: i64) {
        let mut open = self.open_holds.lock().unwrap();
        open.insert((lock.to_string(), token), Instant::now());
        // Every lock this sidecar held shows its hold durations from then on, even while 0.
        self.hold_seconds.with_label_values(&[lock]);
    }

    /// Notes that that hold ended (released or lost), and observes how long it lasted.
    pub fn hold_ended(&self, lock: &str, token: i64) {
        let began = self.open_holds.lock().unwrap().remove(&(lock.to_string(), token));
        if let Some(began) = began {
            let lasted = began.elapsed().as_secs_f64();
            self.hold_seconds.with_label_values(&[lock]).observe(lasted);
        }
    }
}

/// `podlock_reconcile_duration_seconds`.
fn reconcile_duration() -> prometheus::Histogram {
    let opts = HistogramOpts::new(
        "podlock_reconcile_duration_seconds",
        "Time one reconciliation took",
    );
    prometheus::Histogram::with_opts(opts.buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]))
        .unwrap()
}

/// `podlock_operator_status_patch_seconds`, the API server's answer time that paces the
/// status writes.
fn status_patch() -> prometheus::Histogram {
    let opts = HistogramOpts::new(
        "podlock_operator_status_patch_seconds",
        "Time one status PATCH of a DistributedLock took",
    );
    prometheus::Histogram::with_opts(opts.buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]))
        .unwrap()
}

/// A stage of the status lag (see `docs/operator.md`), from 10 ms to 10 s.
fn status_stage(name: &str, help: &str) -> prometheus::Histogram {
    let buckets = vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
    prometheus::Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).unwrap()
}

/// The hold metrics: handoffs, hold durations and the open holds' ages, each by lock.
/// `podlock_acquire_wait_seconds{lock}`, with buckets fine enough between 1 s and 1 min for
/// the dashboard's p50/p99 to mean something there.
fn acquire_wait() -> HistogramVec {
    let buckets = vec![
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    ];
    let opts = HistogramOpts::new(
        "podlock_acquire_wait_seconds",
        "Time from acquire request to grant",
    );
    HistogramVec::new(opts.buckets(buckets), &["lock"]).unwrap()
}

/// `collector`, registered in `registry`.
pub(crate) fn registered<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    collector: C,
) -> C {
    registry.register(Box::new(collector.clone())).unwrap();
    collector
}

fn hold_metrics() -> (IntCounterVec, HistogramVec, GaugeVec) {
    let handoffs = IntCounterVec::new(
        Opts::new(
            "podlock_handoffs_total",
            "Grants that waited in the queue for an earlier holder",
        ),
        &["lock"],
    )
    .unwrap();
    // From a short critical section to a leader's day-long hold.
    let buckets = vec![
        0.01, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0,
    ];
    let hold_seconds = HistogramVec::new(
        HistogramOpts::new("podlock_hold_seconds", "How long holds lasted, released or lost")
            .buckets(buckets),
        &["lock"],
    )
    .unwrap();
    let hold_age = GaugeVec::new(
        Opts::new(
            "podlock_hold_age_seconds",
            "How long this sidecar's oldest hold of the lock has lasted so far",
        ),
        &["lock"],
    )
    .unwrap();
    (handoffs, hold_seconds, hold_age)
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

/// `podlock_reconcile_total`'s `result` of a reconciliation that succeeded.
pub const RECONCILED: &str = "ok";

/// The operator's metrics.
#[derive(Clone)]
pub struct OperatorMetrics {
    registry: Registry,
    /// `podlock_reconcile_total{result}`: [`RECONCILED`], or the cause of the failure.
    pub reconcile_total: IntCounterVec,
    /// `podlock_reconcile_duration_seconds`.
    pub reconcile_duration: prometheus::Histogram,
    /// `podlock_operator_status_patch_seconds`: time one status PATCH took.
    pub status_patch: prometheus::Histogram,
    /// `podlock_operator_status_writes_pending`: locks whose latest status waits to be written.
    pub status_writes_pending: IntGauge,
    /// `podlock_operator_status_trigger_seconds`: from an etcd change of a lock to the start
    /// of the reconciliation that reads it.
    pub status_trigger: prometheus::Histogram,
    /// `podlock_operator_status_wait_seconds`: from a lock's status first offered to the
    /// start of its write.
    pub status_wait: prometheus::Histogram,
    /// `podlock_lock_holders{namespace,lock}`.
    pub lock_holders: prometheus::IntGaugeVec,
    /// `podlock_lock_waiters{namespace,lock}`.
    pub lock_waiters: prometheus::IntGaugeVec,
    /// `podlock_forced_releases_total{reason}`: holds the operator ended.
    pub forced_releases: IntCounterVec,
    /// `podlock_operator_leader`: 1 while this replica leads.
    pub leader: IntGauge,
    /// `podlock_etcd_reachable`: 1 while this replica's last probe of etcd was answered.
    pub etcd_reachable: IntGauge,
    /// `podlock_webhook_admissions_total{kind,outcome}`: admission requests the webhook
    /// answered; `outcome` is `changed`, `unchanged`, `warned` or `denied`.
    pub admissions: IntCounterVec,
    /// `podlock_pods_without_sidecar{namespace}`: pods that asked for the sidecar and run
    /// without it (the leader counts them; a namespace that had some stays at 0).
    pub pods_without_sidecar: prometheus::IntGaugeVec,
}

impl OperatorMetrics {
    /// Registers every operator metric in a new registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let vec = |name: &str, help: &str, labels: &[&str]| {
            registered(
                &registry,
                IntCounterVec::new(Opts::new(name, help), labels).unwrap(),
            )
        };
        let gauges = |name: &str, help: &str, labels: &[&str]| {
            let gauges = prometheus::IntGaugeVec::new(Opts::new(name, help), labels);
            registered(&registry, gauges.unwrap())
        };
        let per_lock = |name: &str, help: &str| gauges(name, help, &["namespace", "lock"]);
        let gauge = |name: &str, help: &str| registered(&registry, IntGauge::new(name, help).unwrap());
        let stage = |name: &str, help: &str| registered(&registry, status_stage(name, help));
        OperatorMetrics {
            reconcile_total: vec(
                "podlock_reconcile_total",
                "Reconciliations by result",
                &["result"],
            ),
            reconcile_duration: registered(&registry, reconcile_duration()),
            status_patch: registered(&registry, status_patch()),
            status_writes_pending: gauge(
                "podlock_operator_status_writes_pending",
                "Locks whose latest status waits to be written (at most one write each)",
            ),
            status_trigger: stage(
                "podlock_operator_status_trigger_seconds",
                "Time from an etcd change of a lock to the start of the reconciliation that reads it",
            ),
            status_wait: stage(
                "podlock_operator_status_wait_seconds",
                "Time a lock's latest status waited to be written, from first offered to its PATCH",
            ),
            lock_holders: per_lock("podlock_lock_holders", "Holders of a lock"),
            lock_waiters: per_lock("podlock_lock_waiters", "Waiters of a lock"),
            forced_releases: vec(
                "podlock_forced_releases_total",
                "Holds the operator ended, by reason",
                &["reason"],
            ),
            leader: gauge("podlock_operator_leader", "1 while this replica leads"),
            etcd_reachable: gauge(
                "podlock_etcd_reachable",
                "1 while this replica's last probe of etcd (a read that needs its quorum) was answered",
            ),
            admissions: vec(
                "podlock_webhook_admissions_total",
                "Admission requests the webhook answered, by kind and outcome",
                &["kind", "outcome"],
            ),
            pods_without_sidecar: gauges(
                "podlock_pods_without_sidecar",
                "Pods that asked for the podlock sidecar and run without it (the webhook was not reached), by namespace",
                &["namespace"],
            ),
            registry,
        }
    }

    /// The registry's metrics in Prometheus text format.
    pub fn render(&self) -> String {
        render(&self.registry)
    }

    /// The registry, for metrics a module of its own registers (`etcd_version.rs`).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Creates every labelled counter at 0 (reconciliations that succeeded or failed for one
    /// of `failures`, and forced releases for `reasons`), so that every metric is there from
    /// the first scrape and alerts see a series, not nothing.
    pub fn start_at_zero(&self, failures: &[&str], reasons: &[&str]) {
        for result in [RECONCILED].iter().chain(failures) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn an_open_hold_has_an_age_and_an_ended_one_a_duration() {
        let m = SidecarMetrics::new();
        m.hold_began("a", 7);
        m.hold_began("b", 8);
        std::thread::sleep(std::time::Duration::from_millis(20));
        m.hold_ended("b", 8);
        let text = m.render();
        let age = line(&text, "podlock_hold_age_seconds{lock=\"a\"}").expect("a's age");
        let age: f64 = age.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(age >= 0.02, "age {age}");
        assert!(
            line(&text, "podlock_hold_age_seconds{lock=\"b\"}").is_none(),
            "{text}"
        );
        assert!(
            text.contains("podlock_hold_seconds_count{lock=\"b\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("podlock_hold_seconds_count{lock=\"a\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn the_age_of_a_lock_is_its_oldest_open_hold() {
        let m = SidecarMetrics::new();
        m.hold_began("s", 1);
        std::thread::sleep(std::time::Duration::from_millis(50));
        m.hold_began("s", 2);
        let text = m.render();
        let age = line(&text, "podlock_hold_age_seconds{lock=\"s\"}").unwrap();
        let age: f64 = age.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(age >= 0.05, "the newer hold's age was reported: {age}");
    }

    #[test]
    fn an_end_without_a_beginning_is_not_observed() {
        let m = SidecarMetrics::new();
        m.hold_ended("x", 3);
        assert!(!m.render().contains("podlock_hold_seconds_count{lock=\"x\"}"));
    }
}
