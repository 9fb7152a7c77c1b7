//! A hold the operator ends on purpose: an administrator's release (`podlock.io/release` on a
//! DistributedLock), a hold past its maximum hold time whose sidecar did not end it, or one
//! asked to yield (`podlock.io/yield`) and not released by the request's deadline. The
//! operator deletes the hold's key and, in the same transaction, leaves a *note* saying why;
//! the hold's sidecar, seeing its key deleted, reads the note and tells its app `lost` with
//! the note's reason ([`Ending::reason`]) instead of the generic one.
//!
//! The note lives under the namespace's settings prefix (`config/{ns}/.released/...`): that
//! namespace's etcd role may read it but not write it, so a tenant cannot make another pod's
//! loss look like an administrator's. A lock name cannot start with '.', so no lock's settings
//! key is ever there, and every reader of settings keys (which parses the lock name) skips it.
//! It is bound to a lease of its own that ends after [`NOTE_TTL`]: a sidecar reads it within
//! milliseconds of the deletion, and nothing is left behind.

use etcd_client::{PutOptions, TxnOp};
use std::time::Duration;

use super::queue::{self, Ticket};
use crate::lock::error::LockError;
use crate::lock::etcd::Etcd;
use crate::lock::protocol::keys::release_note_key as note_key;
use crate::lock::protocol::names::LockId;

/// Why the operator ended a hold, as its note says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// An administrator's release (`podlock.io/release`).
    Admin,
    /// The hold outlived its maximum hold time (`maxHoldSeconds`).
    Deadline,
    /// The hold was asked to yield (`podlock.io/yield`) and was not released in time.
    Yield,
}

impl Ending {
    /// The reason the hold's `lost` event gives.
    pub fn reason(self) -> &'static str {
        match self {
            Ending::Admin => "an administrator released it (podlock.io/release on its DistributedLock)",
            Ending::Deadline => DEADLINE,
            Ending::Yield => YIELD,
        }
    }

    /// How the note names it (absent: an administrator's, as notes were before deadlines).
    fn code(self) -> Option<&'static str> {
        match self {
            Ending::Admin => None,
            Ending::Deadline => Some(DEADLINE),
            Ending::Yield => Some(YIELD),
        }
    }
}

/// The reason of the `lost` event of a hold that reached its maximum hold time, whoever ended
/// it: its sidecar, or the operator.
pub const DEADLINE: &str = "deadline";

/// The reason of the `lost` event of a hold asked to yield and ended at the request's deadline.
pub const YIELD: &str = "yield";

/// How long a note outlives the deletion it explains.
const NOTE_TTL: u32 = 60;

/// How long a sidecar waits for the note before it reports the loss with the generic reason:
/// the note costs the `lost` event at most this (within the 1 s the contract allows).
pub(crate) const NOTE_READ: Duration = Duration::from_millis(300);

/// Ends the hold at `ticket` (of `holder` in `lock`) for `why`, if its key still has its create
/// revision; returns whether it did.
pub(in crate::lock) async fn release(
    etcd: &Etcd,
    lock: &LockId,
    holder: &str,
    ticket: &Ticket,
    why: Ending,
) -> Result<bool, LockError> {
    let lease = etcd.lease_grant(NOTE_TTL).await?;
    let mut note = serde_json::json!({ "fencingToken": ticket.revision });
    if let Some(code) = why.code() {
        note["ending"] = code.into();
    }
    let note = note.to_string();
    let key = note_key(lock, ticket.lease, holder);
    let put = TxnOp::put(key, note, Some(PutOptions::new().with_lease(lease)));
    // The note's lease is never revoked: with nothing on it (the key was gone) it expires
    // unused, and a `false` may come from a copy of the transaction sent again after an
    // earlier copy deleted the key and left the note (see `etcd`), which the note then tells.
    let released = queue::remove_noting(etcd, ticket, put).await?;
    Ok(released || noted(etcd, lock, holder, ticket).await?.is_some())
}

/// Why the operator deleted `ticket`'s key (of `holder` in `lock`), if it left a note for
/// exactly that hold (the note names its fencing token).
pub(in crate::lock) async fn noted(
    etcd: &Etcd,
    lock: &LockId,
    holder: &str,
    ticket: &Ticket,
) -> Result<Option<Ending>, LockError> {
    let resp = etcd.get(note_key(lock, ticket.lease, holder), None).await?;
    let note = (resp.kvs().first())
        .and_then(|kv| serde_json::from_slice::<serde_json::Value>(kv.value()).ok())
        .filter(|v| v["fencingToken"].as_i64() == Some(ticket.revision));
    Ok(note.map(|v| match v["ending"].as_str() {
        Some(DEADLINE) => Ending::Deadline,
        Some(YIELD) => Ending::Yield,
        _ => Ending::Admin,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::protocol::keys::{config_prefix, lock_of_key};

    #[test]
    fn a_note_is_readable_by_its_namespace_and_never_taken_for_a_lock() {
        let lock = LockId::new("shop", "db").unwrap();
        let key = note_key(&lock, 0xab, "web-1");
        assert!(key.starts_with(&config_prefix(Some("shop"))), "{key}");
        assert_eq!(lock_of_key(key.as_bytes()), None, "{key} parsed as a lock");
        assert_eq!(key, "/podlock/v1/config/shop/.released/db/00000000000000ab/web-1");
    }
}
