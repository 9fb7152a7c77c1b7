//! The engine's record of this sidecar's holds and waits, one slot per (lock, holder id), and
//! every transition between them. Each transition happens under one mutex, so a hold ends
//! exactly once: by release, by loss, or by shutdown.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use super::hold::Hold;
use crate::lock::error::LockError;
use crate::lock::messages::LocalEntry;
use crate::lock::protocol::names::LockId;

/// How long the registry remembers a lost hold, so that a late release or heartbeat of it is
/// told `lock_lost` rather than `not_holder`. Bounded, because holder ids may be unique per run
/// (`podlock lock`) and a long-lived sidecar would otherwise grow without limit.
const LOST_MEMORY: Duration = Duration::from_secs(600);

/// (lock, holder id): what a slot is keyed by.
pub(crate) type SlotKey = (LockId, String);

enum Slot {
    /// An acquire is in progress (enqueueing or waiting), with the queue key it is placing or
    /// has placed (`None` before its first enqueue).
    Waiting(Option<String>),
    Held(Arc<Hold>),
    Lost {
        token: i64,
        reason: String,
        since: Instant,
    },
}

/// This sidecar's slots.
#[derive(Default)]
pub(crate) struct Registry(Mutex<BTreeMap<SlotKey, Slot>>);

impl Registry {
    /// The hold in `slot`, if it holds.
    pub fn held(&self, slot: &SlotKey) -> Option<Arc<Hold>> {
        match self.0.lock().unwrap().get(slot) {
            Some(Slot::Held(h)) => Some(h.clone()),
            _ => None,
        }
    }

    /// Marks `slot` as waiting for an acquire. Fails if the holder already holds (the caller
    /// answers with that hold) or already has an acquire in progress.
    pub fn claim(&self, slot: &SlotKey) -> Result<(), Claimed> {
        let mut map = self.0.lock().unwrap();
        match map.get(slot) {
            Some(Slot::Held(h)) => Err(Claimed::Holds(h.clone())),
            Some(Slot::Waiting(_)) => Err(Claimed::Waits),
            _ => {
                map.insert(slot.clone(), Slot::Waiting(None));
                Ok(())
            }
        }
    }

    /// Records the queue key that the acquire waiting in `slot` is about to put, so that the
    /// orphan sweep knows it (and only it) as this acquire's.
    pub fn placing(&self, slot: &SlotKey, key: &str) {
        if let Some(Slot::Waiting(placing)) = self.0.lock().unwrap().get_mut(slot) {
            *placing = Some(key.to_string());
        }
    }

    /// Clears `slot` if it is still waiting (the acquire ended without a hold).
    pub fn unclaim(&self, slot: &SlotKey) {
        let mut map = self.0.lock().unwrap();
        if matches!(map.get(slot), Some(Slot::Waiting(_))) {
            map.remove(slot);
        }
    }

    /// Records that `slot` now holds `hold`.
    pub fn hold(&self, slot: SlotKey, hold: Arc<Hold>) {
        self.0.lock().unwrap().insert(slot, Slot::Held(hold));
    }

    /// Removes `hold`'s slot if it is still that hold's; returns whether it was (false: the
    /// hold had ended otherwise meanwhile).
    pub fn end_released(&self, hold: &Arc<Hold>) -> bool {
        let mut map = self.0.lock().unwrap();
        let key = (hold.lock.clone(), hold.holder_id.clone());
        if !is_slots(&map, &key, hold) {
            return false;
        }
        map.remove(&key);
        true
    }

    /// Whether `hold` is still its slot's hold (not ended).
    pub fn holds(&self, hold: &Arc<Hold>) -> bool {
        let key = (hold.lock.clone(), hold.holder_id.clone());
        is_slots(&self.0.lock().unwrap(), &key, hold)
    }

    /// Why `hold`, no longer the slot's, ended: lost (410, its monitor reported it) if the slot
    /// remembers it lost, else another release of the same holder id ended it (409: this
    /// release found nothing left to release, as after that release).
    pub fn ended(&self, hold: &Hold) -> LockError {
        let map = self.0.lock().unwrap();
        let slot = map.get(&(hold.lock.clone(), hold.holder_id.clone()));
        match slot {
            Some(Slot::Lost { token, .. }) if *token == hold.token() => {
                not_held(&hold.lock, &hold.holder_id, slot)
            }
            _ => not_held(&hold.lock, &hold.holder_id, None),
        }
    }

    /// The hold of `lock`/`holder`, or why there is none: lost (410) or never held (409).
    pub fn get_held(&self, lock: &LockId, holder: &str) -> Result<Arc<Hold>, LockError> {
        let map = self.0.lock().unwrap();
        match map.get(&(lock.clone(), holder.to_string())) {
            Some(Slot::Held(h)) => Ok(h.clone()),
            other => Err(not_held(lock, holder, other)),
        }
    }

    /// Turns `hold` into a lost slot if it is still the slot's hold; returns whether it did
    /// (false: the hold had already ended, and nothing must be reported again).
    pub fn mark_lost(&self, hold: &Arc<Hold>, reason: &str) -> bool {
        let mut map = self.0.lock().unwrap();
        let key = (hold.lock.clone(), hold.holder_id.clone());
        if !is_slots(&map, &key, hold) {
            return false;
        }
        let now = Instant::now();
        map.retain(|_, s| !matches!(s, Slot::Lost { since, .. } if now - *since > LOST_MEMORY));
        let lost = Slot::Lost {
            token: hold.token(),
            reason: reason.into(),
            since: now,
        };
        map.insert(key, lost);
        true
    }

    /// Empties the registry, returning the holds it had (at shutdown).
    pub fn drain_held(&self) -> Vec<Arc<Hold>> {
        let map = std::mem::take(&mut *self.0.lock().unwrap());
        map.into_values()
            .filter_map(|s| if let Slot::Held(h) = s { Some(h) } else { None })
            .collect()
    }

    /// Whether `slot` is placing, waits with, or holds `key`: a queue key of this sidecar's
    /// that the registry knows by none of them is an orphan.
    pub fn knows(&self, slot: &SlotKey, key: &str) -> bool {
        match self.0.lock().unwrap().get(slot) {
            Some(Slot::Waiting(placing)) => placing.as_deref() == Some(key),
            Some(Slot::Held(h)) => h.ticket.key == key,
            _ => false,
        }
    }

    /// This sidecar's holds and waits, sorted by lock and holder.
    pub fn local(&self) -> Vec<LocalEntry> {
        let map = self.0.lock().unwrap();
        let mut out: Vec<LocalEntry> = map
            .iter()
            .filter_map(|((lock, holder), slot)| {
                let (state, fencing_token) = match slot {
                    Slot::Held(h) => ("held", Some(h.token())),
                    Slot::Waiting(_) => ("waiting", None),
                    Slot::Lost { .. } => return None,
                };
                Some(LocalEntry {
                    lock: lock.name.clone(),
                    holder_id: holder.clone(),
                    state,
                    fencing_token,
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.lock, &a.holder_id).cmp(&(&b.lock, &b.holder_id)));
        out
    }

    /// How many holds there are.
    pub fn held_count(&self) -> usize {
        let map = self.0.lock().unwrap();
        map.values().filter(|s| matches!(s, Slot::Held(_))).count()
    }
}

/// Why a slot could not be claimed for an acquire.
pub(crate) enum Claimed {
    /// The holder already holds this hold.
    Holds(Arc<Hold>),
    /// The holder already has an acquire in progress.
    Waits,
}

/// Whether `hold` is the hold of slot `key` in `map`.
fn is_slots(map: &BTreeMap<SlotKey, Slot>, key: &SlotKey, hold: &Arc<Hold>) -> bool {
    matches!(map.get(key), Some(Slot::Held(h)) if Arc::ptr_eq(h, hold))
}

/// The error for a release or heartbeat of a holder that does not hold.
fn not_held(lock: &LockId, holder: &str, slot: Option<&Slot>) -> LockError {
    match slot {
        Some(Slot::Lost { token, reason, .. }) => LockError::Lost {
            lock: lock.clone(),
            holder: holder.into(),
            reason: format!("{reason} (token {token})"),
        },
        Some(Slot::Waiting(_)) => LockError::NotHolder {
            lock: lock.clone(),
            holder: holder.into(),
            why: "; it is still waiting".into(),
        },
        _ => LockError::NotHolder {
            lock: lock.clone(),
            holder: holder.into(),
            why: String::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::engine::hold::Terms;
    use crate::lock::etcd::session::Session;
    use crate::lock::txn::queue::Ticket;

    fn held(registry: &Registry, holder: &str) -> Arc<Hold> {
        let lock = LockId::new("ns", "l").unwrap();
        let ticket = Ticket {
            key: format!("k/{holder}"),
            revision: 1,
            lease: 1,
        };
        let token = crate::lock::protocol::token::Token::new(0, ticket.revision).unwrap();
        let hold = Hold::new(
            lock.clone(),
            holder.into(),
            (ticket, token),
            1,
            Session::detached(15),
            Duration::ZERO,
            Terms::exclusive_now(),
        );
        let hold = Arc::new(hold);
        registry.hold((lock, holder.into()), hold.clone());
        hold
    }

    #[tokio::test(start_paused = true)]
    async fn lost_holds_are_forgotten_so_unique_holder_ids_cannot_grow_it() {
        let registry = Registry::default();
        for i in 0..1000 {
            let hold = held(&registry, &format!("run-{i}"));
            assert!(registry.mark_lost(&hold, "test"));
        }
        assert_eq!(registry.0.lock().unwrap().len(), 1000);
        tokio::time::advance(LOST_MEMORY + Duration::from_secs(1)).await;
        let hold = held(&registry, "last");
        assert!(registry.mark_lost(&hold, "test"));
        assert_eq!(
            registry.0.lock().unwrap().len(),
            1,
            "only the newest lost hold is remembered"
        );
    }

    #[tokio::test]
    async fn a_lost_hold_is_told_lost_a_released_one_not_held() {
        let registry = Registry::default();
        let lock = LockId::new("ns", "l").unwrap();
        let lost = held(&registry, "a");
        registry.mark_lost(&lost, "its key was deleted");
        assert!(matches!(
            registry.get_held(&lock, "a"),
            Err(LockError::Lost { .. })
        ));
        let released = held(&registry, "b");
        assert!(registry.end_released(&released));
        assert!(matches!(
            registry.get_held(&lock, "b"),
            Err(LockError::NotHolder { .. })
        ));
    }

    /// Two requests of one holder id release its hold at once: the one that finds it ended by
    /// the other is told it holds nothing (409), not that the hold was lost, even once the
    /// holder id holds again; a hold its monitor ended is told lost.
    #[tokio::test]
    async fn a_hold_released_by_another_request_ended_as_released_not_lost() {
        let registry = Registry::default();
        let first = held(&registry, "a");
        assert!(registry.end_released(&first));
        assert!(matches!(registry.ended(&first), LockError::NotHolder { .. }));
        let _again = held(&registry, "a");
        assert!(
            !registry.mark_lost(&first, "its key was deleted"),
            "already ended"
        );
        assert!(matches!(registry.ended(&first), LockError::NotHolder { .. }));
        let lost = held(&registry, "b");
        registry.mark_lost(&lost, "its key was deleted");
        assert!(matches!(registry.ended(&lost), LockError::Lost { .. }));
    }

    /// Finding 5 of the safety review: while an acquire of a slot was in progress, the sweep
    /// took every key of that slot as the acquire's, so an orphan of the same holder on a lease
    /// of another TTL lived as long as the holder kept retrying.
    #[test]
    fn a_waiting_slot_knows_only_the_key_it_places() {
        let registry = Registry::default();
        let slot = (LockId::new("ns", "l").unwrap(), "h".to_string());
        registry.claim(&slot).ok().unwrap();
        assert!(!registry.knows(&slot, "lease-1/h"), "nothing placed yet");
        registry.placing(&slot, "lease-2/h");
        assert!(registry.knows(&slot, "lease-2/h"));
        assert!(!registry.knows(&slot, "lease-1/h"), "an orphan of another lease");
    }
}
