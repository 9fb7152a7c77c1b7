//! The engine's requests, answers and events: what the sidecar serializes.

use serde::Serialize;
use std::time::Duration;

use super::protocol::entry::{HolderInfo, Mode};
use super::protocol::names::LockId;

/// What an acquire asks for.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// The lock.
    pub lock: LockId,
    /// Who holds it (one pod may hold several ids).
    pub holder_id: String,
    /// How long to wait in the queue; zero: try once.
    pub wait: Duration,
    /// Overrides the lock's `ttlSeconds` for this hold.
    pub ttl_seconds: Option<u32>,
    /// Overrides the lock's `heartbeatTimeoutSeconds` for this hold.
    pub heartbeat_timeout_seconds: Option<u32>,
    /// The longest the hold may last, in seconds (at most the lock's `maxHoldSeconds`; `None`:
    /// the lock's).
    pub max_hold_seconds: Option<u32>,
    /// How long before that deadline the `deadline` event comes (`None`: a tenth of the hold,
    /// at least 1 s).
    pub deadline_warning_seconds: Option<u32>,
    /// The app container that asks, recorded in the entry for the operator.
    pub container: Option<String>,
    /// Exclusive, or shared with other shared holders (a lock with `maxHolders` 1).
    pub mode: Mode,
    /// How many of the lock's slots the hold takes: 1 to its `maxHolders` (an exclusive hold
    /// of a single lock).
    pub permits: u32,
    /// The hold will be bound to the asking connection (`POST .../hold`): it may not take over
    /// a hold of the same holder id, nor be taken over.
    pub connection_bound: bool,
    /// Further locks of the namespace to take as one with `lock` (a multi-lock acquire, see
    /// `acquire/multi.rs`); empty: `lock` alone.
    pub with: Vec<LockId>,
}

/// A granted hold, as the API reports it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    /// The lock (`lock` and `namespace` in JSON).
    #[serde(flatten)]
    pub lock: LockId,
    /// The holder id.
    pub holder_id: String,
    /// Strictly greater than every token issued before for this lock.
    pub fencing_token: i64,
    /// The etcd lease behind the hold.
    pub lease_id: i64,
    /// The lease TTL.
    pub ttl_seconds: u32,
    /// The heartbeat window (0: none).
    pub heartbeat_timeout_seconds: u32,
    /// When the hold began (RFC 3339).
    pub acquired_at: String,
    /// The hold's maximum hold time, in seconds (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_hold_seconds: Option<u32>,
    /// When the hold ends unless released before (RFC 3339; absent: no maximum hold time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// `exclusive` or `shared`: what the hold allows, stated on every grant.
    pub mode: Mode,
    /// How many of the lock's slots the hold takes, stated on every grant.
    pub permits: u32,
    /// Granted after waiting in the queue for an earlier holder: a handoff (for metrics; not
    /// part of the API).
    #[serde(skip)]
    pub handed_on: bool,
    /// A multi-lock hold: every lock it holds, each with its fencing token (all of them the
    /// same but where the locks' token epochs differ); empty for a single lock.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub locks: Vec<LockToken>,
}

/// One lock of a multi-lock hold and its fencing token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LockToken {
    /// The lock's name.
    pub lock: String,
    /// The hold's fencing token on that lock.
    pub fencing_token: i64,
}

/// What happened to one of this sidecar's holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// The hold was granted.
    Acquired,
    /// The app released it.
    Released,
    /// It ended by anything but release.
    Lost,
    /// It reaches its maximum hold time soon: it ends (`lost`, reason `deadline`) at its
    /// `deadline` unless released before.
    Deadline,
    /// An administrator asked the holder to yield (`podlock.io/yield`): the operator ends the
    /// hold (`lost`, reason `yield`) at its `deadline` unless it is released before.
    Yield,
}

impl EventKind {
    /// The event's name on a stream.
    pub fn as_str(&self) -> &'static str {
        match self {
            EventKind::Acquired => "acquired",
            EventKind::Released => "released",
            EventKind::Lost => "lost",
            EventKind::Deadline => "deadline",
            EventKind::Yield => "yield",
        }
    }

    /// Whether the hold ended with it: nothing follows on a hold's stream.
    pub fn ends(&self) -> bool {
        matches!(self, EventKind::Released | EventKind::Lost)
    }
}

/// An event about one hold, as streamed on `/v1/locks/{name}/events`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HoldEvent {
    /// What happened.
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// The lock (`lock` and `namespace` in JSON).
    #[serde(flatten)]
    pub lock: LockId,
    /// The holder id.
    pub holder_id: String,
    /// The hold's fencing token.
    pub fencing_token: i64,
    /// The hold's mode.
    pub mode: Mode,
    /// Why a hold was lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When a hold with a maximum hold time ends (RFC 3339; absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// When (RFC 3339).
    pub at: String,
}

/// A lock as etcd has it now.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LockInfo {
    /// The lock's name.
    pub lock: String,
    /// Whether anyone holds it.
    pub held: bool,
    /// The newest holder's token (the largest one issued to a current holder).
    pub fencing_token: Option<i64>,
    /// Holders in acquisition order.
    pub holders: Vec<HolderInfo>,
    /// Contenders waiting behind them.
    pub waiters: usize,
    /// The lock's lease TTL.
    pub ttl_seconds: u32,
    /// The lock's number of slots.
    pub max_holders: u32,
}

/// One of this sidecar's holds or waits, for `GET /v1/locks`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalEntry {
    /// The lock's name.
    pub lock: String,
    /// The holder id.
    pub holder_id: String,
    /// `held` or `waiting`.
    pub state: &'static str,
    /// The token of a held lock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<i64>,
}

/// The answer of a fence check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FenceCheck {
    /// The lock (`lock` and `namespace` in JSON).
    #[serde(flatten)]
    pub lock: LockId,
    /// The token asked about.
    pub token: i64,
    /// Whether `token` is one of `holders`' tokens.
    pub current: bool,
    /// The lock's holders at `revision`, in queue order (none when it is free or undeclared).
    pub holders: Vec<HolderInfo>,
    /// The etcd revision the answer was read at.
    pub revision: i64,
}

/// A lock's holders as an observer sees them (`GET /v1/locks/{name}/watch`, event `holders`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HolderSet {
    /// The lock (`lock` and `namespace` in JSON).
    #[serde(flatten)]
    pub lock: LockId,
    /// Its holders at `revision`, in queue order, as the fence check and `GET` name them.
    pub holders: Vec<HolderInfo>,
    /// The etcd revision they were read at.
    pub revision: i64,
}

/// A lock's deletion as an observer sees it (event `deleted`, the stream's last).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LockDeleted {
    /// The lock (`lock` and `namespace` in JSON).
    #[serde(flatten)]
    pub lock: LockId,
    /// The etcd revision of the read that found its settings gone, or of the read after the
    /// change that removed them.
    pub revision: i64,
}

/// What an observer of a lock sees next (see [`Observer`](crate::lock::Observer)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// The holders changed (their holder ids, tokens or modes): these are the new ones.
    Holders(HolderSet),
    /// The lock was deleted: nothing follows.
    Deleted(LockDeleted),
}
