//! Where a key stands in its lock's queue, judged from the keys just ahead of it. The enqueue
//! transaction reads those keys in the same step as it puts the key ([`queue::enqueue`]), and a
//! waiter reads them again when something it watches changes ([`wait`]).
//!
//! [`queue::enqueue`]: super::queue::enqueue
//! [`wait`]: super::wait

use etcd_client::KeyValue;

use super::keys::Entry;

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
}

/// Whether a queue entry records that it was granted (its `acquiredAt` is written). A grant
/// waits until every key ahead of it in the window is granted, so that grants, and with them
/// fencing tokens, follow the queue order however the window (`maxHolders`) changes. A value
/// that is not an entry (or a key read without its value) blocks nobody.
pub(crate) fn granted(kv: &KeyValue) -> bool {
    serde_json::from_slice::<Entry>(kv.value()).map_or(true, |e| e.acquired_at.is_some())
}

/// The position of a key with `ahead` before it, nearest first (at most `max_holders` of them);
/// `more` if further keys are ahead of those.
pub fn of_keys(ahead: &[KeyValue], more: bool, max_holders: u32) -> Position {
    let ahead: Vec<_> = (ahead.iter())
        .map(|kv| (kv.key().to_vec(), granted(kv)))
        .collect();
    place(&ahead, more, max_holders)
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
    fn behind_a_full_window_waiters_watch_holders_or_their_predecessor() {
        let ahead = keys(&[("b", true), ("a", true)]);
        let first = Position::FirstWaiter(vec![b"b".to_vec(), b"a".to_vec()]);
        assert_eq!(place(&ahead, false, 2), first);
        assert_eq!(place(&ahead, true, 2), Position::Waiter(b"b".to_vec()));
    }
}
