//! Where a key stands in its lock's queue, judged from the keys just ahead of it: the rule
//! alone, with no etcd type. The enqueue transaction reads those keys in the same step as it
//! puts the key ([`queue::enqueue`]), and a waiter reads them again when something it watches
//! changes ([`wait`]); both decode what etcd returned in `txn/queue.rs` (`of_keys`) and reach
//! the rule through [`protocol`](super), as the protocol model does.
//!
//! [`queue::enqueue`]: crate::lock::txn::queue::enqueue
//! [`wait`]: crate::lock::acquire::wait

use super::entry::{Ask, Mode, Successor};

/// How many keys ahead of it a shared key reads at once: a page of shared holders. Behind a
/// longer run of them it waits for the farthest of the page first.
pub const SHARED_PAGE: u32 = 256;

/// Where a ticket stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// Its permits and those of the keys ahead of it fit in `max_holders`, every key ahead of
    /// it granted: it holds the lock.
    Holder,
    /// Its key is gone (lease ended, key or lock deleted).
    Gone,
    /// Just behind a full window: these keys (the holders, and in a weighted semaphore maybe
    /// waiters too) are all that is ahead of it, and their permits leave too few for its own.
    /// Only a deletion among them (or a raised `maxHolders`) can let it in.
    FirstWaiter(Vec<Vec<u8>>),
    /// Further back: the key right ahead of it.
    Waiter(Vec<u8>),
    /// Inside the window, behind keys that have not recorded their grants yet: the oldest of
    /// them.
    BehindUngranted(Vec<u8>),
    /// It asks for more permits than the lock has slots (`maxHolders` was lowered since it was
    /// placed): no release can let it in, and as FIFO lets nobody pass it, it would hold up
    /// every key behind it. Its acquire leaves the queue and is refused, as it would be if
    /// made now.
    TooLarge,
    /// Behind a key of the other mode (the nearest ahead of it), holding or waiting: it waits
    /// for that key to go. Shared and exclusive holds never hold together, and a waiting writer
    /// is never overtaken by later readers. (A shared key behind more shared keys than a page
    /// waits for the farthest of the page.)
    BehindOtherMode(Vec<u8>),
}

/// A queue at most this long lets its waiters in within etcd's watch catch-up period (100 ms),
/// at the 1.5 to 3 ms a handoff takes on a 2-core machine (bench/README.md); behind more keys,
/// a watch etcd serves late is synced long before it matters.
const NEAR_QUEUE: i64 = 32;

/// Where a ticket stood at a revision of its lock's queue.
#[derive(Debug, Clone)]
pub struct Standing {
    /// Where it stood.
    pub position: Position,
    /// The revision of the read.
    pub revision: i64,
    /// How many keys the queue held (ahead of the ticket and behind it).
    pub queued: i64,
    /// The keys right behind it, if it holds a mutex and they were read: its chain to hand
    /// the lock on to ([`handoff`](crate::lock::txn::handoff)).
    pub chain: Vec<Successor>,
    /// Behind a key that has not recorded its grant ([`Position::BehindUngranted`]): whether
    /// that key holds and is recording its grant (a write on its way), rather than a
    /// multi-lock key waiting for its other locks (which may take any time).
    pub recording: bool,
}

impl Standing {
    /// Whether the ticket's turn may come within etcd's watch catch-up period: it is next to
    /// be let in, or the queue is short. Such a waiter's watches must be served at once (see
    /// [`Etcd::watch_keys_synced`]).
    ///
    /// [`Etcd::watch_keys_synced`]: crate::lock::etcd::Etcd::watch_keys_synced
    pub fn turn_is_near(&self) -> bool {
        !matches!(self.position, Position::Waiter(_)) || self.queued <= NEAR_QUEUE
    }
}

/// A key ahead of the one being placed, as the rule sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ahead {
    /// The queue key.
    pub key: Vec<u8>,
    /// Whether its entry records its grant (`acquiredAt` written). A grant waits until every
    /// key ahead of it in the window is granted, so that grants, and with them fencing tokens,
    /// follow the queue order however the window (`maxHolders`) changes.
    pub granted: bool,
    /// Its mode.
    pub mode: Mode,
    /// How many slots it takes.
    pub permits: u32,
}

/// How many keys ahead of a key in `mode` its position needs, and whether their values.
pub fn keys_needed(max_holders: u32, mode: Mode) -> (u32, bool) {
    match (max_holders, mode) {
        (_, Mode::Shared) => (SHARED_PAGE, true),
        (1, Mode::Exclusive) => (1, false), // a mutex's exclusive grant needs no one's value
        (max, Mode::Exclusive) => (max, true),
    }
}

/// The queue's rule, for any `max_holders`: a shared key holds once every key ahead of it is
/// shared and granted; an exclusive key holds once its permits and those of the keys ahead of
/// it fit in `max_holders`, all of them exclusive and granted. At `max_holders` 1 that is a
/// reader-writer lock, without shared keys a semaphore (weighted, where keys ask for more than
/// one permit); and when `maxHolders` changes under queued keys of both modes, a writer is
/// still never granted beside a reader. Grants follow the queue: a key that does not fit is
/// never passed by a smaller one behind it, which would fit, so that a large request is not
/// starved by a stream of small ones. `ahead` is nearest first, as many as [`keys_needed`]
/// says (every key takes a permit at least, so `max_holders` keys ahead leave none);
/// `more` if further keys are ahead of those.
pub fn decide(ahead: &[Ahead], more: bool, max_holders: u32, ask: Ask) -> Position {
    let in_window = ahead.len() < max_holders as usize;
    match ask.mode {
        Mode::Shared => place_shared(ahead, more),
        Mode::Exclusive if ask.permits > max_holders => Position::TooLarge,
        Mode::Exclusive => match ahead.iter().find(|a| a.mode == Mode::Shared) {
            Some(reader) if in_window => Position::BehindOtherMode(reader.key.clone()),
            _ => place(ahead, more, max_holders, ask.permits),
        },
    }
}

/// The position of a shared key: it holds once every key ahead of it is shared and granted
/// (grants, and tokens, in queue order), else it waits for the nearest exclusive key ahead to
/// go.
fn place_shared(ahead: &[Ahead], more: bool) -> Position {
    if let Some(writer) = ahead.iter().find(|a| a.mode == Mode::Exclusive) {
        return Position::BehindOtherMode(writer.key.clone());
    }
    match ahead.last() {
        Some(farthest) if more => Position::BehindOtherMode(farthest.key.clone()),
        _ => first_ungranted(ahead),
    }
}

/// The position of a key asking `permits` with `ahead` before it, nearest first, at most
/// `max_holders`; `more` if further keys are ahead of those.
fn place(ahead: &[Ahead], more: bool, max_holders: u32, permits: u32) -> Position {
    let taken: u64 = ahead.iter().map(|a| u64::from(a.permits)).sum();
    if !more && taken + u64::from(permits) <= max_holders.into() {
        first_ungranted(ahead)
    } else if !more {
        Position::FirstWaiter(ahead.iter().map(|a| a.key.clone()).collect())
    } else {
        Position::Waiter(ahead[0].key.clone())
    }
}

/// Holder if every key ahead (all inside the window) is granted, else behind the oldest one
/// that is not: the next grant in queue order.
fn first_ungranted(ahead: &[Ahead]) -> Position {
    match ahead.iter().rev().find(|a| !a.granted) {
        Some(a) => Position::BehindUngranted(a.key.clone()),
        None => Position::Holder,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const X: Mode = Mode::Exclusive;
    const S: Mode = Mode::Shared;

    /// Keys ahead, nearest first: (key, granted, mode).
    fn keys(spec: &[(&str, bool, Mode)]) -> Vec<Ahead> {
        (spec.iter())
            .map(|&(k, granted, mode)| Ahead {
                key: k.as_bytes().to_vec(),
                granted,
                mode,
                permits: 1,
            })
            .collect()
    }

    fn key(k: &str) -> Vec<u8> {
        k.as_bytes().to_vec()
    }

    #[test]
    fn a_mutex_is_held_by_the_first_key_only() {
        assert_eq!(decide(&[], false, 1, Ask::one(X)), Position::Holder);
        let ahead = keys(&[("a", true, X)]);
        assert_eq!(
            decide(&ahead, false, 1, Ask::one(X)),
            Position::FirstWaiter(vec![key("a")])
        );
        let ahead = keys(&[("b", false, X)]);
        assert_eq!(decide(&ahead, true, 1, Ask::one(X)), Position::Waiter(key("b")));
    }

    #[test]
    fn a_semaphore_grants_in_queue_order() {
        // Inside the window of 3, but the key ahead has not recorded its grant yet.
        let ahead = keys(&[("b", false, X), ("a", true, X)]);
        assert_eq!(
            decide(&ahead, false, 3, Ask::one(X)),
            Position::BehindUngranted(key("b"))
        );
        let ahead = keys(&[("b", true, X), ("a", true, X)]);
        assert_eq!(decide(&ahead, false, 3, Ask::one(X)), Position::Holder);
        // Behind several unrecorded grants: the oldest is the next in queue order.
        let ahead = keys(&[("c", false, X), ("b", false, X), ("a", true, X)]);
        assert_eq!(
            decide(&ahead, false, 4, Ask::one(X)),
            Position::BehindUngranted(key("b"))
        );
    }

    /// Keys ahead, nearest first, all exclusive: (key, granted, permits).
    fn weighted(spec: &[(&str, bool, u32)]) -> Vec<Ahead> {
        (spec.iter())
            .map(|&(k, granted, permits)| Ahead {
                permits,
                ..keys(&[(k, granted, X)]).remove(0)
            })
            .collect()
    }

    fn asks(permits: u32) -> Ask {
        Ask { mode: X, permits }
    }

    #[test]
    fn a_weighted_key_holds_once_its_permits_fit_beside_those_ahead() {
        // A semaphore of 3: a hold of 2 and one of 1 fill it.
        let ahead = weighted(&[("b", true, 1), ("a", true, 2)]);
        assert_eq!(
            decide(&ahead, false, 3, asks(1)),
            Position::FirstWaiter(vec![key("b"), key("a")])
        );
        let ahead = weighted(&[("a", true, 2)]);
        assert_eq!(decide(&ahead, false, 3, asks(1)), Position::Holder);
        assert_eq!(
            decide(&ahead, false, 3, asks(2)),
            Position::FirstWaiter(vec![key("a")])
        );
        // A request above the limit in force (lowered since it was made) can never be let in.
        assert_eq!(decide(&[], false, 1, asks(2)), Position::TooLarge);
        assert_eq!(decide(&ahead, false, 1, asks(2)), Position::TooLarge);
        assert_eq!(decide(&[], false, 2, asks(2)), Position::Holder);
    }

    /// FIFO: a request that does not fit is not passed by a smaller one behind it, even one
    /// that would fit beside the holders.
    #[test]
    fn a_small_request_never_passes_a_large_one_ahead() {
        // Holders of 1 and 1 in a semaphore of 3; a request of 2 waits; one of 1 behind it.
        let ahead = weighted(&[("c", false, 2), ("b", true, 1), ("a", true, 1)]);
        assert_eq!(
            decide(&ahead, false, 3, asks(1)),
            Position::FirstWaiter(vec![key("c"), key("b"), key("a")])
        );
        // Where the request of 2 fits (a semaphore of 4), the one behind waits for its grant
        // record: grants, and tokens, in queue order.
        assert_eq!(
            decide(&ahead, false, 4, asks(1)),
            Position::FirstWaiter(vec![key("c"), key("b"), key("a")])
        );
        let ahead = weighted(&[("c", false, 2), ("b", true, 1)]);
        assert_eq!(
            decide(&ahead, false, 4, asks(1)),
            Position::BehindUngranted(key("c"))
        );
    }

    #[test]
    fn shared_keys_share_but_never_overtake_an_exclusive_one() {
        // Readers ahead, all granted: in. One not yet granted: after it.
        let ahead = keys(&[("r2", true, S), ("r1", true, S)]);
        assert_eq!(decide(&ahead, false, 1, Ask::one(S)), Position::Holder);
        let ahead = keys(&[("r2", false, S), ("r1", true, S)]);
        assert_eq!(
            decide(&ahead, false, 1, Ask::one(S)),
            Position::BehindUngranted(key("r2"))
        );
        // A writer ahead (waiting behind a reader, or holding): wait for it to go.
        let ahead = keys(&[("w", false, X), ("r1", true, S)]);
        assert_eq!(
            decide(&ahead, false, 1, Ask::one(S)),
            Position::BehindOtherMode(key("w"))
        );
        // More readers ahead than a page: the farthest of the page first.
        let ahead = keys(&[("r2", true, S), ("r1", true, S)]);
        assert_eq!(
            decide(&ahead, true, 1, Ask::one(S)),
            Position::BehindOtherMode(key("r1"))
        );
    }

    /// Finding 4 of the safety review: `maxHolders` raised to 2 while a reader holds and a
    /// writer waits used to admit the writer beside the reader (every key counted one slot).
    #[test]
    fn a_raised_max_holders_never_puts_a_writer_beside_a_reader() {
        let reader = keys(&[("r1", true, S)]);
        assert_eq!(
            decide(&reader, false, 2, Ask::one(X)),
            Position::BehindOtherMode(key("r1"))
        );
        let writer = keys(&[("w", true, X)]);
        assert_eq!(
            decide(&writer, false, 2, Ask::one(S)),
            Position::BehindOtherMode(key("w"))
        );
        // Writers still share a semaphore's slots with writers, readers with readers.
        assert_eq!(decide(&writer, false, 2, Ask::one(X)), Position::Holder);
        let readers = keys(&[("r2", true, S), ("r1", true, S)]);
        assert_eq!(decide(&readers, false, 2, Ask::one(S)), Position::Holder);
        // Behind a full window the count decides first, as in any semaphore.
        let full = keys(&[("w", true, X), ("r1", true, S)]);
        assert_eq!(
            decide(&full, false, 2, Ask::one(X)),
            Position::FirstWaiter(vec![key("w"), key("r1")])
        );
    }

    #[test]
    fn only_a_waiter_far_back_in_a_long_queue_has_its_turn_far_off() {
        let standing = |position, queued| Standing {
            position,
            revision: 7,
            queued,
            chain: vec![],
            recording: false,
        };
        let back = Position::Waiter(key("b"));
        assert!(standing(back.clone(), NEAR_QUEUE).turn_is_near());
        assert!(!standing(back, NEAR_QUEUE + 1).turn_is_near());
        let first = Position::FirstWaiter(vec![key("a")]);
        assert!(standing(first, 1000).turn_is_near());
    }

    #[test]
    fn behind_a_full_window_waiters_watch_holders_or_their_predecessor() {
        let ahead = keys(&[("b", true, X), ("a", true, X)]);
        let first = Position::FirstWaiter(vec![key("b"), key("a")]);
        assert_eq!(decide(&ahead, false, 2, Ask::one(X)), first);
        assert_eq!(decide(&ahead, true, 2, Ask::one(X)), Position::Waiter(key("b")));
    }
}
