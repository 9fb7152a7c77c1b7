//! The errors etcd answers, with the gRPC codes and messages of etcd's `rpctypes`: podlock's
//! engine reads both (`src/lock/error.rs`, `src/lock/refusal.rs`), so they are etcd's to the
//! letter.

use tonic::{Code, Status};

/// An error etcd answers a request with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EtcdError {
    /// A read or watch before the compacted revision; a compaction at or before it.
    #[error("etcdserver: mvcc: required revision has been compacted")]
    Compacted,
    /// A read, or a compaction, after the current revision.
    #[error("etcdserver: mvcc: required revision is a future revision")]
    FutureRevision,
    /// A request without a key.
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    /// A put with `ignore_value` or `ignore_lease` on a key that does not exist.
    #[error("etcdserver: key not found")]
    KeyNotFound,
    /// A put with both a value and `ignore_value`.
    #[error("etcdserver: value is provided")]
    ValueProvided,
    /// A put with both a lease and `ignore_lease`.
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    /// A transaction that writes one key twice on one path.
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    /// A transaction with more operations than etcd's `--max-txn-ops`.
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    /// A lease that does not exist (any more).
    #[error("etcdserver: requested lease not found")]
    LeaseNotFound,
    /// A grant of a lease id already in use.
    #[error("etcdserver: lease already exists")]
    LeaseExists,
    /// A grant beyond etcd's maximum lease TTL.
    #[error("etcdserver: too large lease TTL")]
    LeaseTtlTooLarge,
    /// Not an answer of etcd's: a transaction that puts, keeping its value or lease, a key it
    /// deleted. etcd 3.5.17 panics applying it, at every start again; the simulated member
    /// refuses it instead, so that a test sees it.
    #[error(
        "simulated etcd: etcd 3.5 panics applying this transaction (applyTxn: failed Put: key not found)"
    )]
    WouldPanic,
}

impl EtcdError {
    fn code(self) -> Code {
        use EtcdError::*;
        match self {
            Compacted | FutureRevision | LeaseTtlTooLarge => Code::OutOfRange,
            EmptyKey | KeyNotFound | ValueProvided | LeaseProvided | DuplicateKey | TooManyOps => {
                Code::InvalidArgument
            }
            LeaseNotFound => Code::NotFound,
            LeaseExists => Code::FailedPrecondition,
            WouldPanic => Code::Internal,
        }
    }
}

impl From<EtcdError> for Status {
    fn from(e: EtcdError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}
