//! The engine's error type. It knows nothing of HTTP: the sidecar maps it to status codes in
//! one place (`sidecar::error`).

use std::time::Duration;

use super::protocol::entry::{HolderInfo, Mode};
use super::protocol::names::{InvalidName, LockId};
use super::protocol::token::TokenError;
use super::refusal::Refusal;

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

impl From<InvalidName> for LockError {
    fn from(e: InvalidName) -> Self {
        LockError::Invalid(e.to_string())
    }
}

/// What an etcd error means to podlock: the one place gRPC codes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EtcdFailure {
    /// These credentials may not do this (or are wrong): final.
    Refused,
    /// The lease the request used is gone: the session is over.
    LeaseGone,
    /// It may go away by itself (a member or connection down, no leader, a leader change):
    /// worth sending again.
    Transient,
    /// The request's auth token was checked at an older auth revision than etcd's: a user,
    /// role or permission changed meanwhile (another namespace provisioned), or the member that
    /// took the request lags behind. Worth sending again with a new token, as etcd's Go client
    /// does (etcd-client renews only a token etcd no longer knows).
    AuthOutdated,
    /// etcd is out of space: final until an administrator frees some.
    Full,
    /// Anything else (a bad request): final.
    Final,
}

impl EtcdFailure {
    /// Whether the same request may succeed if sent again.
    pub(crate) fn worth_resending(self) -> bool {
        matches!(self, EtcdFailure::Transient | EtcdFailure::AuthOutdated)
    }

    /// Classifies `e`.
    pub(crate) fn of(e: &etcd_client::Error) -> Self {
        use tonic::Code;
        match e {
            etcd_client::Error::GRpcStatus(s) => match s.code() {
                Code::PermissionDenied | Code::Unauthenticated => EtcdFailure::Refused,
                // A password refused as the token was renewed, a user or role etcd does not
                // know: credentials wrong or rotated, which are 403s as much as a denial is.
                Code::InvalidArgument | Code::FailedPrecondition if Refusal::of(e).is_some() => {
                    EtcdFailure::Refused
                }
                Code::InvalidArgument if s.message().contains("revision of auth store is old") => {
                    EtcdFailure::AuthOutdated
                }
                Code::NotFound if s.message().contains("lease not found") => EtcdFailure::LeaseGone,
                // etcd says both "database space exceeded" (NOSPACE) and "too many requests"
                // (its apply queue is behind) with this code; only the second passes by itself.
                Code::ResourceExhausted if s.message().contains("space exceeded") => EtcdFailure::Full,
                Code::ResourceExhausted => EtcdFailure::Transient,
                // An answer in plain HTTP, not etcd's: a member still starting after a restart
                // answered 404 before serving gRPC (tonic maps it to Unimplemented), and a
                // `podlock declare` of the safety run failed on it. Sent again, it reaches etcd.
                Code::Unimplemented if s.message().contains("grpc-status header missing") => {
                    EtcdFailure::Transient
                }
                // The connection broke under the request (an etcd member restarting closes it:
                // HTTP/2 GOAWAY or a reset stream), which tonic reports as Internal. A helm
                // upgrade that rolled the bundled etcd answered acquires 400 with it.
                Code::Internal if s.message().starts_with("h2 protocol error") => EtcdFailure::Transient,
                Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Unknown
                | Code::Aborted => EtcdFailure::Transient,
                _ => EtcdFailure::Final,
            },
            etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => EtcdFailure::Transient,
            _ => EtcdFailure::Final,
        }
    }
}

impl From<etcd_client::Error> for LockError {
    fn from(e: etcd_client::Error) -> Self {
        let message = |e: &etcd_client::Error| match e {
            etcd_client::Error::GRpcStatus(s) => s.message().to_string(),
            other => other.to_string(),
        };
        match EtcdFailure::of(&e) {
            EtcdFailure::Refused => LockError::Forbidden(message(&e)),
            EtcdFailure::LeaseGone => LockError::LeaseNotFound(message(&e)),
            EtcdFailure::Transient | EtcdFailure::AuthOutdated => Unavailable::Unreachable(e).into(),
            EtcdFailure::Full => Unavailable::EtcdFull(message(&e)).into(),
            EtcdFailure::Final => LockError::Rejected(message(&e)),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::{Code, Status};

    fn from(code: Code, message: &str) -> LockError {
        etcd_client::Error::GRpcStatus(Status::new(code, message)).into()
    }

    #[test]
    fn each_etcd_failure_names_its_cause() {
        let cases = [
            (Code::InvalidArgument, "etcdserver: request is too large"),
            (
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            (Code::ResourceExhausted, "etcdserver: too many requests"),
            (Code::Unavailable, "etcdserver: no leader"),
            (Code::PermissionDenied, "etcdserver: permission denied"),
            (
                Code::Unimplemented,
                "grpc-status header missing, mapped from HTTP status code 404",
            ),
            (Code::Internal, "h2 protocol error: http2 error"),
            (Code::InvalidArgument, "etcdserver: revision of auth store is old"),
        ];
        let [too_large, full, busy, no_leader, denied, starting, cut, outdated] =
            cases.map(|(c, m)| from(c, m));
        for transient in [&cut, &outdated] {
            assert!(
                matches!(transient, LockError::Unavailable(Unavailable::Unreachable(_))),
                "{transient:?}"
            );
        }
        assert!(
            matches!(too_large, LockError::Rejected(ref m) if m.contains("too large")),
            "{too_large:?}"
        );
        assert!(
            matches!(full, LockError::Unavailable(Unavailable::EtcdFull(_))),
            "{full:?}"
        );
        assert!(
            matches!(busy, LockError::Unavailable(Unavailable::Unreachable(_))),
            "{busy:?}"
        );
        assert!(
            matches!(no_leader, LockError::Unavailable(Unavailable::Unreachable(_))),
            "{no_leader:?}"
        );
        assert!(matches!(denied, LockError::Forbidden(_)), "{denied:?}");
        let password = "etcdserver: authentication failed, invalid user ID or password";
        let refused = from(Code::InvalidArgument, password);
        assert!(matches!(refused, LockError::Forbidden(_)), "{refused:?}");
        assert!(
            matches!(starting, LockError::Unavailable(Unavailable::Unreachable(_))),
            "{starting:?}"
        );
        assert!(full.to_string().contains("NOSPACE"), "{full}");
    }
}
