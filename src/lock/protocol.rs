//! The queue protocol's decisions as pure functions: where a key stands, judged from the keys
//! ahead of it, and which changes can move it. The engine makes every such decision through
//! these functions (the enqueue and a waiter's read in [`queue`] and [`wait`]), and so does the
//! protocol model (`tests/model`), which checks them against every interleaving of etcd
//! requests, lease ends and settings changes it explores. Nothing here reads etcd.
//!
//! [`queue`]: super::queue
//! [`wait`]: super::wait

pub use super::entry::Mode;
pub use super::position::{Ahead, Position};

impl Ahead {
    /// A key read without its value ([`keys_needed`] said none was needed), or whose value is
    /// not an entry: it counts as exclusive and granted, so it blocks nobody beyond its place.
    pub fn without_value(key: Vec<u8>) -> Self {
        Ahead {
            key,
            granted: true,
            mode: Mode::Exclusive,
        }
    }
}

/// How many keys ahead of a key in `mode` a position read returns, nearest first, and whether
/// with their values (without: pass them as [`Ahead::without_value`]).
pub fn keys_needed(max_holders: u32, mode: Mode) -> (u32, bool) {
    super::position::keys_needed(max_holders, mode)
}

/// Where a key in `mode` stands with `ahead` before it (nearest first, as many as
/// [`keys_needed`] says), `more` if further keys are ahead of those, in a lock of
/// `max_holders` slots. [`Position::Holder`]: it holds the lock from this read on.
pub fn position(ahead: &[Ahead], more: bool, max_holders: u32, mode: Mode) -> Position {
    super::position::decide(ahead, more, max_holders, mode)
}

/// How many of a queue's leading keys hold, given their modes in queue order: the leading run
/// of shared keys when the first one is shared, else the leading run of exclusive keys, at most
/// `max_holders` of them (the rule [`position`] decides by, seen from the whole queue). The
/// operator reads holders by it (status, and who a force release ends), and so does the
/// model's administrator.
pub fn held_count(modes: impl Iterator<Item = Mode>, max_holders: u32) -> usize {
    let mut modes = modes.peekable();
    let Some(&first) = modes.peek() else { return 0 };
    let limit = match first {
        Mode::Shared => usize::MAX,
        Mode::Exclusive => max_holders as usize,
    };
    modes.take(limit).take_while(|m| *m == first).count()
}

/// What a watched key must do to wake a waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Be deleted.
    Deletion,
    /// Be deleted or written (a waiter's grant record).
    Any,
}

/// The keys whose change can let a waiter at `pos` in, and which change. Every waiter also
/// watches its own key for deletion and the lock's settings key for any change; an event on
/// any of them makes it read its position again.
pub fn wakes(pos: &Position, max_holders: u32) -> Vec<(Vec<u8>, Change)> {
    let each = |keys: &[Vec<u8>], on| keys.iter().map(|k| (k.clone(), on)).collect();
    match pos {
        Position::FirstWaiter(holders) => each(holders, Change::Deletion),
        // Behind a key still waiting in a semaphore: its grant record moves this one up too.
        Position::Waiter(pred) if max_holders > 1 => vec![(pred.clone(), Change::Any)],
        Position::Waiter(pred) => vec![(pred.clone(), Change::Deletion)],
        Position::BehindUngranted(key) => vec![(key.clone(), Change::Any)],
        Position::BehindOtherMode(key) => vec![(key.clone(), Change::Deletion)],
        Position::Holder | Position::Gone => vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_are_the_leading_run_of_one_mode_within_the_limit() {
        use Mode::{Exclusive as X, Shared as S};
        let held = |modes: &[Mode], max| held_count(modes.iter().copied(), max);
        assert_eq!(held(&[], 1), 0);
        assert_eq!(held(&[X, X, X], 1), 1);
        assert_eq!(held(&[X, X, X], 2), 2);
        assert_eq!(held(&[X, S, X], 3), 1, "a reader never holds beside a writer");
        assert_eq!(
            held(&[S, S, X, S], 1),
            2,
            "readers ahead of a writer hold, whatever the limit"
        );
        assert_eq!(held(&[X], 0), 0);
    }
}
