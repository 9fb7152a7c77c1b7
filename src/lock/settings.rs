//! A lock's settings, their bounds (the one place they are written), and how they live in etcd:
//! written by the operator (for a DistributedLock) or `podlock declare`, read by sidecars.

use etcd_client::{DeleteOptions, KeyValue, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use super::error::LockError;
use super::etcd::Etcd;
use super::names::LockId;

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
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ttl_seconds: TTL.default,
            max_holders: MAX_HOLDERS.default,
            heartbeat_timeout_seconds: HEARTBEAT.default,
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
        Ok(())
    }
}

/// Settings as read from etcd, with the mod revision that guards enqueues against a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declared {
    /// The settings.
    pub settings: Settings,
    /// The config key's mod revision; 0 for an undeclared lock served with defaults.
    pub revision: i64,
}

impl Declared {
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
        })
    }
}

/// Reads a lock's settings; `None` when undeclared.
pub async fn read(etcd: &Etcd, lock: &LockId) -> Result<Option<Declared>, LockError> {
    let resp = etcd.get(lock.config_key(), None).await?;
    resp.kvs().first().map(Declared::from_kv).transpose()
}

/// Writes a lock's settings (creating or updating it).
pub async fn declare(etcd: &Etcd, lock: &LockId, settings: &Settings) -> Result<(), LockError> {
    settings.validate()?;
    let value = serde_json::to_vec(settings).expect("settings serialize");
    etcd.txn(Txn::new().and_then([TxnOp::put(lock.config_key(), value, None)]))
        .await?;
    Ok(())
}

/// Removes a lock: its settings and every queue key, in one transaction. Holders see `lost`.
/// Returns how many queue keys were deleted.
pub async fn undeclare(etcd: &Etcd, lock: &LockId) -> Result<i64, LockError> {
    let resp = etcd
        .txn(Txn::new().and_then([
            TxnOp::delete(lock.config_key(), None),
            TxnOp::delete(lock.queue_prefix(), Some(DeleteOptions::new().with_prefix())),
        ]))
        .await?;
    Ok(match resp.op_responses().pop() {
        Some(etcd_client::TxnOpResponse::Delete(d)) => d.deleted(),
        _ => 0,
    })
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
    }
}
