//! Where a key stands in its lock's queue, judged from the keys just ahead of it. The enqueue
//! transaction reads those keys in the same step as it puts the key ([`queue::enqueue`]), and a
//! waiter reads them again when something it watches changes ([`wait`]).
//!
//! [`queue::enqueue`]: super::queue::enqueue
//! [`wait`]: super::wait

use etcd_client::KeyValue;

use super::keys::{Entry, Mode};

/// How many keys ahead of it a shared key reads at once: a page of shared holders. Behind a
/// longer run of them it waits for the farthest of the page first.
pub const SHARED_PAGE: u32 = 256;

/// Where a ticket stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// Among the first `max_holders` keys, every key ahead of it granted: it holds the lock.
    Holder,
    /// Its key is gone (lease ended, key or lock deleted).
    Gone,
    /// Just behind a full window: these keys (the holders) are all that is ahead of it.
    FirstWaiter(Vec<Vec<u8>>),
    /// Further back: the key right ahead of it.
    Waiter(Vec<u8>),
    /// Inside the window, behind a key that has not recorded its grant yet.
    BehindUngranted(Vec<u8>),
    /// A shared key behind an exclusive one (the nearest ahead of it), holding or waiting: it
    /// waits for that key to go, so that a waiting writer is never overtaken by later readers.
    /// (Behind more shared keys than a page, it waits for the farthest of the page.)
    BehindExclusive(Vec<u8>),
}

/// A queue at most this long lets its waiters in within etcd's watch catch-up period (100 ms),
/// at the 1.5 to 3 ms a handoff takes on a 2-core machine (bench/README.md); behind more keys,
/// a watch etcd serves late is synced long before it matters.
const NEAR_QUEUE: i64 = 32;

/// Where a ticket stood at a revision of its lock's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    /// Where it stood.
    pub position: Position,
    /// The revision of the read.
    pub revision: i64,
    /// How many keys the queue held (ahead of the ticket and behind it).
    pub queued: i64,
}

impl Standing {
    /// Whether the ticket's turn may come within etcd's watch catch-up period: it is next to
    /// be let in, or the queue is short. Such a waiter's watches must be served at once (see
    /// [`Etcd::watch_keys_synced`]).
    ///
    /// [`Etcd::watch_keys_synced`]: super::etcd::Etcd::watch_keys_synced
    pub fn turn_is_near(&self) -> bool {
        !matches!(self.position, Position::Waiter(_)) || self.queued <= NEAR_QUEUE
    }
}

/// Whether a queue entry records that it was granted (its `acquiredAt` is written). A grant
/// waits until every key ahead of it in the window is granted, so that grants, and with them
/// fencing tokens, follow the queue order however the window (`maxHolders`) changes. A value
/// that is not an entry (or a key read without its value) blocks nobody.
pub(crate) fn granted(kv: &KeyValue) -> bool {
    serde_json::from_slice::<Entry>(kv.value()).map_or(true, |e| e.acquired_at.is_some())
}

/// The mode of a queue entry (a value that is not an entry counts as exclusive).
fn mode(kv: &KeyValue) -> Mode {
    serde_json::from_slice::<Entry>(kv.value()).map_or(Mode::Exclusive, |e| e.mode)
}

/// How many keys ahead of a key in `mode` its position needs, and whether their values.
pub fn keys_needed(max_holders: u32, mode: Mode) -> (u32, bool) {
    match (max_holders, mode) {
        (1, Mode::Shared) => (SHARED_PAGE, true),
        (1, Mode::Exclusive) => (1, false), // a mutex's exclusive grant needs no one's value
        (max, _) => (max, true),
    }
}

/// The position of a key in `mode` with `ahead` before it, nearest first (as many as
/// [`keys_needed`] says); `more` if further keys are ahead of those.
pub fn of_keys(ahead: &[KeyValue], more: bool, max_holders: u32, mode: Mode) -> Position {
    let keyed: Vec<_> = (ahead.iter())
        .map(|kv| (kv.key().to_vec(), granted(kv)))
        .collect();
    if max_holders == 1 && mode == Mode::Shared {
        let shared: Vec<_> = ahead.iter().map(|kv| self::mode(kv) == Mode::Shared).collect();
        return place_shared(&keyed, &shared, more);
    }
    place(&keyed, more, max_holders)
}

/// The position of a shared key in a reader-writer lock: it holds once every key ahead of it
/// is shared and granted (grants, and tokens, in queue order), else it waits for the nearest
/// exclusive key ahead to go. `shared[i]` is the mode of `ahead[i]`.
fn place_shared(ahead: &[(Vec<u8>, bool)], shared: &[bool], more: bool) -> Position {
    if let Some(i) = shared.iter().position(|s| !s) {
        return Position::BehindExclusive(ahead[i].0.clone());
    }
    match ahead.last() {
        Some((farthest, _)) if more => Position::BehindExclusive(farthest.clone()),
        _ => match ahead.iter().find(|(_, granted)| !granted) {
            Some((key, _)) => Position::BehindUngranted(key.clone()),
            None => Position::Holder,
        },
    }
}

/// The position of a key with `ahead` before it: (key, granted), nearest first, at most
/// `max_holders`; `more` if further keys are ahead of those.
fn place(ahead: &[(Vec<u8>, bool)], more: bool, max_holders: u32) -> Position {
    if ahead.len() < max_holders as usize {
        match ahead.iter().find(|(_, granted)| !granted) {
            Some((key, _)) => Position::BehindUngranted(key.clone()),
            None => Position::Holder,
        }
    } else if !more {
        Position::FirstWaiter(ahead.iter().map(|(key, _)| key.clone()).collect())
    } else {
        Position::Waiter(ahead[0].0.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(spec: &[(&str, bool)]) -> Vec<(Vec<u8>, bool)> {
        spec.iter().map(|(k, g)| (k.as_bytes().to_vec(), *g)).collect()
    }

    #[test]
    fn a_mutex_is_held_by_the_first_key_only() {
        assert_eq!(place(&[], false, 1), Position::Holder);
        assert_eq!(
            place(&keys(&[("a", true)]), false, 1),
            Position::FirstWaiter(vec![b"a".to_vec()])
        );
        assert_eq!(
            place(&keys(&[("b", false)]), true, 1),
            Position::Waiter(b"b".to_vec())
        );
    }

    #[test]
    fn a_semaphore_grants_in_queue_order() {
        // Inside the window of 3, but the key ahead has not recorded its grant yet.
        let ahead = keys(&[("b", false), ("a", true)]);
        assert_eq!(place(&ahead, false, 3), Position::BehindUngranted(b"b".to_vec()));
        let ahead = keys(&[("b", true), ("a", true)]);
        assert_eq!(place(&ahead, false, 3), Position::Holder);
    }

    #[test]
    fn shared_keys_share_but_never_overtake_an_exclusive_one() {
        // Readers ahead, all granted: in. One not yet granted: after it.
        let ahead = keys(&[("r2", true), ("r1", true)]);
        assert_eq!(place_shared(&ahead, &[true, true], false), Position::Holder);
        let ahead = keys(&[("r2", false), ("r1", true)]);
        assert_eq!(
            place_shared(&ahead, &[true, true], false),
            Position::BehindUngranted(b"r2".to_vec())
        );
        // A writer ahead (waiting behind a reader, or holding): wait for it to go.
        let ahead = keys(&[("w", false), ("r1", true)]);
        assert_eq!(
            place_shared(&ahead, &[false, true], false),
            Position::BehindExclusive(b"w".to_vec())
        );
        // More readers ahead than a page: the farthest of the page first.
        let ahead = keys(&[("r2", true), ("r1", true)]);
        assert_eq!(
            place_shared(&ahead, &[true, true], true),
            Position::BehindExclusive(b"r1".to_vec())
        );
    }

    #[test]
    fn only_a_waiter_far_back_in_a_long_queue_has_its_turn_far_off() {
        let standing = |position, queued| Standing {
            position,
            revision: 7,
            queued,
        };
        let back = Position::Waiter(b"b".to_vec());
        assert!(standing(back.clone(), NEAR_QUEUE).turn_is_near());
        assert!(!standing(back, NEAR_QUEUE + 1).turn_is_near());
        let first = Position::FirstWaiter(vec![b"a".to_vec()]);
        assert!(standing(first, 1000).turn_is_near());
    }

    #[test]
    fn behind_a_full_window_waiters_watch_holders_or_their_predecessor() {
        let ahead = keys(&[("b", true), ("a", true)]);
        let first = Position::FirstWaiter(vec![b"b".to_vec(), b"a".to_vec()]);
        assert_eq!(place(&ahead, false, 2), first);
        assert_eq!(place(&ahead, true, 2), Position::Waiter(b"b".to_vec()));
    }
}
