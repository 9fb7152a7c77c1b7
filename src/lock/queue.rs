//! The FIFO queue behind every lock: the algorithm of etcd's `concurrency.Mutex`, extended to
//! semaphores without a thundering herd.
//!
//! A contender puts one key under the lock's queue prefix, bound to its lease. Keys ordered by
//! create revision form the queue; the first `max_holders` hold the lock. A waiter with `c`
//! keys ahead of it watches only what can change its own position:
//!
//! * `c == max_holders` (first waiter): every holder, for deletion; any release lets it in.
//! * `c > max_holders`: its immediate predecessor, for deletion, and for semaphores also for
//!   the write a waiter makes when it becomes a holder ([`mark_acquired`]). Without that write
//!   the second waiter would sleep on after the first one got in, a lost wake-up.
//!
//! A release thus wakes one waiter, plus one more in a semaphore, whatever the queue length.
//! Watches start at the current revision and the position is re-read once they are in place, so
//! no change is missed and no watch waits in etcd's catch-up loop.

use etcd_client::{
    Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchFilterType,
};
use tokio::time::{Instant, timeout_at};
use tracing::warn;

use super::LockError;
use super::etcd::Etcd;
use super::keys::{Entry, HolderInfo, LockId};

/// A contender's key in a queue.
#[derive(Debug, Clone)]
pub struct Ticket {
    /// The queue key.
    pub key: String,
    /// Its create revision: the queue position and, once held, the fencing token.
    pub revision: i64,
    /// The lease it is bound to.
    pub lease: i64,
}

/// The outcome of putting a key into a queue.
pub enum Enqueued {
    /// The key is in the queue; `held` says whether it is among the first `max_holders` at
    /// revision `at`.
    Placed { ticket: Ticket, held: bool, at: i64 },
    /// The lock's settings changed since they were read: here is the new value (`None`:
    /// deleted) with its mod revision.
    SettingsChanged(Option<etcd_client::KeyValue>),
}

/// Where a ticket stands.
#[derive(Debug, PartialEq, Eq)]
enum Position {
    Holder,
    Gone,
    FirstWaiter(Vec<Vec<u8>>),
    Waiter(Vec<u8>),
}

/// Puts `entry` at `key` (bound to `lease`) if the lock's settings still have `settings_rev`
/// as their mod revision (0: undeclared), in one transaction that also reads the holders.
/// An existing key keeps its place if it is this request's own (sent again: the same value).
/// Another one is an earlier request's of the same holder, which is being removed: taking it
/// over would hand out a grant whose key that removal then deletes, so this fails (retry).
pub async fn enqueue(
    etcd: &Etcd,
    lock: &LockId,
    key: &str,
    entry: &Entry,
    lease: i64,
    settings_rev: i64,
    max_holders: u32,
) -> Result<Enqueued, LockError> {
    let config = lock.config_key();
    let head = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(max_holders.into())
        .with_keys_only();
    let value = serde_json::to_vec(entry).expect("entry serializes");
    let txn = Txn::new()
        .when([Compare::mod_revision(
            config.as_str(),
            CompareOp::Equal,
            settings_rev,
        )])
        .and_then([TxnOp::txn(
            Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(
                        key,
                        value.clone(),
                        Some(etcd_client::PutOptions::new().with_lease(lease)),
                    ),
                    TxnOp::get(key, None),
                    TxnOp::get(lock.queue_prefix(), Some(head.clone())),
                ])
                .or_else([TxnOp::get(key, None), TxnOp::get(lock.queue_prefix(), Some(head))]),
        )])
        .or_else([TxnOp::get(config.as_str(), None)]);
    let resp = etcd.txn(txn).await?;
    let mut ops = resp.op_responses().into_iter();
    if !resp.succeeded() {
        let Some(TxnOpResponse::Get(mut get)) = ops.next() else {
            unreachable!("one get")
        };
        return Ok(Enqueued::SettingsChanged(get.take_kvs().pop()));
    }
    let Some(TxnOpResponse::Txn(inner)) = ops.next() else {
        unreachable!("nested txn")
    };
    let gets: Vec<_> = inner
        .op_responses()
        .into_iter()
        .filter_map(|op| {
            if let TxnOpResponse::Get(g) = op {
                Some(g)
            } else {
                None
            }
        })
        .collect();
    let mine = gets[0].kvs().first();
    if !inner.succeeded() && mine.is_some_and(|kv| kv.value() != value.as_slice()) {
        return Err(LockError::Unavailable(
            "this holder's previous request is still leaving the queue; retry".into(),
        ));
    }
    let revision = mine.map_or(0, |kv| kv.create_revision());
    let held = gets[1].kvs().iter().any(|kv| kv.create_revision() == revision);
    Ok(Enqueued::Placed {
        at: resp.header().map_or(0, |h| h.revision()),
        ticket: Ticket {
            key: key.into(),
            revision,
            lease,
        },
        held,
    })
}

/// Reads where `ticket` stands, and the revision of the read.
async fn position(
    etcd: &Etcd,
    prefix: &str,
    ticket: &Ticket,
    max_holders: u32,
) -> Result<(Position, i64), LockError> {
    let ahead = GetOptions::new()
        .with_prefix()
        .with_max_create_revision(ticket.revision - 1)
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(max_holders.into())
        .with_keys_only();
    let resp = etcd
        .txn(Txn::new().and_then([
            TxnOp::get(ticket.key.as_str(), None),
            TxnOp::get(prefix, Some(ahead)),
        ]))
        .await?;
    let rev = resp.header().map_or(0, |h| h.revision());
    let mut gets = resp.op_responses().into_iter().filter_map(|op| match op {
        TxnOpResponse::Get(g) => Some(g),
        _ => None,
    });
    let (mine, ahead) = (gets.next().expect("own key"), gets.next().expect("queue"));
    // Field note: re-check our own key before granting; a waiter's lease may have expired.
    if mine.kvs().first().map(|kv| kv.create_revision()) != Some(ticket.revision) {
        return Ok((Position::Gone, rev));
    }
    let keys: Vec<Vec<u8>> = ahead.kvs().iter().map(|kv| kv.key().to_vec()).collect();
    let pos = if keys.len() < max_holders as usize {
        Position::Holder
    } else if !ahead.more() {
        Position::FirstWaiter(keys)
    } else {
        Position::Waiter(keys.into_iter().next().expect("limit >= 1"))
    };
    Ok((pos, rev))
}

/// How a wait ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Turn {
    /// The ticket is among the first `max_holders` at this revision.
    Granted(i64),
    /// The ticket's key disappeared (lease expired or revoked, key deleted).
    Gone,
    /// The deadline passed first.
    TimedOut,
}

/// Waits until `ticket` holds the lock, its key is gone, or `deadline` passes.
pub async fn wait_turn(
    etcd: &Etcd,
    lock: &LockId,
    ticket: &Ticket,
    max_holders: u32,
    deadline: Instant,
) -> Result<Turn, LockError> {
    let prefix = lock.queue_prefix();
    let (mut pos, mut rev) = position(etcd, &prefix, ticket, max_holders).await?;
    loop {
        let (targets, filters) = match &pos {
            Position::Holder => return Ok(Turn::Granted(rev)),
            Position::Gone => return Ok(Turn::Gone),
            Position::FirstWaiter(holders) => (holders.clone(), vec![WatchFilterType::NoPut]),
            Position::Waiter(pred) if max_holders > 1 => (vec![pred.clone()], vec![]),
            Position::Waiter(pred) => (vec![pred.clone()], vec![WatchFilterType::NoPut]),
        };
        let Ok(watch) = timeout_at(deadline, etcd.watch_keys(&targets, &filters, None)).await else {
            return Ok(Turn::TimedOut);
        };
        let mut watch = watch?;
        // Anything written between our read and the watches' start may have moved us: read again.
        if watch.start_revision != rev {
            let (again, again_rev) = position(etcd, &prefix, ticket, max_holders).await?;
            rev = again_rev;
            if again != pos {
                pos = again;
                continue;
            }
        }
        match timeout_at(deadline, watch.changed()).await {
            Err(_) => return Ok(Turn::TimedOut),
            Ok(Ok(())) => {}
            // A broken watch (etcd restart, leader change) is not fatal: re-read and re-watch.
            // If etcd is really gone, the read below fails and the caller gets the error.
            Ok(Err(e)) => {
                warn!(key = ticket.key, error = %e, "watch broke while waiting; re-reading");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
        (pos, rev) = position(etcd, &prefix, ticket, max_holders).await?;
    }
}

/// Records that a waiter became a holder: writes `acquiredAt` into its entry, keeping its
/// lease. This write is also what wakes the next waiter of a semaphore. Returns false if the
/// key is no longer ours.
pub async fn mark_acquired(etcd: &Etcd, ticket: &Ticket, entry: &Entry) -> Result<bool, LockError> {
    let value = serde_json::to_vec(entry).expect("entry serializes");
    let put = etcd_client::PutOptions::new().with_lease(ticket.lease);
    if_still_ours(etcd, ticket, TxnOp::put(ticket.key.as_str(), value, Some(put))).await
}

/// Whether `ticket`'s key is still in place (same create revision).
pub async fn is_ours(etcd: &Etcd, ticket: &Ticket) -> Result<bool, LockError> {
    let resp = etcd.get(ticket.key.as_str(), None).await?;
    Ok(resp.kvs().first().map(|kv| kv.create_revision()) == Some(ticket.revision))
}

/// Deletes `ticket`'s key if it is still the same key (same create revision), so that a late
/// or retried release never deletes a newer hold. Returns whether it deleted.
pub async fn remove(etcd: &Etcd, ticket: &Ticket) -> Result<bool, LockError> {
    if_still_ours(etcd, ticket, TxnOp::delete(ticket.key.as_str(), None)).await
}

/// Runs `op` only while `ticket`'s key still has its create revision; returns whether it ran.
async fn if_still_ours(etcd: &Etcd, ticket: &Ticket, op: TxnOp) -> Result<bool, LockError> {
    let ours = Compare::create_revision(ticket.key.as_str(), CompareOp::Equal, ticket.revision);
    Ok(etcd
        .txn(Txn::new().when([ours]).and_then([op]))
        .await?
        .succeeded())
}

/// A lock's queue as it stands: holders in acquisition order and the number of waiters.
#[derive(Debug, Clone, Default)]
pub struct QueueState {
    /// The first `max_holders` entries.
    pub holders: Vec<HolderInfo>,
    /// How many entries wait behind them.
    pub waiters: usize,
}

/// Splits a queue range (sorted by create revision) into holders and waiters.
pub fn split_queue(kvs: &[etcd_client::KeyValue], max_holders: u32) -> QueueState {
    let holders: Vec<HolderInfo> = kvs
        .iter()
        .take(max_holders as usize)
        .filter_map(HolderInfo::from_kv)
        .collect();
    QueueState {
        waiters: kvs.len().saturating_sub(max_holders as usize),
        holders,
    }
}

/// Options to read a whole queue in order.
pub fn queue_order() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
}
