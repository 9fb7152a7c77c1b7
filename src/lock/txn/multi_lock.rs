//! The etcd transactions of a multi-lock request (see [`multi`](crate::lock::acquire::multi)): its keys put in
//! every queue at one revision, its grant recorded on all of them at once, its keys removed
//! together. Each is one transaction, so a set's keys enter, are granted and leave the queues
//! at one revision, as the protocol model's multi-lock client does.

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::queue::{self, Ticket};
use super::receipt;
use super::settings::Declared;
use crate::lock::error::LockError;
use crate::lock::etcd::{self, Etcd, Sent};
use crate::lock::protocol::entry::Entry;
use crate::lock::protocol::names::LockId;

/// One lock of a set as the request knows it: the lock, its settings as read, and its key.
pub struct Member<'a> {
    /// The lock.
    pub lock: &'a LockId,
    /// Its settings as the request read them: the enqueue and the grant are guarded by them.
    pub declared: &'a Declared,
    /// The request's key in its queue.
    pub key: &'a str,
}

/// The outcome of putting a set's keys into their queues.
pub enum EnqueuedSet {
    /// Every key is in its queue, all with one create revision: the tickets, in set order.
    Placed(Vec<Ticket>),
    /// These locks' settings changed since they were read (by index, with the new value;
    /// `None`: deleted).
    SettingsChanged(Vec<(usize, Option<KeyValue>)>),
    /// Keys of the same holder id already in the way, which no acquire tracks: remove them,
    /// then enqueue again.
    Stale(Vec<Ticket>),
}

/// Puts `entries` (one per member, in set order) at the members' keys, bound to `lease`, in
/// one transaction guarded by every member's settings and every key being absent; else reads
/// the settings and the keys, to say why not. Keys found with exactly these values were put by
/// this very request (sent again): they are placed.
pub async fn enqueue(
    etcd: &Etcd,
    members: &[Member<'_>],
    entries: &[Entry],
    lease: i64,
) -> Sent<EnqueuedSet> {
    let values: Vec<Vec<u8>> = entries.iter().map(Entry::encode).collect();
    let mut guards = vec![];
    let (mut puts, mut reads) = (vec![], vec![]);
    for (m, value) in members.iter().zip(&values) {
        guards.extend(m.declared.unchanged(&m.lock.config_key()));
        guards.push(Compare::create_revision(m.key, CompareOp::Equal, 0));
        puts.push(TxnOp::put(
            m.key,
            value.clone(),
            Some(PutOptions::new().with_lease(lease)),
        ));
        reads.push(TxnOp::get(m.lock.config_key(), None));
        reads.push(TxnOp::get(m.key, None));
    }
    let txn = Txn::new().when(guards).and_then(puts).or_else(reads);
    let sent = etcd.txn_counting(txn).await;
    sent.map(|resp| enqueued(resp, members, &values, lease))
}

/// What the set's enqueue transaction answered.
fn enqueued(resp: TxnResponse, members: &[Member<'_>], values: &[Vec<u8>], lease: i64) -> EnqueuedSet {
    let ticket = |key: &str, revision| Ticket {
        key: key.into(),
        revision,
        lease,
    };
    if resp.succeeded() {
        let at = resp.header().map_or(0, |h| h.revision());
        return EnqueuedSet::Placed(members.iter().map(|m| ticket(m.key, at)).collect());
    }
    let mut gets = etcd::gets(resp.op_responses());
    let (mut changed, mut found) = (vec![], vec![]);
    for (i, m) in members.iter().enumerate() {
        let mut next = || gets.next().expect("two reads a member").take_kvs().pop();
        let (config, key) = (next(), next());
        let same = config.as_ref().map_or(0, KeyValue::mod_revision) == m.declared.revision
            && config
                .as_ref()
                .is_none_or(|kv| kv.value() == &m.declared.value[..]);
        if !same {
            changed.push((i, config));
        }
        found.extend(key.map(|kv| (i, kv)));
    }
    if !changed.is_empty() {
        return EnqueuedSet::SettingsChanged(changed);
    }
    let resent = found.len() == members.len()
        && (found.iter()).all(|(i, kv)| kv.value() == &values[*i][..])
        && (found.iter()).all(|(_, kv)| kv.create_revision() == found[0].1.create_revision());
    let tickets = found
        .iter()
        .map(|(i, kv)| ticket(members[*i].key, kv.create_revision()));
    match resent {
        true => EnqueuedSet::Placed(tickets.collect()),
        false => EnqueuedSet::Stale(tickets.collect()),
    }
}

/// Records the set's grant: writes `entries` (with `acquiredAt`) at the tickets' keys in one
/// transaction, guarded by every key still having its create revision and every member's
/// settings being those its turn was decided under. Returns whether the grant is recorded.
///
/// That guard is what makes the grant sound although each lock's turn was seen at another
/// moment: under unchanged settings a key's admission only grows (keys ahead of it can only
/// go, or record their grants; a new key queues behind it), so at this revision the set is
/// admitted on every lock at once, which is the model's one read of all locks.
///
/// Each key is also guarded by its mod revision being its create revision (a set's key is
/// written by nothing else before its record: no release hands it a grant): a copy of this
/// request that reaches etcd after an earlier one recorded the grant, and after the operator
/// wrote a yield request into an entry, puts nothing (issue #54, F2). Where a guard fails the
/// transaction reads the keys: all of them in place and recorded means an earlier copy of
/// this very request recorded them.
pub async fn record(
    etcd: &Etcd,
    members: &[Member<'_>],
    tickets: &[Ticket],
    entries: &[Entry],
) -> Result<bool, LockError> {
    let mut guards = vec![];
    let (mut puts, mut reads) = (vec![], vec![]);
    for ((m, t), entry) in members.iter().zip(tickets).zip(entries) {
        let key = t.key.as_str();
        guards.push(Compare::create_revision(key, CompareOp::Equal, t.revision));
        guards.push(Compare::mod_revision(key, CompareOp::Equal, t.revision));
        guards.extend(m.declared.unchanged(&m.lock.config_key()));
        let put = PutOptions::new().with_lease(t.lease);
        puts.push(TxnOp::put(key, entry.encode(), Some(put)));
        reads.push(TxnOp::get(key, None));
    }
    let resp = (etcd)
        .txn(Txn::new().when(guards).and_then(puts).or_else(reads))
        .await?;
    Ok(set_recorded(resp, tickets))
}

/// Whether the answer of [`record`] says the set's grant is recorded: by this copy, or by an
/// earlier one (every key in place with its grant recorded).
fn set_recorded(resp: TxnResponse, tickets: &[Ticket]) -> bool {
    if resp.succeeded() {
        return true;
    }
    let found: Vec<Option<KeyValue>> = etcd::gets(resp.op_responses())
        .map(|mut get| get.take_kvs().pop())
        .collect();
    found.len() == tickets.len()
        && (found.iter().zip(tickets)).all(|(kv, t)| {
            kv.as_ref().is_some_and(|kv| {
                kv.create_revision() == t.revision
                    && Entry::decode(kv.value()).is_some_and(|e| e.is_granted())
            })
        })
}

/// How many keys [`end_together`] ends in one transaction: well inside etcd's default
/// `--max-txn-ops` of 128.
const KEYS_PER_TXN: usize = 100;

/// Deletes every ticket's key that still has its create revision, in one transaction (up to
/// [`KEYS_PER_TXN`] keys; more in several, the queue's back first); returns, for each ticket in
/// order, whether this deleted its key. Ended one by one, front first, each ended holder of a
/// queue would admit the next of them for a moment, and its sidecar could answer a grant
/// already gone (a withdrawal, a dead pod's holds and waits); a multi-lock set's keys leave
/// their queues at one revision, as they entered them.
pub async fn end_together(etcd: &Etcd, tickets: &[Ticket]) -> Result<Vec<bool>, LockError> {
    let end = |i: usize| queue::removal(&tickets[i]);
    together(etcd, tickets, end, |removed, _| removed.succeeded()).await
}

/// Runs `end(i)` for every ticket `i` as in [`end_together`]; returns, for each ticket in
/// order, what `ended` reads from its answer.
async fn together(
    etcd: &Etcd,
    tickets: &[Ticket],
    end: impl Fn(usize) -> Txn,
    ended: fn(&TxnResponse, &Ticket) -> bool,
) -> Result<Vec<bool>, LockError> {
    let mut order: Vec<usize> = (0..tickets.len()).collect();
    order.sort_by_key(|&i| tickets[i].revision);
    let mut out = vec![false; tickets.len()];
    for batch in order.rchunks(KEYS_PER_TXN) {
        let ends = batch.iter().map(|&i| TxnOp::txn(end(i)));
        let resp = etcd.txn(Txn::new().and_then(ends.collect::<Vec<_>>())).await?;
        for (&i, op) in batch.iter().zip(resp.op_responses()) {
            out[i] = matches!(op, TxnOpResponse::Txn(answer) if ended(&answer, &tickets[i]));
        }
    }
    Ok(out)
}

/// Deletes the tickets' keys together ([`end_together`]); returns whether all of them were
/// still there (false: one was already gone).
pub async fn remove(etcd: &Etcd, tickets: &[Ticket]) -> Result<bool, LockError> {
    Ok(end_together(etcd, tickets).await?.into_iter().all(|ended| ended))
}

/// Releases a set's keys together, each leaving its release receipt at its slot in `slots`
/// (see [`receipt`](super::receipt)); returns whether this release deleted all of them (an
/// earlier copy of it counts).
pub async fn release(etcd: &Etcd, tickets: &[Ticket], slots: &[u32]) -> Result<bool, LockError> {
    let end = |i: usize| receipt::release(&tickets[i], slots[i]);
    let released = together(etcd, tickets, end, receipt::released).await?;
    Ok(released.into_iter().all(|released| released))
}

impl EnqueuedSet {
    /// The keys this enqueue placed, if it did (for `life/detached.rs` to remove).
    pub(in crate::lock) fn placed(self) -> Vec<Ticket> {
        match self {
            EnqueuedSet::Placed(tickets) => tickets,
            _ => vec![],
        }
    }
}

/// The set's members: each lock with its settings and its key.
pub(in crate::lock) fn members<'a>(
    locks: &'a [LockId],
    declared: &'a [Declared],
    tickets: &'a [Ticket],
) -> Vec<Member<'a>> {
    (locks.iter().zip(declared).zip(tickets))
        .map(|((lock, declared), t)| Member {
            lock,
            declared,
            key: &t.key,
        })
        .collect()
}
