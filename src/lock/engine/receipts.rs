//! The release receipts' slots of this sidecar's releases in flight (see `txn/receipt.rs`).
//!
//! A release puts its receipt at a slot of its lock and lease: the smallest slot that no other
//! release of this sidecar on the same lock and lease uses while it waits for its answer. Two
//! holder ids of one pod releasing the same lock at once thus never write over each other's
//! receipt, and a receipt is written over only by a release that started after the one that
//! put it was answered (issue #54, F5). The keys stay as few as before: one per lock and
//! lease, and one more per release in flight beside it.
//!
//! A slot is free again once its release was answered. A release that was not (etcd failed
//! for its whole budget, or its caller went away) may still have a copy on its way to etcd,
//! which would put its receipt late: its slot stays taken for [`LATE_COPIES`] more.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::lock::bugs::{self, Bug};
use crate::lock::protocol::names::LockId;

/// How long the slot of a release that got no answer stays taken: past the 5 s budget of a
/// request and etcd's own 7 s request timeout, after which no copy of it is applied.
pub(crate) const LATE_COPIES: Duration = Duration::from_secs(15);

/// The slots in use, per lock and lease.
type InUse = BTreeMap<(LockId, i64), BTreeSet<u32>>;

/// The slots of the releases in flight (cheap to clone).
#[derive(Clone, Default)]
pub(crate) struct ReceiptSlots(Arc<Mutex<InUse>>);

impl ReceiptSlots {
    /// Takes the smallest free slot of `lock` and `lease` for a release.
    pub fn take(&self, lock: &LockId, lease: i64) -> ReceiptSlot {
        let mut in_use = self.0.lock().unwrap();
        let taken = in_use.entry((lock.clone(), lease)).or_default();
        let free = (0..).find(|n| !taken.contains(n)).expect("a free slot");
        let slot = if bugs::on(Bug::ReceiptPerLease) { 0 } else { free };
        taken.insert(slot);
        ReceiptSlot {
            slots: self.clone(),
            key: (lock.clone(), lease),
            slot,
            answered: false,
        }
    }

    /// How many slots are taken, over every lock and lease.
    pub fn taken(&self) -> usize {
        self.0.lock().unwrap().values().map(BTreeSet::len).sum()
    }

    fn free(&self, key: &(LockId, i64), slot: u32) {
        let mut in_use = self.0.lock().unwrap();
        if let Some(taken) = in_use.get_mut(key) {
            taken.remove(&slot);
            if taken.is_empty() {
                in_use.remove(key);
            }
        }
    }
}

/// One release's slot, freed when dropped: at once if the release was answered, else after
/// [`LATE_COPIES`].
pub(crate) struct ReceiptSlot {
    slots: ReceiptSlots,
    key: (LockId, i64),
    slot: u32,
    answered: bool,
}

impl ReceiptSlot {
    /// The slot's number.
    pub fn get(&self) -> u32 {
        self.slot
    }

    /// The release was answered: no copy of it is left to put the receipt later.
    pub fn answered(&mut self) {
        self.answered = true;
    }
}

impl Drop for ReceiptSlot {
    fn drop(&mut self) {
        let (slots, key, slot) = (self.slots.clone(), self.key.clone(), self.slot);
        match (self.answered, tokio::runtime::Handle::try_current()) {
            (false, Ok(runtime)) => drop(runtime.spawn(async move {
                tokio::time::sleep(LATE_COPIES).await;
                slots.free(&key, slot);
            })),
            // Answered, or no runtime left to run a release on at all.
            _ => slots.free(&key, slot),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slot a release would take now (answered at once: it frees it again).
    fn next(slots: &ReceiptSlots, lock: &LockId, lease: i64) -> u32 {
        let mut slot = slots.take(lock, lease);
        slot.answered();
        slot.get()
    }

    #[tokio::test(start_paused = true)]
    async fn releases_in_flight_take_their_own_slots_and_free_them() {
        let slots = ReceiptSlots::default();
        let (a, b) = (LockId::new("ns", "a").unwrap(), LockId::new("ns", "b").unwrap());
        let mut first = slots.take(&a, 7);
        let second = slots.take(&a, 7);
        assert_eq!(
            (first.get(), second.get()),
            (0, 1),
            "two releases of one lock at once"
        );
        assert_eq!(next(&slots, &b, 7), 0, "another lock has slots of its own");
        assert_eq!(next(&slots, &a, 8), 0, "and so has another lease");
        assert_eq!(next(&slots, &a, 7), 2);
        first.answered();
        drop(first);
        assert_eq!(
            next(&slots, &a, 7),
            0,
            "an answered release frees its slot at once"
        );
        drop(second); // unanswered: a copy of it may still land
        assert_eq!(next(&slots, &a, 7), 0);
        assert_eq!(slots.taken(), 1, "slot 1 stays taken a while");
        tokio::time::sleep(LATE_COPIES).await;
        tokio::task::yield_now().await;
        assert_eq!(slots.taken(), 0, "nothing left once every release is done");
        assert!(slots.0.lock().unwrap().is_empty(), "nor any lock's entry");
    }
}
