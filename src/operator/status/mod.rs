//! The DistributedLocks' status: the writer that keeps each lock's status current
//! ([`writer`]), the policy of which write goes next, without I/O ([`plan`]),
//! and how often a lock gets a `HolderChanged` Event ([`event_limit`]).

pub(super) mod event_limit;
pub(super) mod plan;
pub(super) mod writer;
