//! Leader election on a `coordination.k8s.io` Lease (through `kube-lease-manager`): with
//! several replicas, exactly one runs the controller and the liveness checks; all of them serve
//! health, metrics and the webhook. A leader that stops gracefully releases the Lease at once;
//! one that dies is replaced within the Lease duration.

use clap::Args;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::Api;
use kube_lease_manager::LeaseManagerBuilder;
use std::future::Future;
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
    /// Lease duration in seconds: how long a dead leader blocks its successor.
    #[arg(long, env = "PODLOCK_LEADER_LEASE_SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(2..=300))]
    pub leader_lease_seconds: u64,
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
    let grace = (args.leader_lease_seconds / 3).max(1);
    let manager = LeaseManagerBuilder::new(client.clone(), &args.leader_election_id)
        .with_namespace(namespace)
        .with_identity(&identity)
        .with_duration(args.leader_lease_seconds)
        .with_grace(grace)
        .build()
        .await?;
    if let Some(owner) = owner {
        // The manager has made the Lease; give it the operator's owner (see `owner`).
        let leases: Api<Lease> = Api::namespaced(client, namespace);
        if let Err(e) = super::owner::adopt(&leases, &args.leader_election_id, owner).await {
            warn!(error = %e, "could not set the leader Lease's owner");
        }
    }
    let (mut leading, task) = manager.watch().await;
    tokio::pin!(shutdown);
    loop {
        if *leading.borrow_and_update() {
            info!(identity, lease = args.leader_election_id, "leading");
            is_leader(true);
            tokio::select! {
                _ = lead() => warn!("leader work ended"),
                _ = leading.changed() => {}
                _ = &mut shutdown => break,
            }
            is_leader(false);
            info!(identity, "no longer leading");
        } else {
            tokio::select! {
                changed = leading.changed() => if changed.is_err() { break },
                _ = &mut shutdown => break,
            }
        }
    }
    drop(leading); // the manager releases the Lease when its channel closes
    match task.await {
        Ok(Ok(_)) => info!("released the leader Lease"),
        Ok(Err(e)) => warn!(error = %e, "could not release the leader Lease"),
        Err(e) => warn!(error = %e, "leader task failed"),
    }
    Ok(())
}
