//! Release receipts: how a release sent again knows what its first copy did.
//!
//! The hedge (see [`etcd`](crate::lock::etcd)) sends a release once more when its first copy goes
//! unanswered for 500 ms. If that copy was applied and only its answer was late, the copy sent
//! again finds the key gone, as it would for a hold that ended otherwise (its lease expired,
//! the operator revoked it, an administrator released it). Told apart, the first is a release
//! (200) and the others a loss (410); taken alike, a release that succeeded was answered 410.
//!
//! So a release's transaction, as it deletes the key, also puts a *receipt*: the key's create
//! revision, at [`LockId::receipt_key`], bound to the key's lease; and where the key is gone
//! it reads the receipt instead. A receipt naming the key's create revision can only have been
//! put by a release of exactly that key (create revisions are never reused). The receipt lies
//! at a *slot* of its lock and lease that no other release of the sidecar in flight uses (see
//! `engine/receipts.rs`): one per lock and lease, and one more per release in flight beside
//! it, each overwritten only by a release that started after the one that put it was
//! answered. (One per lock and lease, as first built, let another holder id of the same pod
//! releasing the lock within the hedge overwrite it: a release that succeeded was answered
//! 410, issue #54's F5.) Receipts go with the lease, and with their lock's removal: a release
//! answered after its session ended answers 410, the cautious side. The protocol model checks
//! this (its runs "resent releases", "bug: release receipt ignored", "bug: a gone key counts as
//! released", "bug: one receipt per lock and lease").

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::queue::Ticket;
use crate::lock::bugs::{self, Bug};
use crate::lock::error::LockError;
use crate::lock::etcd::Etcd;
use crate::lock::protocol::keys::parse_entry_key;

/// The release of `ticket`'s key: if it still has its create revision, deletes it and puts
/// the receipt at `slot` ([`ops`]); else reads that receipt. See [`released`].
pub fn release(ticket: &Ticket, slot: u32) -> Txn {
    let receipt = receipt_key(ticket, slot); // parsed once: every release builds this
    let ours = Compare::create_revision(ticket.key.as_str(), CompareOp::Equal, ticket.revision);
    let release = (Txn::new().when([ours])).and_then(with_receipt(ticket, vec![], receipt.as_deref()));
    match receipt {
        Some(receipt) => release.or_else([TxnOp::get(receipt, None)]),
        None => release, // not a key the engine writes: no receipt
    }
}

/// What a release that finds `ticket`'s key in place does: deletes it, does `more` (a
/// handoff's grant), and puts the receipt at `slot`.
pub fn ops(ticket: &Ticket, slot: u32, more: Vec<TxnOp>) -> Vec<TxnOp> {
    with_receipt(ticket, more, receipt_key(ticket, slot).as_deref())
}

/// [`ops`], the receipt key given.
fn with_receipt(ticket: &Ticket, more: Vec<TxnOp>, receipt: Option<&str>) -> Vec<TxnOp> {
    let mut ops = vec![TxnOp::delete(ticket.key.as_str(), None)];
    ops.extend(more);
    if let Some(receipt) = receipt {
        let lease = PutOptions::new().with_lease(ticket.lease);
        ops.push(TxnOp::put(receipt, ticket.revision.to_string(), Some(lease)));
    }
    ops
}

/// Whether the answer of [`release`] for `ticket` says the release deleted the key: this copy
/// did, or the receipt names the key's create revision (an earlier copy of it did).
pub fn released(resp: &TxnResponse, ticket: &Ticket) -> bool {
    if resp.succeeded() || bugs::on(Bug::GoneIsReleased) {
        return true;
    }
    if bugs::on(Bug::ReceiptIgnored) {
        return false;
    }
    let receipt = resp.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value().to_vec()),
        _ => None,
    });
    receipt.is_some_and(|value| value == ticket.revision.to_string().as_bytes())
}

/// Releases `ticket`'s key, its receipt at `slot` (see [`release`]); returns whether this
/// release deleted it.
pub async fn remove(etcd: &Etcd, ticket: &Ticket, slot: u32) -> Result<bool, LockError> {
    let resp = etcd.txn(release(ticket, slot)).await?;
    Ok(released(&resp, ticket))
}

/// The receipt key at `slot` of `ticket`'s lock and lease; `None` for a key the engine did
/// not write.
fn receipt_key(ticket: &Ticket, slot: u32) -> Option<String> {
    let (lock, _) = parse_entry_key(&ticket.key)?;
    Some(lock.receipt_key(ticket.lease, slot))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::protocol::keys::{is_queue_key, lock_of_key};
    use crate::lock::protocol::names::LockId;

    #[test]
    fn a_receipt_lies_in_its_namespace_queues_and_in_no_lock_queue() {
        let lock = LockId::new("shop", "db").unwrap();
        let ticket = Ticket {
            key: lock.entry_key(0xab, "web-1"),
            revision: 42,
            lease: 0xab,
        };
        let key = receipt_key(&ticket, 0).unwrap();
        assert_eq!(key, "/podlock/v1/queue/shop/.released/db/00000000000000ab/0");
        assert!(key.starts_with(&lock.receipts_prefix()));
        let other = LockId::new("shop", "d").unwrap();
        assert!(
            !key.starts_with(&other.receipts_prefix()),
            "d's removal takes db's receipts"
        );
        assert!(is_queue_key(key.as_bytes()), "the namespace's role may write it");
        assert!(!key.starts_with(&lock.queue_prefix()), "in db's queue: {key}");
        assert_eq!(lock_of_key(key.as_bytes()), None, "{key} parsed as a lock");
        assert_eq!(parse_entry_key(&key), None, "{key} parsed as an entry");
    }
}
