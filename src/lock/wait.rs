//! Waiting for a turn in a lock's queue.
//!
//! A waiter reads where its key stands, under the lock's *current* settings (the read includes
//! the config key, so a `maxHolders` change applies to waiters already queued), and watches only
//! what can change that:
//!
//! * first waiter (`max_holders` keys ahead): every holder, for deletion;
//! * further back: its immediate predecessor, for deletion, and in a semaphore also for the
//!   write a waiter makes when it is granted ([`granted`]); without it the second waiter would
//!   sleep on after the first one got in, a lost wake-up;
//! * inside the window but behind a key not yet granted: that key, until it is granted or gone,
//!   so that grants (and fencing tokens) follow the queue order;
//! * always its own key, for deletion (its lease was revoked: stop waiting at once), and the
//!   config key (the settings changed: read again).
//!
//! Watches start at the current revision and the position is read again once they are in
//! place, so no change is missed and no watch waits in etcd's catch-up loop.

use etcd_client::{GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};
use std::time::Duration;
use tokio::time::{Instant, sleep_until, timeout_at};
use tracing::warn;

use super::LockError;
use super::etcd::Etcd;
use super::keys::LockId;
use super::queue::{Ticket, granted};
use super::settings::Declared;
use super::watch::Target;

/// Where a ticket stands.
#[derive(Debug, PartialEq, Eq)]
enum Position {
    Holder,
    Gone,
    FirstWaiter(Vec<Vec<u8>>),
    Waiter(Vec<u8>),
    BehindUngranted(Vec<u8>),
}

/// How a wait ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Turn {
    /// The ticket may hold the lock at this revision.
    Granted(i64),
    /// The ticket's key disappeared (lease expired or revoked, key or lock deleted).
    Gone,
    /// The deadline passed first.
    TimedOut,
}

/// Waits until `ticket` may hold `lock`, its key is gone, or `deadline` passes. `declared`
/// follows the lock's settings as they change and ends as the ones the turn was decided by.
pub async fn wait_turn(
    etcd: &Etcd,
    lock: &LockId,
    ticket: &Ticket,
    declared: &mut Declared,
    deadline: Instant,
) -> Result<Turn, LockError> {
    let (mut pos, mut rev) = position(etcd, lock, ticket, declared).await?;
    loop {
        let targets = match &pos {
            Position::Holder => return Ok(Turn::Granted(rev)),
            Position::Gone => return Ok(Turn::Gone),
            waiting => watch_targets(waiting, lock, ticket, declared.settings.max_holders, rev),
        };
        let started = Instant::now();
        let mut watch = match timeout_at(deadline, etcd.watch_keys(&targets)).await {
            Err(_) => return Ok(Turn::TimedOut),
            Ok(Ok(watch)) => watch,
            // A member that cannot set up the watch (stalled, restarting): read again (the read
            // fails if etcd is really gone) and watch anew, likely on another member.
            Ok(Err(e)) => {
                warn!(key = ticket.key, error = %e, "could not watch while waiting; re-reading");
                sleep_until(started + WATCH_RETRY_GAP).await;
                (pos, rev) = position(etcd, lock, ticket, declared).await?;
                continue;
            }
        };
        // Anything written between our read and the watches' start may have moved us: read again.
        if watch.start_revision != rev {
            let (again, again_rev) = position(etcd, lock, ticket, declared).await?;
            rev = again_rev;
            if again != pos {
                pos = again;
                continue;
            }
        }
        match timeout_at(deadline, watch.changed()).await {
            Err(_) => return Ok(Turn::TimedOut),
            Ok(Ok(())) => {}
            // A broken watch (etcd restart, leader change) is not fatal: re-read and re-watch.
            // If etcd is really gone, the read below fails and the caller gets the error.
            Ok(Err(e)) => {
                warn!(key = ticket.key, error = %e, "watch broke while waiting; re-reading");
                sleep_until(started + WATCH_RETRY_GAP).await;
            }
        }
        (pos, rev) = position(etcd, lock, ticket, declared).await?;
    }
}

/// The least time between the starts of two watches of a waiter: a watch that served a while
/// (a silent one is given up after 800 ms) is replaced at once, by then on another member (see
/// `Members`); one that failed at once (etcd unreachable) is not retried in a tight loop.
const WATCH_RETRY_GAP: Duration = Duration::from_millis(100);

/// What a waiter at `pos`, read at revision `rev`, watches (see the module's doc). Its own key
/// and the config key are watched from just after the read: a change to them may reach the
/// waiter up to 100 ms late (etcd's catch-up loop), but never needs another read, and only the
/// keys that hand the lock on are watched from "now".
fn watch_targets(pos: &Position, lock: &LockId, ticket: &Ticket, max_holders: u32, rev: i64) -> Vec<Target> {
    let mut targets = match pos {
        Position::FirstWaiter(holders) => holders.iter().map(|k| Target::deletion(k)).collect(),
        Position::Waiter(pred) if max_holders > 1 => vec![Target::any_change(pred)],
        Position::Waiter(pred) => vec![Target::deletion(pred)],
        Position::BehindUngranted(key) => vec![Target::any_change(key)],
        Position::Holder | Position::Gone => unreachable!("nothing to wait for"),
    };
    targets.push(Target::deletion(ticket.key.as_bytes()).from(Some(rev + 1)));
    targets.push(Target::any_change(lock.config_key().as_bytes()).from(Some(rev + 1)));
    targets
}

/// Reads where `ticket` stands under the lock's current settings, and the revision of the
/// read. If the settings changed since `declared`, it is updated and the position read again.
async fn position(
    etcd: &Etcd,
    lock: &LockId,
    ticket: &Ticket,
    declared: &mut Declared,
) -> Result<(Position, i64), LockError> {
    loop {
        let max = declared.settings.max_holders;
        let mut ahead = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(ticket.revision - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(max.into());
        if max == 1 {
            ahead = ahead.with_keys_only(); // a mutex's grant needs no one's value
        }
        let resp = etcd
            .txn(Txn::new().and_then([
                TxnOp::get(ticket.key.as_str(), None),
                TxnOp::get(lock.config_key(), None),
                TxnOp::get(lock.queue_prefix(), Some(ahead)),
            ]))
            .await?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let mut gets = resp.op_responses().into_iter().filter_map(|op| match op {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        });
        let (mine, config, ahead) = (gets.next(), gets.next(), gets.next());
        let (mine, config, ahead) = (mine.expect("own"), config.expect("config"), ahead.expect("queue"));
        // Field note: re-check our own key before granting; a waiter's lease may have expired.
        if mine.kvs().first().map(|kv| kv.create_revision()) != Some(ticket.revision) {
            return Ok((Position::Gone, rev));
        }
        match config.kvs().first().map(Declared::from_kv).transpose()? {
            Some(now) if now.revision != declared.revision => *declared = now,
            None if declared.revision != 0 => return Ok((Position::Gone, rev)), // lock deleted
            _ => {
                let keys: Vec<_> = ahead
                    .kvs()
                    .iter()
                    .map(|kv| (kv.key().to_vec(), granted(kv)))
                    .collect();
                return Ok((place(&keys, ahead.more(), max), rev));
            }
        }
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
    fn behind_a_full_window_waiters_watch_holders_or_their_predecessor() {
        let ahead = keys(&[("b", true), ("a", true)]);
        let first = Position::FirstWaiter(vec![b"b".to_vec(), b"a".to_vec()]);
        assert_eq!(place(&ahead, false, 2), first);
        assert_eq!(place(&ahead, true, 2), Position::Waiter(b"b".to_vec()));
    }
}
