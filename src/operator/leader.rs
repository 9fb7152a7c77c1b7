//! Leader election on a `coordination.k8s.io` Lease, as client-go's `leaderelection` does it:
//! with several replicas, exactly one runs the controller and the liveness checks; all of them
//! serve health, metrics and the webhook.
//!
//! Three durations (client-go's defaults: 15 s, 10 s, 2 s):
//! * **lease duration**: a follower takes the Lease over only when it has seen no change to it
//!   for this long, timed by the follower's own monotonic clock from the moment *it* saw the
//!   last change, never from the holder's `renewTime`; so an offset between the machines'
//!   clocks cannot shorten it;
//! * **renew deadline**: a leader that has not renewed for this long, timed from the start of
//!   its last successful renewal, stops leading (its work is dropped) — before any follower can
//!   have taken over, as it is shorter than the lease duration. The difference (5 s by default)
//!   is the margin for requests in flight and for clocks that run at different rates;
//! * **retry period**: how often the leader renews and followers look.
//!
//! Writes are replaces guarded by the Lease's `resourceVersion`, so two replicas never both
//! believe they took it. A leader that stops gracefully releases the Lease at once; one that
//! dies is replaced one lease duration after its last renewal.

use clap::Args;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

/// Leader-election flags of `podlock operator`.
#[derive(Debug, Clone, Args)]
pub struct LeaderArgs {
    /// Name of the Lease the replicas contend for.
    #[arg(long, env = "PODLOCK_LEADER_ELECTION_ID", default_value = "podlock-operator")]
    pub leader_election_id: String,
    /// Namespace of that Lease (default: the operator's namespace).
    #[arg(long, env = "PODLOCK_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Lease duration in seconds: followers take the Lease over after seeing it unrenewed this
    /// long; a dead leader blocks its successor this long.
    #[arg(long, env = "PODLOCK_LEADER_LEASE_SECONDS", default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..=300))]
    pub leader_lease_seconds: u64,
    /// Renew deadline in seconds: a leader that could not renew for this long stops leading.
    /// Must be less than the lease duration.
    #[arg(long, env = "PODLOCK_LEADER_RENEW_DEADLINE_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=299))]
    pub leader_renew_deadline_seconds: u64,
    /// Retry period in seconds: how often the leader renews and followers try to acquire.
    #[arg(long, env = "PODLOCK_LEADER_RETRY_PERIOD_SECONDS", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=60))]
    pub leader_retry_period_seconds: u64,
}

/// The three durations, checked against each other.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    lease: Duration,
    renew_deadline: Duration,
    retry: Duration,
}

impl LeaderArgs {
    /// The timing, if it is safe: retry period < renew deadline < lease duration.
    pub fn timing(&self) -> anyhow::Result<Timing> {
        let (lease, renew, retry) = (
            self.leader_lease_seconds,
            self.leader_renew_deadline_seconds,
            self.leader_retry_period_seconds,
        );
        anyhow::ensure!(
            renew < lease,
            "--leader-renew-deadline-seconds ({renew}) must be less than --leader-lease-seconds ({lease}): \
             a leader must stop leading before a follower may take its Lease over"
        );
        // client-go's rule: room for one retry with 20 % jitter within the renew deadline.
        anyhow::ensure!(
            renew * 10 > retry * 12,
            "--leader-renew-deadline-seconds ({renew}) must exceed 1.2 × --leader-retry-period-seconds \
             ({retry}): a leader needs room to retry a failed renewal"
        );
        Ok(Timing {
            lease: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(renew),
            retry: Duration::from_secs(retry),
        })
    }
}

/// What one attempt to acquire or renew found.
enum Attempt {
    /// This replica holds the Lease now.
    Held,
    /// Another replica holds it (and its lease runs).
    HeldBy(String),
    /// Another write came first; look again.
    Raced,
}

/// One replica's view of the Lease.
struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    owner: Option<OwnerReference>,
    /// The Lease's spec as last seen, and when this process saw it change.
    observed: Option<(LeaseSpec, Instant)>,
}

impl Elector {
    /// One look at the Lease; takes it when it is free, expired or ours.
    async fn try_acquire_or_renew(&mut self) -> kube::Result<Attempt> {
        let now = Instant::now();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return self.create().await;
        };
        let spec = lease.spec.clone().unwrap_or_default();
        self.observe(&spec, now);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let ours = holder.as_deref() == Some(self.identity.as_str());
        if let Some(other) = holder.filter(|_| !ours && !self.expired(now)) {
            return Ok(Attempt::HeldBy(other));
        }
        lease.spec = Some(self.record(&spec, ours));
        if lease.metadata.owner_references.is_none() {
            // A Lease from an older release: give it the operator's owner (see `owner`).
            lease.metadata.owner_references = self.owner.clone().map(|o| vec![o]);
        }
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(written) => {
                self.observe(&written.spec.unwrap_or_default(), Instant::now());
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Raced),
            Err(e) => Err(e),
        }
    }

    /// Creates the Lease, held by this replica.
    async fn create(&mut self) -> kube::Result<Attempt> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                owner_references: self.owner.clone().map(|o| vec![o]),
                ..Default::default()
            },
            spec: Some(self.record(&LeaseSpec::default(), false)),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(written) => {
                self.observe(&written.spec.unwrap_or_default(), Instant::now());
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Raced),
            Err(e) => Err(e),
        }
    }

    /// The spec that says this replica holds the Lease from now on.
    fn record(&self, old: &LeaseSpec, ours: bool) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        let transitions = old.lease_transitions.unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.timing.lease.as_secs() as i32),
            acquire_time: if ours {
                old.acquire_time.clone()
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if ours { transitions } else { transitions + 1 }),
            ..Default::default()
        }
    }

    /// Remembers `spec`, and `at` as when it changed, unless it is what was seen last.
    fn observe(&mut self, spec: &LeaseSpec, at: Instant) {
        if self.observed.as_ref().is_none_or(|(seen, _)| seen != spec) {
            self.observed = Some((spec.clone(), at));
        }
    }

    /// When the lease last seen runs out, by this process's clock.
    fn expiry(&self) -> Option<Instant> {
        let (spec, seen) = self.observed.as_ref()?;
        let secs = spec
            .lease_duration_seconds
            .map_or(self.timing.lease.as_secs(), |s| s.max(0) as u64);
        Some(*seen + Duration::from_secs(secs))
    }

    fn expired(&self, now: Instant) -> bool {
        self.expiry().is_none_or(|at| at <= now)
    }

    /// Looks every retry period (or when the holder's lease runs out, if sooner) until this
    /// replica holds the Lease; returns when that attempt started.
    async fn acquire(&mut self) -> Instant {
        loop {
            let started = Instant::now();
            let next = match self.try_acquire_or_renew().await {
                Ok(Attempt::Held) => return started,
                Ok(Attempt::HeldBy(_)) => self.expiry().map_or(started + self.timing.retry, |at| {
                    at.min(started + self.timing.retry)
                }),
                Ok(Attempt::Raced) => started + self.timing.retry,
                Err(e) => {
                    warn!(error = %e, lease = self.name, "could not read or take the leader Lease");
                    started + self.timing.retry
                }
            };
            tokio::time::sleep_until(next.max(Instant::now() + Duration::from_millis(10))).await;
        }
    }

    /// Renews every retry period; returns why it stopped: the renew deadline passed since the
    /// last successful renewal (which started at `renewed`), or another replica took over.
    async fn keep_leading(&mut self, mut renewed: Instant) -> String {
        loop {
            let deadline = renewed + self.timing.renew_deadline;
            tokio::time::sleep_until((renewed + self.timing.retry).min(deadline)).await;
            let started = Instant::now();
            match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(Attempt::Held)) => renewed = started,
                Ok(Ok(Attempt::HeldBy(other))) => return format!("{other} holds the Lease"),
                Ok(Ok(Attempt::Raced)) => {}
                Ok(Err(e)) => warn!(error = %e, lease = self.name, "could not renew the leader Lease"),
                Err(_) => {}
            }
            if Instant::now() >= renewed + self.timing.renew_deadline {
                return format!(
                    "could not renew the Lease within the renew deadline ({:?})",
                    self.timing.renew_deadline
                );
            }
        }
    }

    /// Gives the Lease up if this replica holds it, so that a follower takes over at once.
    async fn release(&mut self) -> kube::Result<()> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        Ok(())
    }
}

/// Runs `lead()` whenever this replica leads, until `shutdown` completes; then releases the
/// Lease. `is_leader` is told every change.
pub async fn run_when_leader<F, Fut>(
    client: kube::Client,
    args: &LeaderArgs,
    namespace: &str,
    owner: Option<&OwnerReference>,
    is_leader: impl Fn(bool),
    lead: F,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    let identity = format!(
        "{}-{}",
        std::env::var("HOSTNAME").unwrap_or_else(|_| "podlock".into()),
        std::process::id()
    );
    let mut elector = Elector {
        api: Api::namespaced(client, namespace),
        name: args.leader_election_id.clone(),
        identity: identity.clone(),
        timing: args.timing()?,
        owner: owner.cloned(),
        observed: None,
    };
    tokio::pin!(shutdown);
    loop {
        let renewed = tokio::select! {
            renewed = elector.acquire() => renewed,
            _ = &mut shutdown => return Ok(()),
        };
        info!(identity, lease = args.leader_election_id, "leading");
        is_leader(true);
        let stopped = tokio::select! {
            _ = lead() => Some("leader work ended".to_string()),
            why = elector.keep_leading(renewed) => Some(why),
            _ = &mut shutdown => None,
        };
        is_leader(false);
        let Some(why) = stopped else { break };
        warn!(identity, reason = why, "no longer leading");
    }
    match elector.release().await {
        Ok(()) => info!("released the leader Lease"),
        Err(e) => warn!(error = %e, "could not release the leader Lease"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        leader: LeaderArgs,
    }

    fn timing(args: &[&str]) -> anyhow::Result<Timing> {
        let cli = Cli::try_parse_from(std::iter::once("podlock").chain(args.iter().copied()))?;
        cli.leader.timing()
    }

    #[test]
    fn defaults_are_client_gos_and_leave_a_five_second_margin() {
        let t = timing(&[]).unwrap();
        assert_eq!(
            (t.lease, t.renew_deadline, t.retry),
            (
                Duration::from_secs(15),
                Duration::from_secs(10),
                Duration::from_secs(2)
            )
        );
        assert!(t.lease - t.renew_deadline >= Duration::from_secs(5));
    }

    #[test]
    fn a_renew_deadline_not_below_the_lease_is_refused_naming_both_flags() {
        let err = timing(&[
            "--leader-lease-seconds",
            "5",
            "--leader-renew-deadline-seconds",
            "5",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("--leader-renew-deadline-seconds (5)") && err.contains("--leader-lease-seconds (5)"),
            "{err}"
        );
        let err = timing(&[
            "--leader-renew-deadline-seconds",
            "2",
            "--leader-retry-period-seconds",
            "2",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("--leader-retry-period-seconds"), "{err}");
    }
}
