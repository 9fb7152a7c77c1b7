//! `podlock declare`: writes a lock's settings to etcd exactly as the operator does for a
//! DistributedLock, for use without Kubernetes.

use clap::Args;

use crate::etcd_args::EtcdArgs;
use crate::lock::{HEARTBEAT, MAX_HOLDERS, Settings, TTL};
use crate::lock::{LockId, Store};

/// Flags of `podlock declare`.
#[derive(Debug, Args)]
pub struct DeclareArgs {
    /// The lock's name.
    pub name: String,
    /// The lock's namespace.
    #[arg(long, env = "PODLOCK_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// etcd lease TTL behind every holder and waiter, in seconds.
    #[arg(long, env = "PODLOCK_TTL_SECONDS", default_value_t = TTL.default,
          value_parser = clap::value_parser!(u32).range(TTL.range()))]
    pub ttl_seconds: u32,
    /// 1 for a mutex, N for a counting semaphore.
    #[arg(long, env = "PODLOCK_MAX_HOLDERS", default_value_t = MAX_HOLDERS.default,
          value_parser = clap::value_parser!(u32).range(MAX_HOLDERS.range()))]
    pub max_holders: u32,
    /// 0: holds live as long as their pod; N: apps must heartbeat within N seconds.
    #[arg(long, env = "PODLOCK_HEARTBEAT_TIMEOUT_SECONDS", default_value_t = HEARTBEAT.default,
          value_parser = clap::value_parser!(u32).range(HEARTBEAT.range()))]
    pub heartbeat_timeout_seconds: u32,
    /// Remove the lock instead: its settings and every hold (holders see `lost`).
    #[arg(long, env = "PODLOCK_DECLARE_DELETE")]
    pub delete: bool,
    #[command(flatten)]
    pub etcd: EtcdArgs,
}

/// Runs `podlock declare`.
pub async fn run(args: DeclareArgs) -> anyhow::Result<()> {
    let lock = LockId::new(&args.namespace, &args.name)?;
    let store = Store::new(args.etcd.connect().await?);
    if args.delete {
        let ended = store.undeclare(&lock).await?;
        println!("deleted lock {lock} ({ended} holds and waits ended)");
        return Ok(());
    }
    let s = Settings {
        ttl_seconds: args.ttl_seconds,
        max_holders: args.max_holders,
        heartbeat_timeout_seconds: args.heartbeat_timeout_seconds,
    };
    store.declare(&lock, &s).await?;
    println!(
        "declared lock {lock}: ttlSeconds={} maxHolders={} heartbeatTimeoutSeconds={}",
        s.ttl_seconds, s.max_holders, s.heartbeat_timeout_seconds
    );
    Ok(())
}
