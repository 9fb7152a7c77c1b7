//! The record under every queue key ([`Entry`]) and what is read from it: a holder
//! ([`HolderInfo`]) and, for the queue's rule, a key's mode and whether it is granted. Every
//! reader decodes an entry with [`Entry::decode`].

use serde::{Deserialize, Serialize};
use std::time::SystemTime;

use super::token::Token;

/// The pod a sidecar serves, recorded in every entry so the operator can revoke a dead pod's
/// holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's uid (empty outside Kubernetes).
    #[serde(default)]
    pub uid: String,
    /// The cluster the pod runs in, when several clusters share the lock etcd (the operator's
    /// `--cluster-name`, injected as `PODLOCK_CLUSTER`); empty: the only one. Only that
    /// cluster's operator judges the pod.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
}

/// How a hold shares its lock (a lock with `maxHolders` 1: a reader-writer lock).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Alone: no other holder while it holds.
    #[default]
    Exclusive,
    /// With the other shared holders ahead of it, but never beside an exclusive one.
    Shared,
}

impl Mode {
    /// Whether this is the default, exclusive mode.
    pub fn is_exclusive(&self) -> bool {
        *self == Mode::Exclusive
    }

    /// How the API and the status name it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
        }
    }
}

/// What a key asks of its lock: its mode, and how many of the lock's slots it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// Its mode.
    pub mode: Mode,
    /// How many slots it takes (`permits`, 1 but for a weighted hold of a semaphore).
    pub permits: u32,
}

impl Ask {
    /// One slot in `mode`: every key but a weighted one.
    pub const fn one(mode: Mode) -> Self {
        Ask { mode, permits: 1 }
    }
}

/// The value of a queue key: who asked, for which pod, and when.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// The holder id the app chose (default: the pod name).
    pub holder_id: String,
    /// The pod whose sidecar wrote the entry.
    pub pod: PodRef,
    /// When the acquire request was made (RFC 3339).
    pub requested_at: String,
    /// When a waiter became a holder; absent for a hold granted at once (then it equals
    /// `requested_at`) and for a waiter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<String>,
    /// The lease TTL of this hold.
    pub ttl_seconds: u32,
    /// The heartbeat window of this hold (0: none).
    pub heartbeat_timeout_seconds: u32,
    /// The hold's maximum hold time in seconds (absent: none): the operator ends a hold its
    /// sidecar did not end by then.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_hold_seconds: u32,
    /// The app container that asked, if the app named it (`PODLOCK_CONTAINER`): the operator
    /// then judges restarts of that container only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// How the hold shares the lock (absent: exclusive).
    #[serde(default, skip_serializing_if = "Mode::is_exclusive")]
    pub mode: Mode,
    /// How many of the lock's slots the hold takes (absent: 1, as in every entry written
    /// before weighted permits).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub permits: u32,
    /// The lock's token epoch when the key was enqueued (absent: 0): its token is this epoch
    /// and the key's create revision ([`Token`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u32,
    /// Written by the release of the holder ahead, which handed this key its grant (direct
    /// handoff, see `txn/handoff.rs`): it holds from that write on. Not a record
    /// of the grant for the keys behind it (`acquiredAt` is).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub handed: bool,
    /// The keys behind this one that the release knew, handed on with the grant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub next: Vec<Successor>,
    /// The other locks this key's request takes as one with this one (a multi-lock acquire,
    /// see `acquire/multi.rs`); absent: this lock alone. Such a key is never handed a
    /// grant and hands none on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<String>,
    /// An administrator's request that the holder yield by this time (RFC 3339), written by
    /// the operator (`podlock.io/yield`); the operator ends the hold then if it still holds.
    /// Written only once the grant is recorded, so no later write erases it (see `txn/entry_swap.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yield_deadline: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Entry {
    /// Decodes a queue key's value; `None` when it is not an entry. Such a key was written by
    /// someone other than a sidecar: readers treat it as blocking nobody and bound to no pod.
    pub fn decode(value: &[u8]) -> Option<Entry> {
        serde_json::from_slice(value).ok()
    }

    /// The value to store.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an entry serializes")
    }

    /// Whether the entry records its grant (`acquiredAt` written).
    pub fn is_granted(&self) -> bool {
        self.acquired_at.is_some()
    }

    /// What the entry asks of its lock, for the queue's rule.
    pub fn ask(&self) -> Ask {
        Ask {
            mode: self.mode,
            permits: self.permits,
        }
    }

    /// Whether this is a multi-lock key still waiting for a lock of its set: it holds nothing
    /// until it records its grant on all of them, whatever its place in this queue.
    pub fn awaits_set(&self) -> bool {
        !self.with.is_empty() && !self.is_granted()
    }

    /// When a hold with a maximum hold time ends, if its grant is on record (`acquiredAt`
    /// plus `maxHoldSeconds`).
    pub fn recorded_deadline(&self) -> Option<SystemTime> {
        let at = humantime::parse_rfc3339(self.acquired_at.as_deref()?).ok()?;
        let hold = std::time::Duration::from_secs(self.max_hold_seconds.into());
        (self.max_hold_seconds > 0).then_some(at + hold)
    }

    /// The holder this entry is, for its key created at `revision`; `None` if that revision
    /// is beyond what a token can carry (such a key is never granted: its acquire is refused).
    pub fn holder(self, revision: i64) -> Option<HolderInfo> {
        let token = Token::new(self.epoch, revision).ok()?;
        Some(HolderInfo {
            fencing_token: token.get(),
            acquired_at: self.acquired_at.unwrap_or(self.requested_at),
            holder_id: self.holder_id,
            pod: self.pod.name,
            cluster: Some(self.pod.cluster).filter(|c| !c.is_empty()),
            mode: self.mode,
            permits: self.permits,
            with: self.with,
            yield_deadline: self.yield_deadline,
        })
    }
}

/// One holder of a lock, as reported by the API and mirrored into a DistributedLock's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HolderInfo {
    /// The holder id.
    pub holder_id: String,
    /// The holder's pod name.
    pub pod: String,
    /// The holder's cluster, when several clusters share the lock (absent: the only one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The holder's fencing token (its epoch and the create revision of its queue key).
    pub fencing_token: i64,
    /// When the hold began (RFC 3339).
    pub acquired_at: String,
    /// How it shares the lock.
    pub mode: Mode,
    /// How many of the lock's slots it takes (1 but for a weighted hold of a semaphore).
    #[serde(default = "one")]
    pub permits: u32,
    /// The other locks it holds as one with this one (a multi-lock hold); absent: this alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<String>,
    /// The time an administrator asked it to yield by (`podlock.io/yield`), if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yield_deadline: Option<String>,
}

/// Formats a time as the API and the status write it: RFC 3339 with milliseconds, in UTC.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// A key behind a holder, as the holder knows it: enough to write its grant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Successor {
    /// Its queue key.
    pub key: String,
    /// Its create revision (also its mod revision while it waits untouched).
    pub revision: i64,
    /// Its entry as its owner wrote it.
    pub entry: Entry,
}
