//! The DistributedLocks' status: the writer that keeps each lock's status current
//! ([`status_writer`]), the policy of which write goes next, without I/O ([`status_writes`]),
//! and how often a lock gets a `HolderChanged` Event ([`event_limit`]).

pub(super) mod event_limit;
pub(super) mod status_writer;
pub(super) mod status_writes;
