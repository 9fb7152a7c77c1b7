//! The narrow interface through which the operator and `podlock declare` use podlock's data in
//! etcd, without the sidecar's engine: publish, withdraw and undeclare a lock, read its settings and its
//! queue, list and watch what is there, end an entry, revoke a dead pod's lease, and give a
//! namespace its etcd role. Every request goes through the engine's hedged, counted client;
//! what it returns is typed ([`QueueEntry`], [`Change`]): the key layout and etcd's own types
//! stay inside the engine.

pub(super) mod auth;
pub(super) mod changes;
pub(super) mod clusters;

use etcd_client::{GetOptions, Txn, TxnOp, WatchOptions};
use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use crate::lock::error::LockError;
use crate::lock::etcd::Etcd;
use crate::lock::etcd::version::Versions;
use crate::lock::protocol::Queued;
use crate::lock::protocol::entry::rfc3339;
use crate::lock::protocol::keys;
use crate::lock::protocol::names::LockId;
use crate::lock::txn::queue::{self, QueueState, Ticket};
use crate::lock::txn::release_note::{self, Ending};
use crate::lock::txn::settings::{self, Settings};
use crate::lock::txn::{entry_swap, multi_lock};
use changes::{Changes, QueueEntry};
use clusters::Withdrawn;

/// podlock's data in etcd, for the operator and `podlock declare`. Cheap to clone.
#[derive(Clone)]
pub struct Store(Etcd);

/// A lock as etcd has it, read by [`Store::lock_state`].
#[derive(Debug, Clone)]
pub struct LockState {
    /// Its settings; `None` when etcd does not have them.
    pub settings: Option<Settings>,
    /// The cluster that published them (empty: unowned, or a single cluster's).
    pub publisher: String,
    /// The settings' mod revision (0: none), which [`Store::publish`] is guarded by.
    pub settings_revision: i64,
    /// Its holders, and how many wait.
    pub queue: QueueState,
    /// etcd's revision when it was read.
    pub revision: i64,
    /// While it has no settings: the token epoch kept when it was removed, if it was removed
    /// under an epoch above 0 (see `settings::retire`).
    pub retired: Option<u32>,
    /// The entries that hold it with a deadline, in queue order: a maximum hold time
    /// (`maxHoldSeconds`), or a yield request's: those the operator ends if still there then.
    pub timed: Vec<QueueEntry>,
}

impl LockState {
    /// The token epoch etcd has for the lock: its settings', or the one kept at its removal.
    pub fn epoch(&self) -> Option<u32> {
        self.settings.map(|s| s.epoch).or(self.retired)
    }
}

/// What [`Store::revoke_lease_in`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Revoked {
    /// The lease was revoked.
    Revoked,
    /// etcd no longer had it.
    Gone,
    /// It carries this key of another namespace, so it was left alone.
    Foreign(String),
}

/// The entries of a queue range that hold, in queue order, by the one rule of who holds under
/// `max_holders`.
fn holding(kvs: &[etcd_client::KeyValue], max_holders: u32) -> Vec<QueueEntry> {
    let entries: Vec<(Option<QueueEntry>, Queued)> = (kvs.iter())
        .filter_map(QueueEntry::of)
        .map(|e| {
            let q = Queued::of(e.entry.as_ref());
            (e.entry.is_some().then_some(e), q)
        })
        .collect();
    let held = queue::held(&entries, max_holders);
    entries.into_iter().take(held).filter_map(|(e, _)| e).collect()
}

/// The lease TTL of [`Store::round_trip`]: its key goes with the lease even if the revoke fails.
const CHECK_TTL: u32 = 10;

/// Which step of [`Store::round_trip`] failed, and why.
#[derive(Debug, thiserror::Error)]
#[error("could not {step}: {source}")]
pub struct RoundTripError {
    /// The step.
    pub step: &'static str,
    /// What etcd said.
    #[source]
    pub source: LockError,
}

impl Store {
    /// A store on `client`.
    pub fn new(client: etcd_client::Client) -> Self {
        Store(Etcd::new(client))
    }

    /// The version of each etcd member (see [`Link::etcd_versions`](crate::lock::etcd::link::Link::etcd_versions)).
    pub async fn etcd_versions(&self) -> Versions {
        self.0.link().etcd_versions().await
    }

    /// Whether etcd answers within `within`.
    pub async fn ready(&self, within: Duration) -> bool {
        let probe = self.0.get(keys::readiness_key(), None);
        matches!(tokio::time::timeout(within, probe).await, Ok(Ok(_)))
    }

    /// What a lock does in etcd, once, with these credentials: a lease granted, a key put on
    /// it and read back in one transaction, the lease revoked (removing the key). The error
    /// names the step that failed.
    pub async fn round_trip(&self) -> Result<(), RoundTripError> {
        let step = |step: &'static str| move |source| RoundTripError { step, source };
        let lease = self
            .0
            .lease_grant(CHECK_TTL)
            .await
            .map_err(step("grant a lease"))?;
        let key = keys::check_key(lease);
        let put = etcd_client::PutOptions::new().with_lease(lease);
        let txn = Txn::new().and_then([
            TxnOp::put(key.as_str(), "check", Some(put)),
            TxnOp::get(key.as_str(), None),
        ]);
        let written = self.0.txn(txn).await.map_err(step("put and read a key on it"));
        let revoked = self.0.lease_revoke(lease).await.map_err(step("revoke the lease"));
        written.and(revoked).map(|_| ())
    }

    /// Writes a lock's settings, published by `cluster` (empty: unnamed), if etcd still has the
    /// ones of mod revision `over` (0: none);
    /// `renew` (a new token epoch) also removes the lock's queue in the same transaction, so
    /// that no key enqueued under the old epoch is granted under it: its holders see `lost`.
    /// Returns how many queue keys it removed, or `None` if the settings changed meanwhile
    /// (read them again and decide again).
    pub async fn publish(
        &self,
        lock: &LockId,
        s: &Settings,
        cluster: &str,
        over: i64,
        renew: bool,
    ) -> Result<Option<i64>, LockError> {
        settings::publish(&self.0, lock, s, cluster, over, renew).await
    }

    /// Records that the named `cluster` declares `lock` (nothing when unnamed), so that no other
    /// cluster's withdrawal removes the lock from under it (see `shared`).
    pub async fn declare_in(&self, lock: &LockId, cluster: &str) -> Result<(), LockError> {
        clusters::declare(&self.0, lock, cluster).await
    }

    /// Withdraws `cluster` from a lock several clusters may share: ends its own pods' keys and
    /// removes the lock only when no other cluster's pod queues on it (see `shared`). `None`:
    /// the lock kept changing meanwhile.
    pub async fn withdraw(&self, lock: &LockId, cluster: &str) -> Result<Option<Withdrawn>, LockError> {
        clusters::withdraw(&self.0, lock, cluster).await
    }

    /// Removes a lock: its settings and every queue key. Returns how many keys it ended.
    pub async fn undeclare(&self, lock: &LockId) -> Result<i64, LockError> {
        settings::undeclare(&self.0, lock).await
    }

    /// A lock's settings and its queue (its holders by the one rule of who holds, under the
    /// settings etcd has, else under `max_holders`; and how many wait), read in one
    /// transaction with etcd's revision: the operator reads them on every reconciliation.
    pub async fn lock_state(&self, lock: &LockId, max_holders: u32) -> Result<LockState, LockError> {
        let read = queue::read_lock(&self.0, lock, None).await?;
        let max_holders = read
            .declared
            .as_ref()
            .map_or(max_holders, |d| d.settings.max_holders);
        let retired = match read.declared {
            Some(_) => None,
            None => settings::retired(&self.0, lock).await?,
        };
        let timed = match &read.declared {
            Some(d) => holding(&read.queue, d.settings.max_holders),
            None => vec![],
        };
        let timed = (timed.into_iter())
            .filter(|e| {
                (e.entry.as_ref()).is_some_and(|e| e.max_hold_seconds > 0 || e.yield_deadline.is_some())
            })
            .collect();
        Ok(LockState {
            settings: read.declared.as_ref().map(|d| d.settings),
            publisher: (read.declared.as_ref()).map_or(String::new(), |d| settings::publisher(&d.value)),
            settings_revision: read.declared.map_or(0, |d| d.revision),
            queue: queue::split_queue(&read.queue, max_holders),
            revision: read.revision,
            retired,
            timed,
        })
    }

    /// The entries that hold `lock` now, in queue order, by the one rule of who holds under
    /// its settings as etcd has them (none when it is not declared); one read.
    pub async fn holding(&self, lock: &LockId) -> Result<Vec<QueueEntry>, LockError> {
        let read = queue::read_lock(&self.0, lock, None).await?;
        let Some(declared) = read.declared else {
            return Ok(vec![]);
        };
        Ok(holding(&read.queue, declared.settings.max_holders))
    }

    /// Ends the hold `held` for `why` (an administrator's request, its deadline), if its key
    /// still has its create revision (a later hold of the same holder id is never touched),
    /// leaving a note that its sidecar reads to say so (see `release_note`). Returns whether
    /// it ended it.
    pub async fn release(&self, held: &QueueEntry, why: Ending) -> Result<bool, LockError> {
        let Some((_, holder)) = keys::parse_entry_key(&held.key) else {
            return Ok(false); // not a key the engine writes: no sidecar to tell
        };
        release_note::release(&self.0, &held.lock, &holder, &held.ticket(), why).await
    }

    /// Asks the holder `held` to yield by `by` (see `entry_swap`), if its key still has its
    /// create revision. Returns the deadline in force (an earlier request's, if sooner), or
    /// `None` if the key is gone.
    pub async fn ask_to_yield(&self, held: &QueueEntry, by: SystemTime) -> Result<Option<String>, LockError> {
        entry_swap::ask_to_yield(&self.0, &held.ticket(), &rfc3339(by)).await
    }

    /// Every lock with settings or queue keys in `namespace` (all when `None`).
    pub async fn locks(&self, namespace: Option<&str>) -> Result<BTreeSet<LockId>, LockError> {
        let mut found = BTreeSet::new();
        for prefix in [keys::config_prefix(namespace), keys::queue_root(namespace)] {
            let opts = GetOptions::new().with_prefix().with_keys_only();
            let resp = self.0.get(prefix, Some(opts)).await?;
            found.extend(resp.kvs().iter().filter_map(|kv| keys::lock_of_key(kv.key())));
        }
        Ok(found)
    }

    /// Every queue entry in `namespace` (all when `None`), and the revision they were read at.
    pub async fn entries(&self, namespace: Option<&str>) -> Result<(Vec<QueueEntry>, i64), LockError> {
        let opts = GetOptions::new().with_prefix();
        let resp = self.0.get(keys::queue_root(namespace), Some(opts)).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        Ok((resp.kvs().iter().filter_map(QueueEntry::of).collect(), revision))
    }

    /// Watches the settings and queues of `namespace` (all when `None`) from `revision` on.
    pub async fn watch(&self, namespace: Option<&str>, revision: i64) -> Result<Changes, LockError> {
        let opts = || Some(WatchOptions::new().with_prefix().with_start_revision(revision));
        let mut watch = self.0.client().watch_client();
        let mut stream = watch.watch(keys::config_prefix(namespace), opts()).await?;
        stream.watch(keys::queue_root(namespace), opts()).await?;
        Ok(Changes(stream))
    }

    /// Deletes each entry, given as (key, create revision, lease), if its key still has that
    /// create revision (a newer entry under the same key is never touched), all in one
    /// transaction, the queues' back first (see `multi_lock::end_together`): a pod's holds and waits
    /// end together, so that none of its waiters is admitted for a moment by the end of its
    /// own holder ahead. Returns, for each entry, whether it deleted it.
    pub async fn end_entries(&self, entries: &[(&str, i64, i64)]) -> Result<Vec<bool>, LockError> {
        let tickets: Vec<Ticket> = (entries.iter())
            .map(|&(key, revision, lease)| Ticket {
                key: key.into(),
                revision,
                lease,
            })
            .collect();
        multi_lock::end_together(&self.0, &tickets).await
    }

    /// Revokes `lease` only if every key on it lies under `namespace`'s queues: exactly what
    /// that namespace's own etcd role could revoke. A key of another namespace on it means a
    /// tenant attached its key to someone else's lease; revoking it would end holds the tenant
    /// could never touch.
    pub async fn revoke_lease_in(&self, lease: i64, namespace: &str) -> Result<Revoked, LockError> {
        let Some(attached) = self.0.lease_keys(lease).await? else {
            return Ok(Revoked::Gone);
        };
        let own = keys::queue_root(Some(namespace));
        if let Some(foreign) = attached.iter().find(|k| !k.starts_with(own.as_bytes())) {
            return Ok(Revoked::Foreign(String::from_utf8_lossy(foreign).into()));
        }
        self.0.lease_revoke(lease).await?;
        Ok(Revoked::Revoked)
    }
}
