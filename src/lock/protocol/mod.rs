//! The queue protocol's decisions as pure functions: where a key stands, judged from the keys
//! ahead of it, and which changes can move it. The engine makes every such decision through
//! these functions (the enqueue and a waiter's read in `txn/queue.rs` and `acquire/wait.rs`), and
//! so does the protocol model (`tests/model`), which checks them against every interleaving of
//! etcd requests, lease ends and settings changes it explores. Nothing here reads etcd.

pub(super) mod entry;
pub mod epoch;
pub mod handoff;
pub(super) mod keys;
pub(super) mod names;
mod position;
pub(super) mod token;

pub use self::entry::Ask;
use self::entry::Entry;
pub use self::entry::Mode;
pub(super) use self::position::Standing;
pub use self::position::{Ahead, Position};
use crate::lock::bugs::{self, Bug};

impl Ahead {
    /// A key read without its value ([`keys_needed`] said none was needed), or whose value is
    /// not an entry: it counts as exclusive, granted and of one permit, so it blocks nobody
    /// beyond its place.
    pub fn without_value(key: Vec<u8>) -> Self {
        Ahead {
            key,
            granted: true,
            mode: Mode::Exclusive,
            permits: 1,
        }
    }
}

/// How many keys ahead of a key in `mode` a position read returns, nearest first, and whether
/// with their values (without: pass them as [`Ahead::without_value`]).
pub fn keys_needed(max_holders: u32, mode: Mode) -> (u32, bool) {
    self::position::keys_needed(max_holders, mode)
}

/// Where a key asking `ask` stands with `ahead` before it (nearest first, as many as
/// [`keys_needed`] says for its mode), `more` if further keys are ahead of those, in a lock of
/// `max_holders` slots. [`Position::Holder`]: it holds the lock from this read on.
pub fn position(ahead: &[Ahead], more: bool, max_holders: u32, ask: Ask) -> Position {
    self::position::decide(ahead, more, max_holders, ask)
}

/// A queue key as the views of who holds see it: what it asks and what its entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    /// Its mode and permits.
    pub ask: Ask,
    /// Its entry records its grant (`acquiredAt`): a grant for the keys behind it too.
    pub recorded: bool,
    /// A release handed it its grant (direct handoff): it holds, but the keys behind it wait
    /// until its owner records the grant.
    pub handed: bool,
    /// A multi-lock key: it holds nothing until it records its grant on every lock of its set.
    pub set: bool,
}

impl Queued {
    /// A key whose value is not an entry: it blocks like a granted exclusive key.
    pub const FOREIGN: Queued = Queued {
        ask: Ask::one(Mode::Exclusive),
        recorded: true,
        handed: false,
        set: false,
    };

    /// What the rule of who holds reads of a queue key's `entry` (`None`: the key's value is
    /// not an entry).
    pub fn of(entry: Option<&Entry>) -> Queued {
        match entry {
            Some(e) => Queued {
                ask: e.ask(),
                recorded: e.is_granted(),
                handed: e.handed,
                set: !e.with.is_empty(),
            },
            None => Queued::FOREIGN,
        }
    }
}

/// How many of a queue's leading keys hold, the whole queue given in order: the one rule of
/// who holds. Status, `GET /v1/locks/{name}`, the holder Service, the fence check, a force
/// release and the holder gauge all count holders by it, and so does the protocol model,
/// which checks that the keys it names are exactly those of the clients that hold (or are let
/// in by their next read). A key holds if its grant is on record (`acquiredAt`, or handed on
/// by a release), so a hold granted before `maxHolders` was lowered goes on until it ends; or
/// if [`position`] lets it in now under `max_holders` (the grant its owner is about to learn),
/// unless it is a multi-lock key, which holds only once admitted on all its locks. Grants wait
/// for every key ahead to record its own, so the holders are always the queue's first keys.
pub fn holders(queue: &[Queued], max_holders: u32) -> usize {
    (0..queue.len())
        .take_while(|&i| holds(queue, i, max_holders))
        .count()
}

/// Whether the `i`-th key of `queue` holds (see [`holders`]).
fn holds(queue: &[Queued], i: usize, max_holders: u32) -> bool {
    let key = queue[i];
    if key.recorded || key.handed {
        return true;
    }
    if key.set {
        return false;
    }
    let (needed, _) = keys_needed(max_holders, key.ask.mode);
    let ahead: Vec<Ahead> = (queue[..i].iter().rev().take(needed as usize).zip(0u32..))
        .map(|(k, n)| Ahead {
            key: n.to_be_bytes().to_vec(),
            granted: k.recorded,
            mode: k.ask.mode,
            permits: k.ask.permits,
        })
        .collect();
    let more = i > needed as usize;
    position(&ahead, more, max_holders, key.ask) == Position::Holder
}

/// What a watched key must do to wake a waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeOn {
    /// Be deleted.
    Deletion,
    /// Be deleted or written (a waiter's grant record).
    Any,
}

/// The keys whose change can let a waiter at `pos` in, and which change. Every waiter also
/// watches its own key for deletion and the lock's settings key for any change; an event on
/// any of them makes it read its position again.
pub fn wakes(pos: &Position, max_holders: u32) -> Vec<(Vec<u8>, WakeOn)> {
    let each = |keys: &[Vec<u8>], on| keys.iter().map(|k| (k.clone(), on)).collect();
    match pos {
        Position::FirstWaiter(holders) => each(holders, WakeOn::Deletion),
        // Behind a key still waiting in a semaphore: its grant record moves this one up too.
        Position::Waiter(pred) if max_holders > 1 && !bugs::on(Bug::PredecessorDeletionOnly) => {
            vec![(pred.clone(), WakeOn::Any)]
        }
        Position::Waiter(pred) => vec![(pred.clone(), WakeOn::Deletion)],
        Position::BehindUngranted(key) => vec![(key.clone(), WakeOn::Any)],
        Position::BehindOtherMode(key) => vec![(key.clone(), WakeOn::Deletion)],
        Position::Holder | Position::Gone | Position::TooLarge => vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use Mode::{Exclusive as X, Shared as S};

    /// Keys of these modes, each recorded or not.
    fn queue(spec: &[(Mode, bool)]) -> Vec<Queued> {
        (spec.iter())
            .map(|&(mode, recorded)| Queued {
                ask: Ask::one(mode),
                recorded,
                handed: false,
                set: false,
            })
            .collect()
    }

    fn held(spec: &[(Mode, bool)], max: u32) -> usize {
        holders(&queue(spec), max)
    }

    #[test]
    fn holders_are_the_leading_keys_the_rule_admits_or_that_record_their_grant() {
        assert_eq!(held(&[], 1), 0);
        assert_eq!(held(&[(X, false), (X, false)], 1), 1, "a mutex granted at once");
        assert_eq!(held(&[(X, true), (X, true), (X, false)], 2), 2);
        assert_eq!(
            held(&[(X, true), (S, false), (X, false)], 3),
            1,
            "a reader never holds beside a writer"
        );
        assert_eq!(
            held(&[(S, true), (S, false), (X, false), (S, false)], 1),
            2,
            "readers ahead of a writer hold, whatever the limit"
        );
        assert_eq!(held(&[(X, false)], 0), 0);
    }

    /// Finding 7 of the edges review: the fence check counted keys by position, so the third
    /// key of a semaphore of 3 was current while the second had not recorded its grant: a
    /// waiter, which the rule lets in only after that record.
    #[test]
    fn a_key_behind_an_unrecorded_grant_is_a_waiter() {
        assert_eq!(held(&[(X, true), (X, false), (X, false)], 3), 2);
    }

    /// Finding 5: status, `GET` and a force release counted holders under a lowered
    /// `maxHolders` only, while the holds granted before go on until they end.
    #[test]
    fn holds_granted_before_a_lowering_still_hold() {
        assert_eq!(held(&[(X, true), (X, true), (X, false)], 1), 2);
        assert_eq!(held(&[(X, true), (X, true), (X, true)], 1), 3);
    }

    #[test]
    fn weighted_holders_fit_their_permits_and_keep_them_after_a_lowering() {
        let mut q = queue(&[(X, true), (X, false), (X, false)]);
        q[0].ask.permits = 2;
        assert_eq!(holders(&q, 3), 2, "a hold of 2 and one of 1 fill 3 slots");
        q[1].ask.permits = 2;
        assert_eq!(holders(&q, 3), 1, "a request of 2 waits beside a hold of 2");
        q[1].recorded = true;
        assert_eq!(holders(&q, 3), 2, "granted before a lowering, it holds on");
    }

    #[test]
    fn a_handed_key_holds_and_a_waiting_set_key_holds_nothing() {
        let mut q = queue(&[(X, false), (X, false)]);
        q[0].handed = true;
        assert_eq!(holders(&q, 1), 1);
        let mut q = queue(&[(X, true), (X, false), (X, false)]);
        q[1].set = true;
        assert_eq!(
            holders(&q, 3),
            1,
            "a set key not yet admitted everywhere, and the key behind it"
        );
        q[1].recorded = true;
        assert_eq!(holders(&q, 3), 3);
    }
}
