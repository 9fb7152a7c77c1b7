//! The fence check: whether a fencing token is a current hold of a lock, and if not, which
//! tokens are. Chubby gave resources the same question (`CheckSequencer`): a resource that keeps
//! no "highest token seen" of its own can ask before it commits a holder's write.
//!
//! The answer comes from one etcd request: a read-only transaction of the lock's settings and
//! the head of its queue, which etcd serves linearizably (after confirming its leadership,
//! as it does a range). It is true *as of that read's revision*: the hold may end a moment
//! later.
//!
//! A hold is current while its key is in place and it holds by the one rule of who holds
//! ([`protocol::holders`]) under the settings read in the same transaction, as status,
//! `GET /v1/locks/{name}` and a force release judge holders: its grant is on record, or the
//! queue's rule lets it in now. A hold granted before `maxHolders` was lowered stays current
//! until it ends; a waiter is never current.
//!
//! The same read ([`Engine::read_holders`]) is what an observer of the lock reports
//! (`observe.rs`): a fence check and a watch name the same holders at the same revision, but
//! for one kind of key. A key on one of this sidecar's own leases is, to its fence check, a
//! holder only while its registry holds it with that token. etcd cannot tell the key of a hold
//! that ended and that a restore from a snapshot brought back from a hold that goes on; its own
//! sidecar can (issue #54, finding 4). So a resource that checks a token through the holder's
//! own sidecar is answered exactly across a restore; through another sidecar, the key is current
//! until its sidecar removes it (`engine/state.rs`) or the operator moves the lock to a new
//! epoch (docs/design.md, "Fencing").
//!
//! A hold with a maximum hold time ends at its deadline (`acquiredAt` plus `maxHoldSeconds`),
//! and its client is told so then, whether or not its sidecar can remove its key; the fence
//! check calls it current only before that deadline, on this sidecar's clock (the seeded
//! world's finding F12: a sidecar cut off from etcd at the deadline leaves the key in place
//! until its lease ends or the operator removes it).
//!
//! [`protocol::holders`]: super::protocol::holders

use std::time::SystemTime;

use super::bugs::{self, Bug};
use super::clock;
use super::engine::Engine;
use super::error::LockError;
use super::messages::FenceCheck;
use super::protocol::Queued;
use super::protocol::entry::{Entry, HolderInfo};
use super::protocol::names::LockId;
use super::txn::queue::{self, LockRead};
use super::txn::settings::{Declared, MAX_HOLDERS};

/// Keys read beyond the lock's slots at the head of its queue: room for its first waiter and
/// for shared holders past the slots (a reader-writer lock's readers). When every key read
/// holds and more follow, the whole queue is read instead (a second request).
const HEAD_SLACK: u32 = 8;

/// What the fence check needs of a holder's key beyond the holder.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyFacts {
    /// The key's lease.
    pub lease: i64,
    /// When its maximum hold time ends, for a hold with one whose grant is on record.
    pub deadline: Option<SystemTime>,
}

impl KeyFacts {
    fn of(kv: &etcd_client::KeyValue, entry: Option<&Entry>) -> KeyFacts {
        KeyFacts {
            lease: kv.lease(),
            deadline: entry.and_then(Entry::recorded_deadline),
        }
    }
}

/// A lock's holders by the one rule of who holds, as [`Engine::read_holders`] read them.
pub(super) struct Holding {
    /// The lock's settings as etcd had them (`None`: not declared).
    pub declared: Option<Declared>,
    /// The create revision of the settings key (0: not declared).
    pub created: i64,
    /// Its holders in queue order.
    pub holders: Vec<HolderInfo>,
    /// What the fence check needs of each of `holders`' keys, in the same order.
    pub keys: Vec<KeyFacts>,
    /// etcd's revision of the read.
    pub revision: i64,
}

impl Engine {
    /// Whether `token` is a current hold of `lock`, from one linearizable etcd read (two when
    /// more holders stand at the queue's head than the lock was last seen to have slots).
    /// A key on this sidecar's own lease holds only while its registry holds it (see the
    /// module's doc).
    pub async fn fence(&self, lock: &LockId, token: i64) -> Result<FenceCheck, LockError> {
        let Holding {
            holders,
            keys,
            revision,
            ..
        } = self.read_holders(lock).await?;
        let (mine, now) = (self.sessions().leases().await, clock::now());
        let holders = (holders.into_iter().zip(keys))
            .filter(|(h, k)| !mine.contains(&k.lease) || self.holds(lock, h))
            .filter(|(_, k)| k.deadline.is_none_or(|d| now < d) || bugs::on(Bug::FenceIgnoresDeadline))
            .map(|(h, _)| h)
            .collect::<Vec<_>>();
        Ok(FenceCheck {
            lock: lock.clone(),
            token,
            current: holders.iter().any(|h| h.fencing_token == token),
            holders,
            revision,
        })
    }

    /// The holders of `lock` now, with its settings, from one linearizable etcd read of the
    /// settings and the queue's head (a second one of the whole queue when the head may stop
    /// among the holders).
    pub(super) async fn read_holders(&self, lock: &LockId) -> Result<Holding, LockError> {
        let head = self.slots_seen(lock).saturating_add(HEAD_SLACK);
        let read = queue::read_lock(self.etcd(), lock, Some(head)).await?;
        let (read, holders) = match self.holders_in(&read) {
            Some(holders) => (read, holders),
            None => {
                let whole = queue::read_lock(self.etcd(), lock, None).await?;
                let holders = self.holders_in(&whole).expect("a whole queue has every holder");
                (whole, holders)
            }
        };
        let (holders, keys) = holders.into_iter().unzip();
        Ok(Holding {
            declared: read.declared,
            created: read.created,
            holders,
            keys,
            revision: read.revision,
        })
    }

    /// The holders in `read` under the settings read with it, each with its key's lease;
    /// `None` if the read may have stopped among them. An undeclared lock has none, unless this
    /// sidecar serves undeclared locks (`--standalone`): then the default settings apply, as to
    /// its acquires.
    fn holders_in(&self, read: &LockRead) -> Option<Vec<(HolderInfo, KeyFacts)>> {
        let max_holders = match &read.declared {
            Some(d) => d.settings.max_holders,
            None if self.standalone() => MAX_HOLDERS.default,
            None => return Some(vec![]),
        };
        let (entries, keys) = queue::decode_with(&read.queue, KeyFacts::of);
        complete_head(entries, keys, read.more, max_holders)
    }

    /// Whether this sidecar's registry holds `holder`'s hold of `lock`, with its token.
    fn holds(&self, lock: &LockId, holder: &HolderInfo) -> bool {
        let slot = (lock.clone(), holder.holder_id.clone());
        let held = self.registry().held(&slot);
        held.is_some_and(|h| h.token() == holder.fencing_token)
    }
}

/// The holders among the first keys of a queue, each with its `leases` item, by the one rule
/// of who holds, `more` if keys lie beyond them; `None` when every key read holds and more
/// follow (then the holders may go on past the read: read the whole queue). Holders that end
/// inside the read end there in the whole queue too: the rule judges a key by the keys ahead
/// of it alone.
fn complete_head<T>(
    entries: Vec<(Option<HolderInfo>, Queued)>,
    leases: impl IntoIterator<Item = T>,
    more: bool,
    max_holders: u32,
) -> Option<Vec<(HolderInfo, T)>> {
    let held = queue::held(&entries, max_holders);
    if more && held == entries.len() {
        return None;
    }
    let head = entries.into_iter().zip(leases).take(held);
    Some(head.filter_map(|((h, _), lease)| Some((h?, lease))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::protocol::entry::Mode;

    const X: Mode = Mode::Exclusive;
    const S: Mode = Mode::Shared;

    /// Entries of these modes and grant records, their tokens 1, 2, ... in queue order.
    fn entries(spec: &[(Mode, bool)]) -> Vec<(Option<HolderInfo>, Queued)> {
        (spec.iter().zip(1..))
            .map(|(&(mode, granted), token)| {
                let holder = HolderInfo {
                    holder_id: format!("h{token}"),
                    pod: "p".into(),
                    cluster: None,
                    fencing_token: token,
                    acquired_at: String::new(),
                    mode,
                    permits: 1,
                    with: vec![],
                    yield_deadline: None,
                };
                let queued = Queued {
                    ask: crate::lock::protocol::Ask::one(mode),
                    recorded: granted,
                    handed: false,
                    set: false,
                };
                (Some(holder), queued)
            })
            .collect()
    }

    fn tokens(spec: &[(Mode, bool)], more: bool, max_holders: u32) -> Option<Vec<i64>> {
        let head = complete_head(entries(spec), std::iter::repeat(()), more, max_holders)?;
        Some(head.iter().map(|(e, _)| e.fencing_token).collect())
    }

    #[test]
    fn holders_that_end_inside_the_read_are_all_the_holders() {
        // A mutex granted at once (its grant not recorded yet) and its first waiter.
        assert_eq!(tokens(&[(X, false), (X, false)], true, 1), Some(vec![1]));
        assert_eq!(
            tokens(&[(X, true), (X, true), (X, false)], true, 2),
            Some(vec![1, 2])
        );
        assert_eq!(
            tokens(&[(S, true), (S, false), (X, false)], true, 1),
            Some(vec![1, 2])
        );
        assert_eq!(tokens(&[], false, 1), Some(vec![]));
        // The whole queue read: whatever holds is all there is.
        assert_eq!(tokens(&[(S, true), (S, true)], false, 1), Some(vec![1, 2]));
    }

    #[test]
    fn a_hold_granted_before_max_holders_was_lowered_stays_current() {
        // maxHolders 2 -> 1 while two hold and one waits: both holds go on until they end.
        let lowered = [(X, true), (X, true), (X, false)];
        assert_eq!(tokens(&lowered, false, 1), Some(vec![1, 2]));
    }

    #[test]
    fn a_read_that_may_stop_among_the_holders_is_no_answer() {
        // Slots raised since last seen, or readers past the slots: the next key may hold too.
        assert_eq!(tokens(&[(X, true), (X, false)], true, 3), None);
        assert_eq!(tokens(&[(S, true), (S, true), (S, true)], true, 1), None);
        assert_eq!(tokens(&[(X, true), (X, true)], true, 1), None);
    }
}
