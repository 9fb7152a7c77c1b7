//! Lock settings in etcd: written by the operator (for a DistributedLock) or `podlock declare`,
//! read by sidecars.

use etcd_client::{DeleteOptions, KeyValue, Txn, TxnOp};

use super::LockError;
use super::etcd::Etcd;
use super::keys::{LockId, Settings};

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
