//! A lock's settings, their bounds (the one place they are written), and how they live in etcd:
//! written by the operator (for a DistributedLock) or `podlock declare`, read by sidecars.

use etcd_client::{Compare, CompareOp, DeleteOptions, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::lock::bugs::{self, Bug};
use crate::lock::error::{LockError, Unavailable};
use crate::lock::etcd::Etcd;
use crate::lock::protocol::keys;
use crate::lock::protocol::names::LockId;
use crate::lock::protocol::token::{MAX_EPOCH, TokenError};

/// A lock's settings, as declared by a DistributedLock or `podlock declare`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// etcd lease TTL behind every holder and waiter.
    pub ttl_seconds: u32,
    /// 1 for a mutex, N for a counting semaphore.
    pub max_holders: u32,
    /// 0: a hold lives as long as its pod; >0: the app must heartbeat within this window.
    pub heartbeat_timeout_seconds: u32,
    /// 0: a hold lasts until it ends otherwise; N: no hold lasts longer than N seconds (a
    /// request may ask for less). Absent from the stored value while 0, so that settings
    /// written before it existed read as 0 and settings without it are written byte for byte
    /// as before.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_hold_seconds: u32,
    /// The fencing tokens' epoch (see [`Token`](crate::lock::Token)): 0 in a lock's first etcd,
    /// raised when it is published again in an etcd that lost it. Absent from the stored value
    /// while 0, so that settings written before epochs existed read as epoch 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ttl_seconds: TTL.default,
            max_holders: MAX_HOLDERS.default,
            heartbeat_timeout_seconds: HEARTBEAT.default,
            max_hold_seconds: MAX_HOLD.default,
            epoch: 0,
        }
    }
}

/// A setting's name, bounds and default: the one place they are written. The engine, the
/// sidecar's request parsing and flags, `podlock declare` and the CRD's schema all take them
/// from here.
#[derive(Debug, Clone, Copy)]
pub struct Bound {
    /// The field's name in the API and the CRD.
    pub field: &'static str,
    /// The smallest value allowed.
    pub min: u32,
    /// The largest value allowed.
    pub max: u32,
    /// The value when none is given.
    pub default: u32,
}

/// `ttlSeconds`: the etcd lease TTL behind every holder and waiter.
pub const TTL: Bound = Bound {
    field: "ttlSeconds",
    min: 2,
    max: 3600,
    default: 15,
};
/// `maxHolders`: 1 for a mutex, N for a semaphore.
pub const MAX_HOLDERS: Bound = Bound {
    field: "maxHolders",
    min: 1,
    max: 10000,
    default: 1,
};
/// `heartbeatTimeoutSeconds`: 0 for none.
pub const HEARTBEAT: Bound = Bound {
    field: "heartbeatTimeoutSeconds",
    min: 0,
    max: 3600,
    default: 0,
};

/// `maxHoldSeconds` of a lock: 0 for none; at most a week, beyond which a hold is no longer a
/// lock's business but a lease's.
pub const MAX_HOLD: Bound = Bound {
    field: "maxHoldSeconds",
    min: 0,
    max: 604_800,
    default: 0,
};

impl Bound {
    /// `value` if it lies within the bounds; else an error naming the field and the bounds.
    pub fn check(&self, value: u32) -> Result<u32, LockError> {
        if value < self.min || value > self.max {
            return Err(LockError::Invalid(format!(
                "{} must be between {} and {}, got {value}",
                self.field, self.min, self.max
            )));
        }
        Ok(value)
    }

    /// The bounds as a range, for a command-line flag's parser.
    pub fn range(&self) -> std::ops::RangeInclusive<i64> {
        i64::from(self.min)..=i64::from(self.max)
    }
}

impl Settings {
    /// Checks every field against the contract's bounds.
    pub fn validate(&self) -> Result<(), LockError> {
        TTL.check(self.ttl_seconds)?;
        MAX_HOLDERS.check(self.max_holders)?;
        HEARTBEAT.check(self.heartbeat_timeout_seconds)?;
        MAX_HOLD.check(self.max_hold_seconds)?;
        if self.epoch > MAX_EPOCH {
            return Err(LockError::Invalid(
                TokenError::Epoch(self.epoch.into()).to_string(),
            ));
        }
        Ok(())
    }
}

/// Settings as read from etcd, with what guards enqueues against a change: the config key's
/// mod revision and its value. The value matters across etcds: a settings value read from an
/// etcd since wiped or restored can have the very mod revision the new etcd's has, with
/// another epoch in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    /// The settings.
    pub settings: Settings,
    /// The config key's mod revision; 0 for an undeclared lock served with defaults.
    pub revision: i64,
    /// The config key's value as etcd holds it (empty for an undeclared lock).
    pub value: Arc<[u8]>,
}

impl Declared {
    /// The defaults, for an undeclared lock served by a standalone sidecar.
    pub fn undeclared() -> Self {
        Declared {
            settings: Settings::default(),
            revision: 0,
            value: Arc::from([]),
        }
    }

    /// The comparisons under which etcd still has these settings: the config key's mod
    /// revision, and for a declared lock its value.
    pub fn unchanged(&self, config: &str) -> Vec<Compare> {
        let mut same = vec![Compare::mod_revision(config, CompareOp::Equal, self.revision)];
        if self.revision != 0 && !bugs::on(Bug::GuardByRevision) {
            same.push(Compare::value(config, CompareOp::Equal, self.value.to_vec()));
        }
        same
    }

    /// Parses a config key-value pair.
    pub fn from_kv(kv: &KeyValue) -> Result<Self, LockError> {
        let settings: Settings = serde_json::from_slice(kv.value()).map_err(|e| {
            LockError::Corrupt(format!(
                "the settings at {} do not decode ({e}); declare the lock again (apply its \
                 DistributedLock, or run `podlock declare`) to rewrite them",
                kv.key_str().unwrap_or("?")
            ))
        })?;
        Ok(Declared {
            settings,
            revision: kv.mod_revision(),
            value: Arc::from(kv.value()),
        })
    }
}

/// The field of the settings' value that names their publisher.
const FIELD: &str = "cluster";

/// The cluster that published a settings value (empty: unowned, or a single cluster's).
pub fn publisher(value: &[u8]) -> String {
    let parsed: Result<serde_json::Value, _> = serde_json::from_slice(value);
    match parsed.ok().as_ref().and_then(|v| v.get(FIELD)) {
        Some(serde_json::Value::String(c)) => c.clone(),
        _ => String::new(),
    }
}

/// Settings with their publisher, as stored.
#[derive(Serialize)]
struct Published<'a> {
    #[serde(flatten)]
    settings: &'a Settings,
    /// [`FIELD`]; absent when unnamed.
    #[serde(skip_serializing_if = "str::is_empty")]
    cluster: &'a str,
}

/// The value that stores `settings` as published by `cluster` (unnamed: the settings alone,
/// byte for byte as before clusters were named; see [`clusters`](crate::lock::store::clusters)).
pub fn encode(settings: &Settings, cluster: &str) -> Vec<u8> {
    serde_json::to_vec(&Published { settings, cluster }).expect("settings serialize")
}

/// Reads a lock's settings; `None` when undeclared.
pub async fn read(etcd: &Etcd, lock: &LockId) -> Result<Option<Declared>, LockError> {
    let resp = etcd.get(lock.config_key(), None).await?;
    resp.kvs().first().map(Declared::from_kv).transpose()
}

/// Writes a lock's settings, published by `cluster` (see [`clusters`](crate::lock::store::clusters)), if the
/// config key still has mod revision `over` (0: absent), and drops the epoch a removal kept
/// ([`retire`]): the settings carry it from now on. `renew` also removes its queue in the same
/// transaction (a new epoch: no key enqueued under the old one may be granted under it).
/// Returns the number of queue keys removed, or `None` if the settings changed since `over`
/// was read.
pub async fn publish(
    etcd: &Etcd,
    lock: &LockId,
    settings: &Settings,
    cluster: &str,
    over: i64,
    renew: bool,
) -> Result<Option<i64>, LockError> {
    settings.validate()?;
    let value = encode(settings, cluster);
    let config = lock.config_key();
    let mut ops = vec![
        TxnOp::put(config.as_str(), value, None),
        TxnOp::delete(lock.retired_key(), None),
    ];
    if renew && !bugs::on(Bug::BumpKeepsQueue) {
        let all = DeleteOptions::new().with_prefix();
        ops.push(TxnOp::delete(lock.queue_prefix(), Some(all)));
    }
    let unchanged = Compare::mod_revision(config.as_str(), CompareOp::Equal, over);
    let resp = etcd.txn(Txn::new().when([unchanged]).and_then(ops)).await?;
    Ok(resp.succeeded().then(|| if renew { deleted(resp) } else { 0 }))
}

/// The operation that keeps a removed lock's token `epoch`, so that the lock declared again
/// under its name publishes under it, not under epoch 0: its tokens then continue above every
/// one it handed out before, even if that was under an epoch moved on after an etcd wipe (a
/// DistributedLock deleted and created again takes its status, and the epochs recorded there,
/// with it). Nothing is kept for epoch 0: the same etcd's revisions keep rising.
pub fn retire(lock: &LockId, epoch: u32) -> Option<TxnOp> {
    (epoch > 0).then(|| TxnOp::put(lock.retired_key(), epoch.to_string(), None))
}

/// The token epoch a removal kept for `lock` ([`retire`]), if any.
pub async fn retired(etcd: &Etcd, lock: &LockId) -> Result<Option<u32>, LockError> {
    let resp = etcd.get(lock.retired_key(), None).await?;
    let Some(kv) = resp.kvs().first() else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(kv.value());
    text.parse().map(Some).map_err(|_| {
        LockError::Corrupt(format!(
            "the token epoch kept at {} is not a number ({text:?}); delete that key, and \
             declare the lock with `podlock declare --min-token` above its last token",
            lock.retired_key()
        ))
    })
}

/// How many keys the last operation of a transaction deleted (0 if it deleted none).
fn deleted(resp: TxnResponse) -> i64 {
    match resp.op_responses().pop() {
        Some(TxnOpResponse::Delete(d)) => d.deleted(),
        _ => 0,
    }
}

/// How many times a removal is tried while the settings change under it.
const ATTEMPTS: usize = 8;

/// Removes a lock: its settings, every queue key, its release notes and its release receipts,
/// in one transaction guarded by the settings read, keeping its token epoch ([`retire`]).
/// Holders see `lost`. Returns how many queue keys were deleted.
pub async fn undeclare(etcd: &Etcd, lock: &LockId) -> Result<i64, LockError> {
    let config = lock.config_key();
    for _ in 0..ATTEMPTS {
        let found = read(etcd, lock).await?;
        let (epoch, revision) = found.map_or((0, 0), |d| (d.settings.epoch, d.revision));
        let notes = keys::release_notes_prefix(lock);
        let mut ops = vec![
            TxnOp::delete(config.as_str(), None),
            TxnOp::delete(notes, Some(DeleteOptions::new().with_prefix())),
            TxnOp::delete(lock.receipts_prefix(), Some(DeleteOptions::new().with_prefix())),
        ];
        ops.extend(retire(lock, epoch));
        // Last: its answer is the count of queue keys ended.
        ops.push(TxnOp::delete(
            lock.queue_prefix(),
            Some(DeleteOptions::new().with_prefix()),
        ));
        let unchanged = Compare::mod_revision(config.as_str(), CompareOp::Equal, revision);
        let resp = etcd.txn(Txn::new().when([unchanged]).and_then(ops)).await?;
        if resp.succeeded() {
            return Ok(deleted(resp));
        }
    }
    let (lock, attempts) = (lock.clone(), ATTEMPTS);
    Err(Unavailable::Changing { lock, attempts }.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_bounds() {
        assert!(Settings::default().validate().is_ok());
        let bad = Settings {
            ttl_seconds: 1,
            ..Settings::default()
        };
        let msg = bad.validate().unwrap_err().to_string();
        assert!(msg.contains("ttlSeconds"), "{msg}");
        let bad = Settings {
            max_holders: 0,
            ..Settings::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("maxHolders"));
        let bad = Settings {
            max_hold_seconds: MAX_HOLD.max + 1,
            ..Settings::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("maxHoldSeconds"));
        let bad = Settings {
            epoch: MAX_EPOCH + 1,
            ..Settings::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("epoch"));
    }

    #[test]
    fn settings_written_before_epochs_read_as_epoch_0_and_epoch_0_writes_them_unchanged() {
        let old = br#"{"ttlSeconds":15,"maxHolders":1,"heartbeatTimeoutSeconds":0}"#;
        let read: Settings = serde_json::from_slice(old).unwrap();
        assert_eq!(read, Settings::default());
        assert_eq!(serde_json::to_vec(&read).unwrap(), old.to_vec());
        let later = Settings { epoch: 2, ..read };
        let text = String::from_utf8(serde_json::to_vec(&later).unwrap()).unwrap();
        assert!(text.ends_with(r#""epoch":2}"#), "{text}");
        let limited = Settings {
            max_hold_seconds: 60,
            ..read
        };
        let text = String::from_utf8(serde_json::to_vec(&limited).unwrap()).unwrap();
        assert!(text.contains(r#""maxHoldSeconds":60"#), "{text}");
    }

    #[test]
    fn an_unnamed_publisher_writes_the_settings_as_before_and_a_named_one_is_read_back() {
        let s = Settings::default();
        assert_eq!(encode(&s, ""), serde_json::to_vec(&s).unwrap());
        let named = encode(&s, "east");
        assert_eq!(publisher(&named), "east");
        assert_eq!(serde_json::from_slice::<Settings>(&named).unwrap(), s);
        assert_eq!(publisher(&encode(&s, "")), "");
        assert_eq!(publisher(b"not json"), "");
    }
}
