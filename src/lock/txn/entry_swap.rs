//! The writes of a holder's entry after its enqueue: its owner's record of the grant
//! (`acquiredAt`), and an administrator's yield request (`podlock.io/yield`), which the
//! operator writes. Each is a compare-and-swap on the key's mod revision that keeps what the
//! other wrote: a record never erases a request, a request never erases a record (the
//! protocol model's run "yield requests", and its bug "the grant's record over a yield
//! request"). Both keep the key's create revision (its place and its token) and its lease.
//!
//! A record is usually the first write since the enqueue: its compare then holds at once,
//! one request. One after a handoff, or after a request, reads the entry in the same
//! transaction and writes again.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::queue::Ticket;
use crate::lock::error::{LockError, Unavailable};
use crate::lock::etcd::Etcd;
use crate::lock::protocol::entry::Entry;

/// How many times a write compares again after the entry changed under it.
const ATTEMPTS: u32 = 8;

/// What a compare-and-swap of an entry came to.
enum Swap {
    /// Written.
    Done,
    /// The key is gone, or holds something other than a sidecar's entry.
    Gone,
    /// The entry changed: it is now this, at this mod revision.
    Changed(Box<Entry>, i64),
}

/// Records that a waiter became a holder: writes `entry` (with `acquiredAt`) as its key's
/// value, keeping a yield request the key carries. This write is also what wakes the next
/// waiter of a semaphore. Returns false if the key is no longer ours.
pub async fn mark_acquired(etcd: &Etcd, ticket: &Ticket, entry: &Entry) -> Result<bool, LockError> {
    let (mut entry, mut modrev) = (entry.clone(), ticket.revision);
    for _ in 0..ATTEMPTS {
        match swap(etcd, ticket, modrev, &entry).await? {
            Swap::Done => return Ok(true),
            Swap::Gone => return Ok(false),
            Swap::Changed(now, rev) => (entry.yield_deadline, modrev) = (now.yield_deadline, rev),
        }
    }
    Err(kept_changing())
}

/// Asks the holder at `ticket` to yield by `by` (RFC 3339, as `rfc3339` writes it), keeping
/// everything else its entry says. A request made again never moves a deadline later.
/// Returns the deadline in force, or `None` if the key is gone.
pub async fn ask_to_yield(etcd: &Etcd, ticket: &Ticket, by: &str) -> Result<Option<String>, LockError> {
    let mut read = current(etcd, ticket).await?;
    for _ in 0..ATTEMPTS {
        let Some((mut entry, modrev)) = read else {
            return Ok(None);
        };
        // Same format, so the earlier time sorts first.
        if let Some(sooner) = entry.yield_deadline.as_ref().filter(|d| d.as_str() <= by) {
            return Ok(Some(sooner.clone()));
        }
        entry.yield_deadline = Some(by.into());
        read = match swap(etcd, ticket, modrev, &entry).await? {
            Swap::Done => return Ok(entry.yield_deadline),
            Swap::Gone => None,
            Swap::Changed(now, rev) => Some((*now, rev)),
        };
    }
    Err(kept_changing())
}

/// The entry at `ticket`'s key and its mod revision, if the key is still ours.
pub(crate) async fn current(etcd: &Etcd, ticket: &Ticket) -> Result<Option<(Entry, i64)>, LockError> {
    let resp = etcd.get(ticket.key.as_str(), None).await?;
    let kv = resp
        .kvs()
        .first()
        .filter(|kv| kv.create_revision() == ticket.revision);
    Ok(kv.and_then(|kv| Some((Entry::decode(kv.value())?, kv.mod_revision()))))
}

/// Writes `entry` at `ticket`'s key if the key is still ours at mod revision `modrev`; else
/// reads what is there, in the same transaction.
async fn swap(etcd: &Etcd, ticket: &Ticket, modrev: i64, entry: &Entry) -> Result<Swap, LockError> {
    let key = ticket.key.as_str();
    let guards = [
        Compare::create_revision(key, CompareOp::Equal, ticket.revision),
        Compare::mod_revision(key, CompareOp::Equal, modrev),
    ];
    let put = TxnOp::put(key, entry.encode(), Some(PutOptions::new().with_ignore_lease()));
    let txn = Txn::new()
        .when(guards)
        .and_then([put])
        .or_else([TxnOp::get(key, None)]);
    let resp = etcd.txn(txn).await?;
    if resp.succeeded() {
        return Ok(Swap::Done);
    }
    let Some(TxnOpResponse::Get(got)) = resp.op_responses().into_iter().next() else {
        unreachable!("the read of a failed swap");
    };
    let kv = got
        .kvs()
        .first()
        .filter(|kv| kv.create_revision() == ticket.revision);
    Ok(
        match kv.and_then(|kv| Some((Entry::decode(kv.value())?, kv.mod_revision()))) {
            Some((now, rev)) => Swap::Changed(Box::new(now), rev),
            None => Swap::Gone,
        },
    )
}

/// The error of a write whose entry changed under it [`ATTEMPTS`] times in a row.
fn kept_changing() -> LockError {
    Unavailable::EntryChanging(ATTEMPTS).into()
}
