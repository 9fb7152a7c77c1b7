//! The engine's error type. It knows nothing of HTTP: the sidecar maps it to status codes in
//! one place (`sidecar::error`).

pub(crate) mod etcd;
mod unavailable;

pub use unavailable::Unavailable;

use crate::lock::protocol::entry::{HolderInfo, Mode};
use crate::lock::protocol::names::{InvalidName, LockId};
use crate::lock::protocol::token::TokenError;

/// Why a lock operation did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The request itself is wrong (bad name, out-of-bounds value); nothing was changed.
    #[error("{0}")]
    Invalid(String),

    /// No settings are declared for this lock and the sidecar is not `--standalone`.
    #[error(
        "lock {0} is not declared: create a DistributedLock (or run `podlock declare`) in namespace {ns}",
        ns = .0.namespace
    )]
    NotFound(LockId),

    /// Every slot is taken and the wait ended (try-once, deadline, or a duplicate request).
    #[error("lock {lock} is held by {}{why}", holder_names(.holders))]
    Held {
        /// The lock that was asked for.
        lock: LockId,
        /// Its holders at the moment the wait ended, in acquisition order.
        holders: Vec<HolderInfo>,
        /// Extra explanation, empty or starting with "; ".
        why: String,
    },

    /// The holder id already has an acquire of this lock in progress (waiting, or being
    /// granted): one acquire per holder id and lock at a time.
    #[error(
        "{holder} already has an acquire of lock {lock} in progress; wait for its answer, or use another holderId"
    )]
    AlreadyWaiting {
        /// The lock that was asked for.
        lock: LockId,
        /// The holder id named in the request.
        holder: String,
    },

    /// The holder id's hold (or acquire in progress) belongs to a connection-bound hold, or a
    /// connection-bound hold was asked for a holder id that already holds: one connection's
    /// hold is never shared with, or ended by, another request.
    #[error(
        "{holder} already holds lock {lock}{why}; use another holderId (POST .../hold without one makes a unique id)"
    )]
    HolderInUse {
        /// The lock that was asked for.
        lock: LockId,
        /// The holder id named in the request.
        holder: String,
        /// Which side is bound to a connection, starting with "; ".
        why: String,
    },

    /// The holder id holds the lock in the other mode: a re-acquire never changes a hold's mode.
    #[error(
        "{holder} holds lock {lock} in mode {held}, not {asked}; release it first, then acquire in mode {asked}",
        held = .held.as_str(), asked = .asked.as_str()
    )]
    ModeConflict {
        /// The lock that was asked for.
        lock: LockId,
        /// The holder id named in the request.
        holder: String,
        /// The mode of the hold it has.
        held: Mode,
        /// The mode it asked for.
        asked: Mode,
    },

    /// A request asked for a longer hold than its lock allows (`spec.maxHoldSeconds`).
    #[error(
        "maxHoldSeconds {asked} is above lock {lock}'s maxHoldSeconds {limit} (spec.maxHoldSeconds \
         of its DistributedLock): ask for at most {limit}, or leave maxHoldSeconds out to hold up to {limit}"
    )]
    AboveMaxHold {
        /// The lock whose limit it is.
        lock: LockId,
        /// The maximum hold time asked for, in seconds.
        asked: u32,
        /// The lock's limit, in seconds.
        limit: u32,
    },

    /// A request asked for more permits than its lock has slots (`spec.maxHolders`).
    #[error(
        "permits {asked} is above lock {lock}'s maxHolders {limit} (spec.maxHolders of its \
         DistributedLock): ask for at most {limit} permits, or raise maxHolders"
    )]
    AbovePermits {
        /// The lock whose limit it is.
        lock: LockId,
        /// The permits asked for.
        asked: u32,
        /// The lock's `maxHolders`.
        limit: u32,
    },

    /// The holder id does not hold this lock (never did, or already released).
    #[error("{holder} does not hold lock {lock}{why}")]
    NotHolder {
        /// The lock named in the request.
        lock: LockId,
        /// The holder id named in the request.
        holder: String,
        /// Extra explanation, empty or starting with "; ".
        why: String,
    },

    /// The hold ended by something other than release (lease expiry, missed heartbeat, the
    /// operator revoking it, the lock being deleted).
    #[error("{holder} lost lock {lock}: {reason}")]
    Lost {
        /// The lock that was held.
        lock: LockId,
        /// The holder that lost it.
        holder: String,
        /// What ended the hold.
        reason: String,
    },

    /// etcd refused: these credentials may not touch this lock (another namespace's), or the
    /// credentials are wrong.
    #[error("etcd refused access: {0}")]
    Forbidden(String),

    /// etcd no longer has the lease a request used (revoked or expired): the session is over.
    #[error("the sidecar's etcd lease is gone (revoked or expired): {0}; retry")]
    LeaseNotFound(String),

    /// A value podlock wrote to etcd does not decode: someone else wrote it, or it was damaged.
    /// Not an outage: retrying will not help until the key is fixed.
    #[error("corrupt data in etcd: {0}")]
    Corrupt(String),

    /// etcd could not serve the request now, in a way that may pass: the cause says which.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),

    /// etcd rejected the request as bad (too large, too many operations, a wrong argument):
    /// sending it again will not help.
    #[error("etcd rejected the request: {0}")]
    Rejected(String),

    /// No fencing token can be made for this grant (etcd's revision has outgrown the token):
    /// the acquire is refused, never answered with a wrapped token.
    #[error("cannot give lock {lock} a fencing token: {source}")]
    Token {
        /// The lock asked for.
        lock: LockId,
        /// Why.
        #[source]
        source: TokenError,
    },
}

impl From<InvalidName> for LockError {
    fn from(e: InvalidName) -> Self {
        LockError::Invalid(e.to_string())
    }
}

fn holder_names(holders: &[HolderInfo]) -> String {
    if holders.is_empty() {
        return "nobody (it was just released; retry)".into();
    }
    holders
        .iter()
        .map(|h| format!("{} (pod {}, token {})", h.holder_id, h.pod, h.fencing_token))
        .collect::<Vec<_>>()
        .join(", ")
}
