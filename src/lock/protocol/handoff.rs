//! Direct handoff's rule: to whom a release may hand its grant, and what its transaction must
//! find unchanged for that grant to be the one a read would give. The engine builds a holder's
//! chain and its release's transaction from these (`txn/handoff.rs`); the protocol model hands
//! on by the same functions and checks each [`Guard`] against its state.

use super::entry::{Ask, Mode};
use crate::lock::bugs::{self, Bug};

/// A key as the handoff rule sees it: what it asks, and whether it is a multi-lock key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Party {
    /// Its mode and permits.
    pub ask: Ask,
    /// A key of a multi-lock set: it holds only once admitted on every lock of its set.
    pub set: bool,
}

/// Whether `key` may be handed a grant at all: an exclusive key of a single lock. A shared key
/// never is (readers granted together would learn their grants in any order, and fencing
/// tokens would fall: the model's "handoff to a run of readers"), nor is a multi-lock key.
pub fn may_be_handed(key: Party) -> bool {
    key.ask.mode == Mode::Exclusive && !key.set
}

/// Whether `holder` may hand its grant to `next`, the key right behind it: both may be handed
/// a grant, and `next` asks for no more permits than `holder` holds. The keys ahead of `next`
/// are then some of those that were ahead of the holder, whose permits left room for the
/// holder's, so they leave room for `next`'s too (the model's "permits ignored by a handoff"
/// shows the limit broken otherwise).
pub fn may_hand(holder: Party, next: Party) -> bool {
    let fits = next.ask.permits <= holder.ask.permits || bugs::on(Bug::HandoffIgnoresPermits);
    may_be_handed(holder) && may_be_handed(next) && fits
}

/// What a release's transaction must find as it was when the holder's grant was decided, for
/// the grant it hands on to be the one a read would give. Where one fails, the release is the
/// plain guarded delete and the key behind wakes on the deletion and reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// The holder's own key is still in place (its create revision): it still holds.
    HolderInPlace,
    /// The lock's settings are those its grant was decided under.
    SettingsUnchanged,
    /// The key behind is untouched since its enqueue (mod revision = create revision): not
    /// given up and enqueued again, not granted by a read already.
    SuccessorUntouched,
}

/// Every guard of a handoff, each a compare of the release's transaction.
pub const GUARDS: [Guard; 3] = [
    Guard::HolderInPlace,
    Guard::SettingsUnchanged,
    Guard::SuccessorUntouched,
];

#[cfg(test)]
mod tests {
    use super::*;

    fn party(mode: Mode, permits: u32, set: bool) -> Party {
        Party {
            ask: Ask { mode, permits },
            set,
        }
    }

    #[test]
    fn only_an_exclusive_single_lock_key_is_handed_a_grant() {
        assert!(may_be_handed(party(Mode::Exclusive, 1, false)));
        assert!(!may_be_handed(party(Mode::Shared, 1, false)));
        assert!(!may_be_handed(party(Mode::Exclusive, 1, true)));
    }

    /// The model's "permits ignored by a handoff": a hold of 1 handing its slot to a request
    /// of 2 puts 2 more permits beside the holds ahead, which left room for 1.
    #[test]
    fn a_holder_hands_on_only_to_a_request_no_larger() {
        let x = |permits| party(Mode::Exclusive, permits, false);
        assert!(!may_hand(x(1), x(2)));
        assert!(may_hand(x(2), x(2)));
        assert!(may_hand(x(2), x(1)));
        assert!(
            !may_hand(party(Mode::Shared, 1, false), x(1)),
            "a reader hands nothing on"
        );
        assert!(
            !may_hand(party(Mode::Exclusive, 1, true), x(1)),
            "nor a set's key"
        );
    }
}
