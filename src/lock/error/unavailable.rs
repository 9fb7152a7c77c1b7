//! Why etcd could not serve a request now: the failures that may pass by themselves.

use std::time::Duration;

use crate::lock::protocol::names::LockId;

/// Why etcd could not serve a request now. Each may pass (an outage, a failover, a lease or
/// watch that ended, etcd full until freed): the sidecar answers 503, the caller may retry.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    /// etcd could not be reached, or failed in a way that may pass (no leader, a member
    /// down): worth retrying.
    #[error("etcd is unavailable: {0}; retry")]
    Unreachable(#[source] etcd_client::Error),

    /// etcd did not answer within the engine's budget for one request.
    #[error("etcd did not answer within {0:?}; retry")]
    Timeout(Duration),

    /// An etcd member stopped answering (stalled or cut off); the next request goes to another.
    #[error("the etcd member {what} within {within:?} (stalled or cut off); retry")]
    MemberStalled {
        /// What it did not do, e.g. "did not open a watch".
        what: &'static str,
        /// How long it was given.
        within: Duration,
    },

    /// etcd ended a watch (cancelled it, or closed its stream).
    #[error("etcd ended a watch: {0}; retry")]
    WatchEnded(String),

    /// etcd closed a lease's keepalive stream.
    #[error("etcd closed the keepalive stream of the sidecar's lease; retry")]
    KeepaliveEnded,

    /// Keepalives have been failing: a hold starting now could lose its lease at any moment.
    #[error("etcd keepalives are failing (lease confirmed for only {0:?} more); retry")]
    LeaseUnconfirmed(Duration),

    /// A waiter's queue key disappeared while it waited, the lock still declared.
    #[error("the queue entry vanished while waiting (its lease ended or was revoked); retry")]
    Vanished,

    /// The key could not be put into the queue: every attempt met changed settings or a
    /// revoked lease.
    #[error(
        "could not put a key into the queue of {lock} in {attempts} attempts (settings \
         changing, or the lease revoked each time); retry"
    )]
    NotPlaced {
        /// The lock asked for.
        lock: LockId,
        /// How many attempts were made.
        attempts: usize,
    },

    /// A lock's settings changed under every attempt to remove or withdraw it (another
    /// operator replica, or `podlock declare`, writing them meanwhile).
    #[error("the settings of {lock} changed under each of {attempts} attempts to remove it; retry")]
    Changing {
        /// The lock.
        lock: LockId,
        /// How many attempts were made.
        attempts: usize,
    },

    /// A holder's entry changed, or its grant stayed unrecorded, under every attempt to ask it
    /// to yield (see `txn/entry_swap.rs`).
    #[error(
        "the holder's queue entry changed, or its grant stayed unrecorded, under each of {0} attempts to write a yield request; retry"
    )]
    EntryChanging(u32),

    /// A lock's settings in etcd are under a lower token epoch than this sidecar has seen
    /// them under: etcd was restored from a snapshot taken before the lock's latest epoch
    /// (#54 F11). Granting under it would hand out tokens below earlier ones; the operator
    /// publishes the lock under a new epoch within moments.
    #[error(
        "the settings of {lock} went back from token epoch {seen} to {found} (etcd restored from \
         an older snapshot); the operator publishes it anew within moments: retry"
    )]
    EpochWentBack {
        /// The lock.
        lock: LockId,
        /// The highest epoch this sidecar saw the lock under.
        seen: u32,
        /// The epoch etcd has now.
        found: u32,
    },

    /// Enqueueing a request panicked (a bug, logged) before etcd answered.
    #[error("enqueueing this request failed on a bug (see the sidecar's log); retry")]
    EnqueuePanicked,

    /// etcd is out of space (its quota): no write succeeds until an administrator frees it.
    #[error(
        "etcd is out of space ({0}): compact and defragment it and disarm its NOSPACE alarm \
         (docs/operations.md)"
    )]
    EtcdFull(String),
}
