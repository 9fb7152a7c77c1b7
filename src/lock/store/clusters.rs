//! Locks shared by several clusters (docs/operator.md, "Locks shared by several clusters"):
//! each cluster's operator, named by `--cluster-name`, declares the lock from its own
//! DistributedLock, on one lock etcd. Three rules keep them from undoing each other's work:
//!
//! - **Declarations are recorded.** A named cluster that declares a lock puts a key of its own
//!   under the lock's declarations (no namespace's role can read it).
//! - **One publisher.** The settings record the cluster that published them. An operator
//!   writes them only when etcd has none, or they are its own or unowned (empty: a single
//!   cluster's, or left by a cluster that withdrew); the others mirror them as they are, so two
//!   operators whose specs differ never rewrite each other in turn.
//! - **Withdrawal ends only one's own holds.** A cluster whose DistributedLock is deleted
//!   ends its own pods' holds and waits and removes its declaration. The lock itself (settings
//!   and queue) goes only when no other cluster declares it or has a key in it; otherwise its
//!   settings stay, unowned if they were the withdrawing cluster's, for another to adopt.

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, Txn, TxnOp};

use super::changes::QueueEntry;
use crate::lock::error::LockError;
use crate::lock::etcd::{self, Etcd};
use crate::lock::protocol::keys;
use crate::lock::protocol::names::LockId;
use crate::lock::txn::multi_lock;
use crate::lock::txn::settings::{Declared, encode, publisher, retire};

/// Whether the operator of `cluster` may write settings whose publisher is `publisher`.
pub fn may_publish(publisher: &str, cluster: &str) -> bool {
    publisher.is_empty() || publisher == cluster
}

/// Records that the named `cluster` declares `lock` (nothing for an unnamed one), unless it
/// is recorded already; one request.
pub async fn declare(etcd: &Etcd, lock: &LockId, cluster: &str) -> Result<(), LockError> {
    if cluster.is_empty() {
        return Ok(());
    }
    let key = format!("{}{cluster}", lock.declared_prefix());
    let absent = Compare::create_revision(key.as_str(), CompareOp::Equal, 0);
    etcd.txn(Txn::new().when([absent]).and_then([TxnOp::put(key, "", None)]))
        .await?;
    Ok(())
}

/// What `withdraw` did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Withdrawn {
    /// How many keys of the withdrawing cluster's pods (holds and waits) it ended.
    pub ended: i64,
    /// Whether the lock is gone from etcd.
    pub removed: bool,
    /// Else, the other clusters that still declare it or queue on it.
    pub others: Vec<String>,
}

/// How many times a withdrawal is tried while the lock changes under it.
const ATTEMPTS: usize = 8;

/// Withdraws `cluster` from `lock` (see the module's rules). Each step is guarded, so that a
/// key enqueued or a declaration made meanwhile is never removed unseen: a changed lock is read
/// again. Once its own part is withdrawn it reads the lock once more: if the other clusters
/// withdrew meanwhile (two at once, each seeing the other's declaration), the last one out
/// removes the lock. `None`: it kept changing, [`ATTEMPTS`] times.
pub async fn withdraw(etcd: &Etcd, lock: &LockId, cluster: &str) -> Result<Option<Withdrawn>, LockError> {
    let mut ended = 0;
    let mut left: Option<Vec<String>> = None;
    for _ in 0..ATTEMPTS {
        let read = Read::of(etcd, lock).await?;
        let (own, others) = read.split(cluster);
        let settings_rev = read.declared.as_ref().map_or(0, |d| d.revision);
        let unchanged = Compare::mod_revision(lock.config_key(), CompareOp::Equal, settings_rev);
        let publisher = read.declared.as_ref().map(|d| publisher(&d.value));
        if others.is_empty() && publisher.as_deref().is_none_or(|p| may_publish(p, cluster)) {
            let epoch = read.declared.as_ref().map_or(0, |d| d.settings.epoch);
            if remove_lock(etcd, lock, (unchanged, epoch), read.revision).await? {
                let ended = ended + own.len() as i64;
                return Ok(Some(Withdrawn {
                    ended,
                    removed: true,
                    others,
                }));
            }
            continue;
        }
        if own.is_empty() && left.as_ref() == Some(&others) {
            return Ok(Some(Withdrawn {
                ended,
                removed: false,
                others,
            }));
        }
        ended += end_own(etcd, &own).await?;
        if etcd
            .txn(leave(lock, cluster, &read, publisher.as_deref(), unchanged))
            .await?
            .succeeded()
        {
            left = Some(others);
        }
    }
    Ok(None)
}

/// Ends `own` keys together; returns how many it ended.
async fn end_own(etcd: &Etcd, own: &[&QueueEntry]) -> Result<i64, LockError> {
    let tickets: Vec<_> = own.iter().map(|e| e.ticket()).collect();
    let ended = multi_lock::end_together(etcd, &tickets).await?;
    Ok(ended.into_iter().filter(|e| *e).count() as i64)
}

/// The transaction that takes `cluster`'s declaration off `lock` and, if `cluster` published
/// its settings, leaves them unowned for another to adopt; guarded by the settings being
/// `unchanged` (else someone else published them, and they stay theirs).
fn leave(lock: &LockId, cluster: &str, read: &Read, publisher: Option<&str>, unchanged: Compare) -> Txn {
    let mine = format!("{}{cluster}", lock.declared_prefix());
    let mut ops = vec![TxnOp::delete(mine, None)];
    if let Some(declared) = read.declared.as_ref().filter(|_| publisher == Some(cluster)) {
        let unowned = encode(&declared.settings, "");
        ops.push(TxnOp::put(lock.config_key(), unowned, None));
    }
    Txn::new().when([unchanged]).and_then(ops)
}

/// Removes the lock's settings, queue, declarations, release notes and release receipts,
/// keeping its token `epoch` (see [`retire`]), if its settings are `unchanged` and no key was
/// enqueued, nor declaration made, after `revision` (when they were read); returns whether it
/// did.
async fn remove_lock(
    etcd: &Etcd,
    lock: &LockId,
    (unchanged, epoch): (Compare, u32),
    revision: i64,
) -> Result<bool, LockError> {
    let (queue, declared) = (lock.queue_prefix(), lock.declared_prefix());
    let none_newer =
        |prefix: &str| Compare::create_revision(prefix, CompareOp::Less, revision + 1).with_prefix();
    let all = || Some(DeleteOptions::new().with_prefix());
    let mut ops = vec![
        TxnOp::delete(lock.config_key(), None),
        TxnOp::delete(queue.as_str(), all()),
        TxnOp::delete(declared.as_str(), all()),
        TxnOp::delete(keys::release_notes_prefix(lock), all()),
        TxnOp::delete(lock.receipts_prefix(), all()),
    ];
    ops.extend(retire(lock, epoch));
    let txn = Txn::new()
        .when([unchanged, none_newer(&queue), none_newer(&declared)])
        .and_then(ops);
    Ok(etcd.txn(txn).await?.succeeded())
}

/// A lock's settings, queue and declarations, read in one transaction.
struct Read {
    declared: Option<Declared>,
    queue: Vec<QueueEntry>,
    clusters: Vec<KeyValue>,
    revision: i64,
}

impl Read {
    async fn of(etcd: &Etcd, lock: &LockId) -> Result<Read, LockError> {
        let prefix = || Some(GetOptions::new().with_prefix());
        let resp = (etcd)
            .txn(Txn::new().and_then([
                TxnOp::get(lock.config_key(), None),
                TxnOp::get(lock.queue_prefix(), prefix()),
                TxnOp::get(lock.declared_prefix(), prefix()),
            ]))
            .await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut gets = etcd::gets(resp.op_responses());
        let mut next = || gets.next().expect("three reads").take_kvs();
        let (config, queue, clusters) = (next(), next(), next());
        Ok(Read {
            declared: config.first().map(Declared::from_kv).transpose()?,
            queue: queue.iter().filter_map(QueueEntry::of).collect(),
            clusters,
            revision,
        })
    }

    /// `cluster`'s own queue keys (its pods', and keys no cluster claims: not entries), and
    /// the other clusters that declare the lock or queue on it.
    fn split(&self, cluster: &str) -> (Vec<&QueueEntry>, Vec<String>) {
        let (own, theirs): (Vec<_>, Vec<_>) = self
            .queue
            .iter()
            .partition(|e| e.entry.as_ref().is_none_or(|e| e.pod.cluster == cluster));
        let queued = theirs
            .iter()
            .filter_map(|e| e.entry.as_ref())
            .map(|e| e.pod.cluster.clone());
        let declaring =
            (self.clusters.iter()).filter_map(|kv| kv.key_str().ok()?.rsplit('/').next().map(String::from));
        let mut others: Vec<String> = queued.chain(declaring).filter(|c| c != cluster).collect();
        others.sort();
        others.dedup();
        (own, others)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unowned_or_own_settings_may_be_written() {
        assert!(may_publish("", "east"));
        assert!(may_publish("east", "east"));
        assert!(!may_publish("west", "east"));
        assert!(!may_publish("west", ""));
    }
}
