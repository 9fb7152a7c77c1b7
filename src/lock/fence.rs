//! The fence check: whether a fencing token is a current hold of a lock, and if not, which
//! tokens are. Chubby gave resources the same question (`CheckSequencer`): a resource that keeps
//! no "highest token seen" of its own can ask before it commits a holder's write.
//!
//! The answer comes from one etcd request: a read-only transaction of the lock's settings and
//! the head of its queue, which etcd serves linearizably (after confirming its leadership,
//! as it does a range). It is true *as of that read's revision*: the hold may end a moment
//! later. Holders are judged by the queue's rule ([`protocol::held_count`]) under the settings
//! read in the same transaction, as the operator and `GET /v1/locks/{name}` judge them.
//!
//! [`protocol::held_count`]: super::protocol::held_count

use serde::Serialize;

use super::Engine;
use super::entry::HolderInfo;
use super::error::LockError;
use super::names::LockId;
use super::queue::{self, LockRead};
use super::settings::MAX_HOLDERS;

/// Keys read beyond the lock's slots at the head of its queue: room for its first waiter and
/// for shared holders past the slots (a reader-writer lock's readers). When every key read
/// holds and more follow, the whole queue is read instead (a second request).
const HEAD_SLACK: u32 = 8;

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

impl Engine {
    /// Whether `token` is a current hold of `lock`, from one linearizable etcd read (two when
    /// more holders stand at the queue's head than the lock was last seen to have slots).
    pub async fn fence(&self, lock: &LockId, token: i64) -> Result<FenceCheck, LockError> {
        let head = self.slots_seen(lock).saturating_add(HEAD_SLACK);
        let read = queue::read_lock(self.etcd(), lock, Some(head)).await?;
        let (holders, revision) = match self.holders_in(&read) {
            Some(holders) => (holders, read.revision),
            None => {
                let whole = queue::read_lock(self.etcd(), lock, None).await?;
                let holders = self.holders_in(&whole).expect("a whole queue has every holder");
                (holders, whole.revision)
            }
        };
        Ok(FenceCheck {
            lock: lock.clone(),
            token,
            current: holders.iter().any(|h| h.fencing_token == token),
            holders,
            revision,
        })
    }

    /// The slots of `lock` as this sidecar last read its settings (1 if never): only how much
    /// of the queue to read, the answer takes the settings read with it.
    fn slots_seen(&self, lock: &LockId) -> u32 {
        let cache = self.0.declared.lock().unwrap();
        cache.get(lock).map_or(1, |d| d.settings.max_holders)
    }

    /// The holders in `read` under the settings read with it; `None` if the read may have
    /// stopped among them. An undeclared lock has none, unless this sidecar serves undeclared
    /// locks (`--standalone`): then the default settings apply, as to its acquires.
    fn holders_in(&self, read: &LockRead) -> Option<Vec<HolderInfo>> {
        let max_holders = match &read.declared {
            Some(d) => d.settings.max_holders,
            None if self.0.standalone => MAX_HOLDERS.default,
            None => return Some(vec![]),
        };
        queue::head_holders(&read.queue, read.more, max_holders)
    }
}
