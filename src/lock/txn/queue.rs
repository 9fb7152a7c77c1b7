//! The FIFO queue behind every lock: the algorithm of etcd's `concurrency.Mutex`, extended to
//! semaphores without a thundering herd.
//!
//! A contender puts one key under the lock's queue prefix, bound to its lease. Keys ordered by
//! create revision form the queue; the first `max_holders` hold the lock. A waiter with `c`
//! keys ahead of it watches only what can change its own position:
//!
//! * `c == max_holders` (first waiter), or too few permits left for its own by the `c` keys
//!   ahead of it (a weighted semaphore): every one of them, for deletion; a release may let
//!   it in.
//! * `c > max_holders`: its immediate predecessor, for deletion, and for semaphores also for
//!   the write a waiter makes when it becomes a holder ([`mark_acquired`]). Without that write
//!   the second waiter would sleep on after the first one got in, a lost wake-up.
//!
//! A release thus wakes one waiter, plus one more in a semaphore, whatever the queue length.
//! Watches start at the current revision, checked to be served at once where the turn is near,
//! and the changes since the position was read are covered ([`wait`](crate::lock::acquire::wait)), so no change
//! is missed and a near turn does not wait for etcd's catch-up loop.

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse,
};

use super::settings::Declared;
use crate::lock::bugs::{self, Bug};
use crate::lock::error::LockError;
use crate::lock::etcd::{self, Etcd, Sent};
use crate::lock::protocol::entry::{Entry, HolderInfo};
use crate::lock::protocol::names::LockId;
use crate::lock::protocol::{self, Ahead, Ask, Mode, Position, Queued, Standing};

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
    /// The key is in the queue, where `standing` says (read in the same transaction; `None`
    /// for a key found already in place, sent again, which a read places).
    Placed {
        ticket: Ticket,
        standing: Option<Standing>,
    },
    /// The lock's settings changed since they were read: here is the new value (`None`:
    /// deleted) with its mod revision.
    SettingsChanged(Option<etcd_client::KeyValue>),
    /// The key is taken by an earlier request of the same holder that no acquire tracks (being
    /// removed, or a late copy of an enqueue applied after its acquire ended): remove this
    /// ticket, then enqueue again.
    Stale(Ticket),
}

/// Puts `entry` at `key` (bound to `lease`) if the lock's settings are still `declared` (the
/// same mod revision and value; revision 0: undeclared), in one transaction that also reads the keys right
/// ahead of it, so that where it stands needs no second request. An existing key keeps its
/// place if it is this request's own (sent again: the same value); another one is an earlier
/// request's ([`Enqueued::Stale`]): taking it over would hand out a grant whose key a pending
/// removal then deletes.
pub async fn enqueue(
    etcd: &Etcd,
    lock: &LockId,
    key: &str,
    entry: &Entry,
    lease: i64,
    declared: &Declared,
) -> Sent<Enqueued> {
    let value = entry.encode();
    let max_holders = declared.settings.max_holders;
    let (ahead, values) = protocol::keys_needed(max_holders, entry.mode);
    let txn = enqueue_txn(lock, key, &value, lease, declared, (ahead, values));
    let sent = etcd.txn_counting(txn).await;
    sent.map(|resp| enqueued(resp, key, &value, lease, (max_holders, entry.ask())))
}

/// The enqueue transaction: if the settings are unchanged, put the key unless it exists and
/// read the tail of the queue from it (the key and `ahead` keys before it, with their
/// `values` or not); else read the settings.
fn enqueue_txn(
    lock: &LockId,
    key: &str,
    value: &[u8],
    lease: i64,
    declared: &Declared,
    (ahead, values): (u32, bool),
) -> Txn {
    let config = lock.config_key();
    // A key put by this transaction has the queue's highest create revision: newest first,
    // the tail is that key and the keys right ahead of it.
    let mut tail = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(i64::from(ahead) + 1);
    if !values {
        tail = tail.with_keys_only();
    }
    let put = etcd_client::PutOptions::new().with_lease(lease);
    let place = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(key, value.to_vec(), Some(put)),
            TxnOp::get(lock.queue_prefix(), Some(tail)),
        ])
        .or_else([TxnOp::get(key, None)]);
    Txn::new()
        .when(declared.unchanged(config.as_str()))
        .and_then([TxnOp::txn(place)])
        .or_else([TxnOp::get(config.as_str(), None)])
}

impl Enqueued {
    /// The key this enqueue placed, if it did (for [`detached`](crate::lock::life::detached) to remove).
    pub fn placed(self) -> Vec<Ticket> {
        match self {
            Enqueued::Placed { ticket, .. } => vec![ticket],
            _ => vec![],
        }
    }
}

/// What the enqueue transaction's answer says.
fn enqueued(
    resp: TxnResponse,
    key: &str,
    value: &[u8],
    lease: i64,
    (max_holders, ask): (u32, Ask),
) -> Enqueued {
    let at = resp.header().map_or(0, |h| h.revision());
    let mut ops = resp.op_responses().into_iter();
    if !resp.succeeded() {
        let Some(TxnOpResponse::Get(mut get)) = ops.next() else {
            unreachable!("one get")
        };
        return Enqueued::SettingsChanged(get.take_kvs().pop());
    }
    let Some(TxnOpResponse::Txn(inner)) = ops.next() else {
        unreachable!("nested txn")
    };
    let put = inner.succeeded();
    let Some(get) = etcd::gets(inner.op_responses()).next() else {
        unreachable!("one get")
    };
    let (mine, ahead) = get.kvs().split_first().expect("the key was just put or found");
    debug_assert_eq!(mine.key(), key.as_bytes());
    let ticket = Ticket {
        key: key.into(),
        revision: mine.create_revision(),
        lease,
    };
    if put {
        let at_place = of_keys(ahead, get.more(), max_holders, ask);
        let standing = Standing {
            recording: recording(ahead, &at_place),
            position: at_place,
            revision: at,
            queued: get.count(),
            chain: vec![], // nobody is behind a key just put
        };
        return Enqueued::Placed {
            ticket,
            standing: Some(standing),
        };
    }
    if mine.value() != value {
        return Enqueued::Stale(ticket);
    }
    Enqueued::Placed {
        ticket,
        standing: None,
    }
}

/// Records that a waiter became a holder: writes `acquiredAt` into its entry, keeping its
/// lease. This write is also what wakes the next waiter of a semaphore. Returns false if the
/// key is no longer ours.
///
/// Guarded by the key's create revision and by its version being at most 2. An entry is
/// written at most once before its record: its enqueue (version 1) and, perhaps, the release
/// that handed it its grant (version 2, only onto an entry untouched since its enqueue). The
/// operator writes a yield request only into a recorded entry, so an entry asked to yield is
/// at version 3 or more, and a copy of this request that reaches etcd late (the hedge sent it
/// again, or a retry after an answer was lost) cannot erase the request (issue #54, F2): at
/// most it puts the same record again over the copy that landed first. Where the guard fails,
/// the same transaction reads the entry, to tell a grant recorded already from a key gone.
pub async fn mark_acquired(etcd: &Etcd, ticket: &Ticket, entry: &Entry) -> Result<bool, LockError> {
    let resp = etcd.txn(record_txn(ticket, &entry.encode())).await?;
    Ok(recorded(resp, ticket))
}

/// The highest version of an entry its grant record may write over: its enqueue, and the
/// handoff's write of its grant.
const UNRECORDED: i64 = 2;

/// The record's transaction: put `value` at `ticket`'s key if it still has its create
/// revision and no more than its enqueue and a handoff wrote it; else read the key.
fn record_txn(ticket: &Ticket, value: &[u8]) -> Txn {
    let key = ticket.key.as_str();
    let put = etcd_client::PutOptions::new().with_lease(ticket.lease);
    Txn::new()
        .when([
            Compare::create_revision(key, CompareOp::Equal, ticket.revision),
            Compare::version(key, CompareOp::Less, UNRECORDED + 1),
        ])
        .and_then([TxnOp::put(key, value.to_vec(), Some(put))])
        .or_else([TxnOp::get(key, None)])
}

/// Whether the answer of [`record_txn`] for `ticket` says the grant is recorded: by this
/// copy, or already (the entry is written past its record's guard, and records its grant).
fn recorded(resp: TxnResponse, ticket: &Ticket) -> bool {
    if resp.succeeded() {
        return true;
    }
    let kv = etcd::gets(resp.op_responses())
        .next()
        .and_then(|mut get| get.take_kvs().pop())
        .filter(|kv| kv.create_revision() == ticket.revision);
    kv.and_then(|kv| Entry::decode(kv.value()))
        .is_some_and(|e| e.is_granted())
}

/// Whether `ticket`'s key is still in place (same create revision).
pub async fn is_ours(etcd: &Etcd, ticket: &Ticket) -> Result<bool, LockError> {
    let resp = etcd.get(ticket.key.as_str(), None).await?;
    Ok(resp.kvs().first().map(|kv| kv.create_revision()) == Some(ticket.revision))
}

/// Deletes `ticket`'s key if it is still the same key (same create revision), so that a late
/// or retried release never deletes a newer hold. Returns whether it deleted.
pub async fn remove(etcd: &Etcd, ticket: &Ticket) -> Result<bool, LockError> {
    if_still_ours(etcd, ticket, [TxnOp::delete(ticket.key.as_str(), None)]).await
}

/// Deletes `ticket`'s key like [`remove`] and, in the same transaction, puts `note` (why it
/// was deleted, for the key's owner to read when it sees the deletion).
pub async fn remove_noting(etcd: &Etcd, ticket: &Ticket, note: TxnOp) -> Result<bool, LockError> {
    let ops = vec![TxnOp::delete(ticket.key.as_str(), None), note];
    if_still_ours(etcd, ticket, ops).await
}

/// The transaction of [`remove`], to run among others in one revision.
pub fn removal(ticket: &Ticket) -> Txn {
    still_ours(ticket, [TxnOp::delete(ticket.key.as_str(), None)])
}

/// Runs `ops` only while `ticket`'s key still has its create revision; returns whether they ran.
async fn if_still_ours(etcd: &Etcd, ticket: &Ticket, ops: impl Into<Vec<TxnOp>>) -> Result<bool, LockError> {
    Ok(etcd.txn(still_ours(ticket, ops)).await?.succeeded())
}

/// `ops`, guarded by `ticket`'s key still having its create revision.
fn still_ours(ticket: &Ticket, ops: impl Into<Vec<TxnOp>>) -> Txn {
    let ours = Compare::create_revision(ticket.key.as_str(), CompareOp::Equal, ticket.revision);
    Txn::new().when([ours]).and_then(ops)
}

/// A lock's queue as it stands: holders in acquisition order and the number of waiters.
#[derive(Debug, Clone, Default)]
pub struct QueueState {
    /// The first `max_holders` entries.
    pub holders: Vec<HolderInfo>,
    /// How many entries wait behind them.
    pub waiters: usize,
}

/// Splits a queue range (sorted by create revision) into holders and waiters by the one rule
/// of who holds ([`protocol::holders`]).
pub fn split_queue(kvs: &[etcd_client::KeyValue], max_holders: u32) -> QueueState {
    let entries = decode(kvs);
    let held = held(&entries, max_holders);
    QueueState {
        waiters: kvs.len().saturating_sub(held),
        holders: entries.into_iter().take(held).filter_map(|(h, _)| h).collect(),
    }
}

/// How many of `entries`' leading keys hold, by [`protocol::holders`].
pub(in crate::lock) fn held<T>(entries: &[(T, Queued)], max_holders: u32) -> usize {
    let queue: Vec<Queued> = entries.iter().map(|(_, q)| *q).collect();
    protocol::holders(&queue, max_holders)
}

/// The keys of a queue range in its order, each as holders are shown (`None`: not an entry,
/// or a revision no token carries) and as the rule of who holds reads it.
pub(in crate::lock) fn decode(kvs: &[etcd_client::KeyValue]) -> Vec<(Option<HolderInfo>, Queued)> {
    decode_with(kvs, |_, _| ()).0
}

/// [`decode`], and `more` of each key and its entry, from the one decoding of its value.
pub(in crate::lock) fn decode_with<T>(
    kvs: &[etcd_client::KeyValue],
    more: impl Fn(&etcd_client::KeyValue, Option<&Entry>) -> T,
) -> (Vec<(Option<HolderInfo>, Queued)>, Vec<T>) {
    (kvs.iter())
        .map(|kv| {
            let entry = Entry::decode(kv.value());
            let (q, extra) = (Queued::of(entry.as_ref()), more(kv, entry.as_ref()));
            ((entry.and_then(|e| e.holder(kv.create_revision())), q), extra)
        })
        .unzip()
}

/// A lock's settings and the head of its queue, read at one etcd revision.
pub struct LockRead {
    /// Its settings; `None` when etcd does not have them.
    pub declared: Option<Declared>,
    /// The create revision of its settings key (0: absent): a lock deleted and declared
    /// again has new settings under a new create revision.
    pub created: i64,
    /// Its queue keys in queue order: the first `head` of them, or all.
    pub queue: Vec<etcd_client::KeyValue>,
    /// Whether more keys follow those read.
    pub more: bool,
    /// etcd's revision of the read.
    pub revision: i64,
}

/// Reads `lock`'s settings and its queue (the first `head` keys; all when `None`) in one
/// transaction: one etcd request, linearizable (etcd serves a read-only transaction after
/// confirming its leadership, like a range), both at one revision.
pub async fn read_lock(etcd: &Etcd, lock: &LockId, head: Option<u32>) -> Result<LockRead, LockError> {
    let order = match head {
        Some(n) => queue_order().with_limit(i64::from(n)),
        None => queue_order(),
    };
    let resp = (etcd)
        .txn(Txn::new().and_then([
            TxnOp::get(lock.config_key(), None),
            TxnOp::get(lock.queue_prefix(), Some(order)),
        ]))
        .await?;
    let revision = resp.header().map_or(0, |h| h.revision());
    let mut gets = etcd::gets(resp.op_responses());
    let (config, mut queue) = (gets.next().expect("config"), gets.next().expect("queue"));
    let declared = config.kvs().first().map(Declared::from_kv).transpose()?;
    Ok(LockRead {
        declared,
        created: config.kvs().first().map_or(0, KeyValue::create_revision),
        more: queue.more(),
        queue: queue.take_kvs(),
        revision,
    })
}

/// Options to read a whole queue in order.
fn queue_order() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
}

impl Ahead {
    /// A key as read from etcd. A value that is not an entry (or a key read without its value)
    /// blocks nobody and counts as exclusive.
    fn of(kv: &KeyValue) -> Self {
        match Entry::decode(kv.value()) {
            Some(e) => Ahead {
                key: kv.key().to_vec(),
                granted: e.is_granted()
                    || bugs::on(Bug::GrantPastUngranted)
                    || (e.handed && bugs::on(Bug::HandedCountsAsGranted)),
                mode: seen(e.ask()).mode,
                permits: seen(e.ask()).permits,
            },
            None => Ahead::without_value(kv.key().to_vec()),
        }
    }
}

/// The position of a key asking `ask` with `ahead` before it, read from etcd nearest first (as
/// many as [`protocol::keys_needed`] says); `more` if further keys are ahead of those.
pub(in crate::lock) fn of_keys(ahead: &[KeyValue], more: bool, max_holders: u32, ask: Ask) -> Position {
    let ahead: Vec<Ahead> = (ahead.iter().map(Ahead::of))
        .filter(|a| a.granted || !bugs::on(Bug::SmallerPasses))
        .collect();
    protocol::position(&ahead, more, max_holders, seen(ask))
}

/// What a key asks, as the rule sees it: as it asks, but with the bugs that count permits as
/// one or every key as exclusive (`bugs.rs`).
fn seen(ask: Ask) -> Ask {
    Ask {
        mode: if bugs::on(Bug::IgnoreModes) {
            Mode::Exclusive
        } else {
            ask.mode
        },
        permits: if bugs::on(Bug::CountNotWeight) {
            1
        } else {
            ask.permits
        },
    }
}

/// Whether the key `pos` waits behind, if it is [`Position::BehindUngranted`], is a grant
/// being recorded: found among `ahead` (read with values) and not a multi-lock key.
pub(in crate::lock) fn recording(ahead: &[KeyValue], pos: &Position) -> bool {
    let Position::BehindUngranted(key) = pos else {
        return false;
    };
    let entry = ahead.iter().find(|kv| kv.key() == key.as_slice());
    entry
        .and_then(|kv| Entry::decode(kv.value()))
        .is_some_and(|e| e.with.is_empty())
}

/// The read of where `ticket` (asking `ask`) stands in a lock of `max_holders` slots: its own
/// key, the settings and the keys ahead of it that decide its position
/// ([`protocol::keys_needed`]), then `behind` (a waiter that may be handed its grant reads the
/// keys behind it, its chain).
pub fn position_read(
    lock: &LockId,
    (ticket, ask): (&Ticket, Ask),
    max_holders: u32,
    behind: Option<TxnOp>,
) -> Txn {
    let (needed, values) = protocol::keys_needed(max_holders, ask.mode);
    let mut ahead = GetOptions::new()
        .with_prefix()
        .with_max_create_revision(ticket.revision - 1)
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(needed.into());
    if !values {
        ahead = ahead.with_keys_only();
    }
    let ops = [
        TxnOp::get(ticket.key.as_str(), None),
        TxnOp::get(lock.config_key(), None),
        TxnOp::get(lock.queue_prefix(), Some(ahead)),
    ];
    Txn::new().and_then(ops.into_iter().chain(behind).collect::<Vec<_>>())
}
