//! `podlock declare`: writes a lock's settings to etcd exactly as the operator does for a
//! DistributedLock, for use without Kubernetes. It keeps the token epoch etcd has; after the
//! lock etcd was wiped or restored, `--min-token` moves the lock to an epoch whose tokens lie
//! above the highest one the fenced resources have seen.

use anyhow::bail;
use clap::Args;

use crate::etcd_args::EtcdArgs;
use crate::lock::{HEARTBEAT, MAX_HOLD, MAX_HOLDERS, Settings, TTL};
use crate::lock::{LockId, Store, Token, next_epoch};

/// How many times a declare is tried while the settings change under it.
const ATTEMPTS: usize = 4;

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
    /// 0: holds last until released or lost; N: no hold lasts longer than N seconds.
    #[arg(long, env = "PODLOCK_MAX_HOLD_SECONDS", default_value_t = MAX_HOLD.default,
          value_parser = clap::value_parser!(u32).range(MAX_HOLD.range()))]
    pub max_hold_seconds: u32,
    /// Every fencing token handed out from now on lies above N: after the lock etcd was wiped,
    /// rebuilt or restored from a snapshot, pass the highest token your fenced resources have
    /// seen. Moves the lock to a new token epoch if etcd's could hand out N or less (its holds
    /// and waits then end).
    #[arg(long, env = "PODLOCK_MIN_TOKEN", value_name = "N",
          value_parser = clap::value_parser!(i64).range(0..))]
    pub min_token: Option<i64>,
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
    let spec = Settings {
        ttl_seconds: args.ttl_seconds,
        max_holders: args.max_holders,
        heartbeat_timeout_seconds: args.heartbeat_timeout_seconds,
        max_hold_seconds: args.max_hold_seconds,
        epoch: 0,
    };
    let min = args.min_token.map(Token::from_raw);
    let (s, ended) = publish(&store, &lock, spec, min).await?;
    println!(
        "declared lock {lock}: ttlSeconds={} maxHolders={} heartbeatTimeoutSeconds={} \
         maxHoldSeconds={} epoch={}",
        s.ttl_seconds, s.max_holders, s.heartbeat_timeout_seconds, s.max_hold_seconds, s.epoch
    );
    if let Some(ended) = ended {
        let floor = Token::new(s.epoch, 0)?;
        println!(
            "fencing tokens continue above {floor} (epoch {}); {ended} holds and waits of the \
             old epoch ended",
            s.epoch
        );
    }
    Ok(())
}

/// Writes `spec` under the epoch etcd has, or the next one above `min` if etcd could still
/// hand out `min` or less; returns the settings written and, for a new epoch, how many holds
/// and waits of the old one it ended.
async fn publish(
    store: &Store,
    lock: &LockId,
    spec: Settings,
    min: Option<Token>,
) -> anyhow::Result<(Settings, Option<i64>)> {
    for _ in 0..ATTEMPTS {
        let state = store.lock_state(lock, spec.max_holders).await?;
        let kept = state.epoch().unwrap_or(0);
        let epoch = match min {
            Some(min) if min.exceeds(kept, state.revision) => next_epoch(min.epoch())?,
            _ => kept,
        };
        let s = Settings { epoch, ..spec };
        let renew = epoch != kept;
        // Written even if unchanged, as before epochs: a new mod revision, which waiters follow.
        if let Some(ended) = store
            .publish(lock, &s, "", state.settings_revision, renew)
            .await?
        {
            return Ok((s, renew.then_some(ended)));
        }
    }
    bail!(
        "the settings of lock {lock} changed in etcd under every attempt to declare it: is \
         something else declaring it?"
    )
}
