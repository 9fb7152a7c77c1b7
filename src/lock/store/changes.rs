//! What the [`Store`](crate::lock::Store) hands the operator of podlock's data: queue entries,
//! decoded, and a watch's changes, typed. The key layout and etcd's types stay inside the
//! engine.

use etcd_client::{EventType, KeyValue, WatchStream};

use crate::lock::error::{LockError, Unavailable};
use crate::lock::protocol::entry::Entry;
use crate::lock::protocol::keys;
use crate::lock::protocol::names::LockId;
use crate::lock::txn::queue::Ticket;

/// One entry of a lock's queue, as etcd holds it.
#[derive(Debug, Clone)]
pub struct QueueEntry {
    /// The lock whose queue it is in (from the key, which etcd's per-namespace roles confine).
    pub lock: LockId,
    /// Its etcd key. A later entry may reuse it, with a newer `revision`.
    pub key: String,
    /// Its create revision: its place in the queue and, once it holds, its fencing token.
    pub revision: i64,
    /// The lease it is bound to.
    pub lease: i64,
    /// Its value, whatever its writer chose; `None` when it is not an entry.
    pub entry: Option<Entry>,
}

impl QueueEntry {
    /// A queue key-value; `None` for a key outside every lock's queue.
    pub(in crate::lock) fn of(kv: &KeyValue) -> Option<Self> {
        if !keys::is_queue_key(kv.key()) {
            return None;
        }
        Some(QueueEntry {
            lock: keys::lock_of_key(kv.key())?,
            key: kv.key_str().ok()?.to_string(),
            revision: kv.create_revision(),
            lease: kv.lease(),
            entry: Entry::decode(kv.value()),
        })
    }

    /// Its key as the queue's own operations take it.
    pub(in crate::lock) fn ticket(&self) -> Ticket {
        Ticket {
            key: self.key.clone(),
            revision: self.revision,
            lease: self.lease,
        }
    }
}

/// A change to podlock's data, as a watch reports it.
#[derive(Debug, Clone)]
pub enum Change {
    /// A queue entry was put: a new one, one rewritten to record its grant, or one handed a grant.
    Put(Box<QueueEntry>),
    /// The queue entry at `key` was removed (released, its lease ended, or its lock deleted).
    Removed {
        /// The lock whose queue it was in.
        lock: LockId,
        /// Its key.
        key: String,
    },
    /// A lock's settings were written or removed.
    Settings(LockId),
}

impl Change {
    /// The lock it concerns.
    pub fn lock(&self) -> &LockId {
        match self {
            Change::Put(e) => &e.lock,
            Change::Removed { lock, .. } | Change::Settings(lock) => lock,
        }
    }

    fn of(kind: EventType, kv: &KeyValue) -> Option<Self> {
        let lock = keys::lock_of_key(kv.key())?;
        if !keys::is_queue_key(kv.key()) {
            return Some(Change::Settings(lock));
        }
        Some(match kind {
            EventType::Put => Change::Put(Box::new(QueueEntry::of(kv)?)),
            EventType::Delete => Change::Removed {
                lock,
                key: kv.key_str().ok()?.to_string(),
            },
        })
    }
}

/// The changes of a watch (see [`Store::watch`](crate::lock::Store::watch)), in etcd's order.
pub struct Changes(pub(in crate::lock) WatchStream);

impl Changes {
    /// The next batch of changes (one etcd revision or more). An error ends the watch: read
    /// again and watch anew from the read's revision.
    pub async fn next(&mut self) -> Result<Vec<Change>, LockError> {
        let resp = (self.0.message().await?)
            .ok_or_else(|| LockError::from(Unavailable::WatchEnded("it closed the stream".into())))?;
        if resp.canceled() {
            return Err(LockError::from(Unavailable::WatchEnded(format!(
                "cancelled: {}",
                resp.cancel_reason()
            ))));
        }
        let changes = resp.events().iter().filter_map(|ev| {
            let kind = ev.event_type();
            ev.kv().and_then(|kv| Change::of(kind, kv))
        });
        Ok(changes.collect())
    }
}
