//! The lock engine: fair, fenced, liveness-aware locks and semaphores on etcd.
//!
//! [`Engine`] is what a sidecar runs: it acquires, releases and heartbeats holds for one pod,
//! keeps their leases alive (`etcd/session.rs`), queues contenders FIFO without a
//! thundering herd (`txn/queue.rs`), watches each hold until it ends (`life/monitor.rs`) and
//! publishes [`HoldEvent`]s. It knows nothing of HTTP or Kubernetes. The operator and
//! `podlock declare` reach podlock's data through [`Store`] alone, in typed records; the key
//! layout (`protocol/keys.rs`) stays in here.
//!
//! This module only names the engine's public face. The files are cut into wings, folders that
//! import only themselves and the wings below them (docs/design.md, "The engine's wings"):
//! [`protocol`], then `error` and `messages`, `etcd`, `txn`, then `engine` (the `Engine` and its
//! state) and `store`, then `life` and `fence`, then `acquire` and `observe`. Each verb of the
//! engine is an `impl Engine` in the file of its wing; none imports this module.

mod acquire;
pub mod bugs;
pub mod clock;
mod engine;
mod error;
mod etcd;
mod feed;
mod fence;
mod life;
mod messages;
mod observe;
pub mod protocol;
mod refusal;
mod store;
mod txn;

pub use engine::max_hold::{REQUEST_MAX_HOLD, WARNING_FIELD};
pub use engine::{Engine, Footprint};
pub use error::{LockError, Unavailable};
pub use etcd::Stats;
pub use etcd::link::Link;
pub use etcd::version::{FIXES, Fix, MINIMUM, Release, Said, VersionError, Versions};
pub use messages::{
    AcquireRequest, EventKind, FenceCheck, Grant, HoldEvent, HolderSet, LocalEntry, LockDeleted, LockInfo,
    LockToken, Observed,
};
pub use observe::Observer;
pub use protocol::entry::{Entry, HolderInfo, Mode, PodRef, rfc3339};
pub use protocol::names::{
    InvalidName, LockId, check_container, check_dns_subdomain, check_holder_id, cluster_name,
    unique_holder_id,
};
pub use protocol::token::{MAX_EPOCH, REVISION_LIMIT, Token, TokenError, next_epoch};
pub use refusal::Refusal;
pub use store::auth::NamespacePassword;
pub use store::changes::{Change, Changes, QueueEntry};
pub use store::clusters::{Withdrawn, may_publish};
pub use store::{LockState, Revoked, RoundTripError, Store};
pub use txn::queue::QueueState;
pub use txn::release_note::{DEADLINE, Ending, YIELD};
pub use txn::settings::{Bound, HEARTBEAT, MAX_HOLD, MAX_HOLDERS, Settings, TTL};
