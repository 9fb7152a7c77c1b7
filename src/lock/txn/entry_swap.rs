//! An administrator's yield request (`podlock.io/yield`), written by the operator into a
//! holder's entry: a compare-and-swap on the key's mod revision that keeps everything else the
//! entry says, its create revision (its place and its token) and its lease.
//!
//! The entry's other writes come before it, never after: the enqueue, a release's handoff
//! (only onto an entry untouched since its enqueue), and the owner's record of its grant
//! (`acquiredAt`, a put over the entry, guarded by the entry's version being at most 2, so that a
//! copy of it landing late cannot write over a request, see `queue::mark_acquired`). So the
//! operator asks only a hold whose grant is recorded, waiting a moment for one being recorded (a
//! mutex records after 30 ms), and no later write can erase the request. The protocol model's
//! runs "yield requests" and "yield requests, late records" check it; its bugs "a yield request
//! before the grant's record" (asked earlier) and "a yield request erased by a late record" (the
//! record guarded by create revision only) find the record erasing it.

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use std::time::Duration;
use tokio::time::sleep;

use super::queue::Ticket;
use crate::lock::error::{LockError, Unavailable};
use crate::lock::etcd::Etcd;
use crate::lock::protocol::entry::Entry;

/// How many times the request reads the entry again: after a compare that failed (the entry
/// changed), or while the grant is not recorded yet.
const ATTEMPTS: u32 = 40;

/// How long it waits for a grant's record before reading again.
const RECORD_WAIT: Duration = Duration::from_millis(50);

/// Asks the holder at `ticket` to yield by `by` (RFC 3339, as `rfc3339` writes it), once its
/// grant is recorded. A request made again never moves a deadline later. Returns the deadline
/// in force, or `None` if the key is gone.
pub async fn ask_to_yield(etcd: &Etcd, ticket: &Ticket, by: &str) -> Result<Option<String>, LockError> {
    for _ in 0..ATTEMPTS {
        let Some((mut entry, modrev)) = current(etcd, ticket).await? else {
            return Ok(None);
        };
        if !entry.is_granted() {
            sleep(RECORD_WAIT).await; // its record, on its way, would write over the request
            continue;
        }
        // Same format, so the earlier time sorts first.
        if let Some(sooner) = entry.yield_deadline.as_ref().filter(|d| d.as_str() <= by) {
            return Ok(Some(sooner.clone()));
        }
        entry.yield_deadline = Some(by.into());
        if swap(etcd, ticket, modrev, &entry).await? {
            return Ok(entry.yield_deadline);
        }
    }
    Err(Unavailable::EntryChanging(ATTEMPTS).into())
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

/// Writes `entry` at `ticket`'s key if the key is still ours at mod revision `modrev`;
/// returns whether it did.
async fn swap(etcd: &Etcd, ticket: &Ticket, modrev: i64, entry: &Entry) -> Result<bool, LockError> {
    let key = ticket.key.as_str();
    let guards = [
        Compare::create_revision(key, CompareOp::Equal, ticket.revision),
        Compare::mod_revision(key, CompareOp::Equal, modrev),
    ];
    let put = TxnOp::put(key, entry.encode(), Some(PutOptions::new().with_ignore_lease()));
    Ok(etcd
        .txn(Txn::new().when(guards).and_then([put]))
        .await?
        .succeeded())
}
