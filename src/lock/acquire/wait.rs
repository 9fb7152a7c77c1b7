//! Waiting for a turn in a lock's queue.
//!
//! A waiter knows where its key stands from the enqueue transaction (or a read, under the
//! lock's *current* settings: the read includes the config key, so a `maxHolders` change
//! applies to waiters already queued), and watches only what can change that:
//!
//! * first waiter (`max_holders` keys ahead): every holder, for deletion;
//! * further back: its immediate predecessor, for deletion, and in a semaphore also for the
//!   write a waiter makes when it is granted ([`granted`]); without it the second waiter would
//!   sleep on after the first one got in, a lost wake-up (a grant a release hands to that key
//!   is not such a record, and passes it by);
//! * inside the window but behind a key not yet granted: that key, until it is granted or gone,
//!   so that grants (and fencing tokens) follow the queue order;
//! * always its own key, for deletion (its lease was revoked: stop waiting at once) and for a
//!   grant a release hands it, and the config key (the settings changed: read again).
//!
//! Its own key and the config key are not watched per wait: the process follows them on the
//! lock's feed ([`feed`]), one long-lived watch shared by every wait and hold of the
//! process on the lock, which keeps its recent changes for a wait that read before it
//! subscribed. So a wait makes one watch (a first waiter of a semaphore, one per holder).
//!
//! The keys that let it in are watched from "now", which keeps the watch on etcd's synced path
//! (a watch from a past revision waits for etcd's 100 ms catch-up loop); a waiter whose turn is
//! near also checks that etcd did put them there, as a write racing the watch's creation can
//! leave it unsynced ([`Etcd::watch_keys_synced`]). Whatever changed between the read and the
//! watches' start is covered in one of two ways (see [`Gap`]).
//!
//! [`granted`]: crate::lock::protocol::position::Ahead::granted
//! [`feed`]: crate::lock::feed
//! [`Etcd::watch_keys_synced`]: crate::lock::etcd::Etcd::watch_keys_synced

use etcd_client::EventType;
use std::time::Duration;
use tokio::time::{Instant, sleep_until, timeout_at};
use tracing::warn;

use crate::critical_path::{self, Point};
use crate::lock::bugs::{self, Bug};
use crate::lock::engine::Engine;
use crate::lock::error::LockError;
use crate::lock::etcd::watch::{KeyWatch, Target};
use crate::lock::etcd::{self, Etcd};
use crate::lock::feed::Subscription;
use crate::lock::protocol::entry::{Entry, Successor};
use crate::lock::protocol::names::LockId;
use crate::lock::protocol::{self, WakeOn};
use crate::lock::protocol::{Ask, Position, Standing};
use crate::lock::txn::handoff;
use crate::lock::txn::queue::{self, Ticket};
use crate::lock::txn::settings::Declared;

/// A grant: the ticket may hold the lock from revision `at`.
#[derive(Debug)]
pub struct Granted {
    /// The revision it holds from.
    pub at: i64,
    /// The keys behind it it knows.
    pub chain: Vec<Successor>,
    /// A release handed it the grant (else a read, or its enqueue, found it in).
    pub handed: bool,
}

impl Granted {
    /// The grant a read found in, at `now`.
    fn read(now: Standing) -> Self {
        Granted {
            at: now.revision,
            chain: now.chain,
            handed: false,
        }
    }

    /// The grant a release handed on at `at`, with the chain that came with it.
    fn handed((at, chain): (i64, Vec<Successor>)) -> Self {
        Granted {
            at,
            chain,
            handed: true,
        }
    }
}

/// How a wait ended.
#[derive(Debug)]
pub enum Turn {
    /// The ticket may hold the lock.
    Granted(Granted),
    /// The ticket's key disappeared (lease expired or revoked, key or lock deleted).
    Gone,
    /// The deadline passed first.
    TimedOut,
    /// The ticket asks for more permits than the lock now has slots ([`Position::TooLarge`]).
    TooLarge,
}

/// Waits until `ticket` may hold `lock`, its key is gone, or `deadline` passes, starting from
/// where it stood (`start`, from the enqueue) or, without that, from a read. `declared` follows
/// the lock's settings as they change and ends as the ones the turn was decided by.
pub async fn wait_turn(
    engine: &Engine,
    lock: &LockId,
    (ticket, ask): (&Ticket, Ask),
    declared: &mut Declared,
    deadline: Instant,
    start: Option<Standing>,
) -> Result<Turn, LockError> {
    let etcd = engine.etcd();
    let read = async |declared: &mut Declared| standing(etcd, lock, (ticket, ask), declared).await;
    let mut now = match start {
        Some(start) => start,
        None => read(declared).await?,
    };
    loop {
        match now.position {
            Position::Holder => return Ok(Turn::Granted(Granted::read(now))),
            Position::Gone => return Ok(Turn::Gone),
            Position::TooLarge => return Ok(Turn::TooLarge),
            _ => {}
        }
        let started = Instant::now();
        let watched = watch_position(engine, lock, (ticket, ask), declared, &now);
        let mut watch = match timeout_at(deadline, watched).await {
            Err(_) => return Ok(Turn::TimedOut),
            Ok(Ok(Watched::Watching(watch))) => watch,
            Ok(Ok(Watched::Moved(again))) => {
                now = again;
                continue;
            }
            // A member that cannot set up the watch (stalled, restarting): read again (the read
            // fails if etcd is really gone) and watch anew, likely on another member.
            Ok(Err(e)) => {
                warn!(key = ticket.key, error = %e, "could not watch while waiting; re-reading");
                sleep_until(started + WATCH_RETRY_GAP).await;
                now = read(declared).await?;
                continue;
            }
        };
        match timeout_at(deadline, woken(&mut watch, (ticket, ask))).await {
            Err(_) => return Ok(Turn::TimedOut),
            Ok(Woken::Granted(granted)) => return Ok(Turn::Granted(granted)),
            Ok(Woken::Read) => {}
            // A broken watch (etcd restart, leader change) is not fatal: re-read and re-watch.
            // If etcd is really gone, the read below fails and the caller gets the error.
            Ok(Woken::Broken(e)) => {
                warn!(key = ticket.key, error = %e, "watch broke while waiting; re-reading");
                sleep_until(started + WATCH_RETRY_GAP).await;
            }
        }
        now = read(declared).await?;
    }
}

/// What woke a waiter.
enum Woken {
    /// A grant handed to it, with the chain handed on with it.
    Granted(Granted),
    /// A change that may have moved it: read its position.
    Read,
    /// The watch broke.
    Broken(LockError),
}

/// Waits for a change that may move `ticket`. Grants handed to the keys it watches pass it
/// by: a handed grant is not a grant record, and lets nobody behind that key in (the key's
/// own record, or its deletion, does, and wakes it then).
async fn woken(w: &mut Watches, (ticket, ask): (&Ticket, Ask)) -> Woken {
    loop {
        let fired = tokio::select! {
            fired = w.keys.changed() => fired,
            fired = w.feed.changed() => fired,
        };
        if let Err(e) = fired {
            return Woken::Broken(e);
        }
        let at = critical_path::now();
        let (mine, keys) = (w.feed.take_events(), w.keys.take_events());
        // Off the hot path: the events' newest revision only for a mark that is on.
        if at.is_some() {
            let newest = (mine.iter().chain(&keys))
                .filter_map(|e| e.kv())
                .map(|kv| kv.mod_revision())
                .max();
            critical_path::mark_at(Point::WaitEvent, ticket.revision, newest.unwrap_or(0), at);
        }
        if handoff::possible(ask.mode)
            && let Some(grant) = handed(&mut w.feed, ticket, &mine, &keys).await
        {
            return Woken::Granted(Granted::handed(grant));
        }
        if !mine.is_empty() || !handoff::handed_to_others(&keys, ticket) {
            return Woken::Read;
        }
    }
}

/// The grant handed to `ticket` among the changes to its own key (`mine`), if one was
/// ([`handoff::granted`]). A deletion among the keys it watches (`keys`) seen without it may be
/// the first half of the release that hands it on: its change to the waiter's own key comes
/// on the feed, which is asked to pass the deletion's revision first.
async fn handed(
    feed: &mut Subscription,
    ticket: &Ticket,
    mine: &[etcd_client::Event],
    keys: &[etcd_client::Event],
) -> Option<(i64, Vec<Successor>)> {
    if let Some(grant) = handoff::granted(mine, ticket) {
        return Some(grant);
    }
    let deleted = (keys.iter())
        .filter(|e| e.event_type() == EventType::Delete)
        .filter_map(|e| e.kv())
        .map(|kv| kv.mod_revision())
        .max()?;
    feed.settle(deleted).await;
    // Other changes taken here are not lost: a deletion without a grant makes the waiter read.
    handoff::granted(&feed.take_events(), ticket)
}

/// The least time between the starts of two watches of a waiter: a watch that served a while
/// (a silent one is given up after 800 ms) is replaced at once, by then on another member (see
/// `Members`); one that failed at once (etcd unreachable) is not retried in a tight loop.
const WATCH_RETRY_GAP: Duration = Duration::from_millis(100);

/// What setting up a waiter's watches came to.
enum Watched {
    /// Watching everything that can move it, with nothing missed since its position was read.
    Watching(Box<Watches>),
    /// A read to close the gap found it elsewhere, or under another `maxHolders` (what it
    /// watches depends on both): watch anew.
    Moved(Standing),
}

/// What a waiter watches: the keys that let it in, on a watch of its own, and its own key and
/// the lock's settings, on the feed its process shares for the lock (`feed/`).
struct Watches {
    keys: KeyWatch,
    feed: Subscription,
}

/// How a waiter covers the changes between the revision its position was read at and the start
/// of its watches on the keys that let it in (watched from "now").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gap {
    /// Read the position again (its own key and the settings with it). For the first waiter,
    /// one behind an ungranted key and a reader behind a writer: what they watch is about to
    /// change, and a change missed in the gap must not cost a moment. The same for any waiter
    /// whose watches had to be made again: their start moved on by milliseconds. A read that
    /// finds it elsewhere, or under another `maxHolders`, makes its watches anew (#54 F1: one
    /// that kept a mutex's plan after a raise to 2 watched its predecessor for deletion only,
    /// and slept through the grant record and the release that freed a slot).
    Read,
    /// Watch those keys a second time, from just after the read. A waiter further back watches
    /// a predecessor that is itself still waiting, which rarely moves within the few hundred
    /// microseconds of the gap; if it did, this second watch reports it after etcd's catch-up
    /// loop (up to 100 ms). It saves a read on nearly every grant of a busy lock.
    SecondWatch,
    /// Watch those keys from just after the read, and only so. A mutex waiter behind another
    /// waiter is let in by a release that hands it the grant, which its feed brings at once
    /// (a holder whose chain ran out reads the keys behind it to hand on, see `NextKeys`); the
    /// key it watches matters only when a key ahead is lost or given up. etcd serves a watch
    /// from a past revision through its catch-up loop, up to 100 ms late while the watch is
    /// younger than that: all it can delay is such a rare wake-up.
    FromRead,
}

impl Gap {
    fn of(pos: &Position, max_holders: u32, ask: Ask) -> Gap {
        match pos {
            Position::Waiter(_) if max_holders == 1 && handoff::possible(ask.mode) => Gap::FromRead,
            Position::Waiter(_) => Gap::SecondWatch,
            _ => Gap::Read,
        }
    }
}

/// Watches what can move `ticket` from where it stood (`now`), and covers the gap between the
/// read and the watches' start (see [`Gap`]). A waiter whose turn is near has those watches
/// checked to be on etcd's synced path ([`Etcd::watch_keys_synced`]); one far back does not
/// pay for the check, as etcd syncs them long before its turn.
async fn watch_position(
    engine: &Engine,
    lock: &LockId,
    (ticket, ask): (&Ticket, Ask),
    declared: &mut Declared,
    now: &Standing,
) -> Result<Watched, LockError> {
    let (pos, rev, max_holders) = (&now.position, now.revision, declared.settings.max_holders);
    let mut lets_in = lets_in(pos, max_holders);
    let mut gap = Gap::of(pos, max_holders, ask);
    let own = vec![lock.config_key().into_bytes(), ticket.key.clone().into_bytes()];
    let feed = engine.feeds().follow(lock, ticket.lease, own, rev).await?;
    let etcd = engine.etcd();
    // A feed made since the read (the process's first wait on this lock in a while) started
    // after it: only a read covers its keys in between.
    if feed.from > rev {
        gap = Gap::Read;
    }
    if gap == Gap::FromRead {
        lets_in = lets_in.into_iter().map(|t| t.from(Some(rev + 1))).collect();
    }
    let mut keys = if now.turn_is_near() && gap != Gap::FromRead {
        let (watch, remade) = etcd.watch_keys_synced(&lets_in).await?;
        if remade {
            gap = Gap::Read;
        }
        watch
    } else {
        etcd.watch_keys(&lets_in).await?
    };
    // A member behind the read starts its watches before `rev`: then there is no gap.
    if keys.start_revision > rev || feed.from > rev {
        match gap {
            Gap::SecondWatch => {
                for t in lets_in {
                    keys.also(&t.from(Some(rev + 1))).await?;
                }
            }
            Gap::Read | Gap::FromRead => {
                let again = standing(etcd, lock, (ticket, ask), declared).await?;
                if again.position != *pos || declared.settings.max_holders != max_holders {
                    return Ok(Watched::Moved(again));
                }
            }
        }
    }
    Ok(Watched::Watching(Box::new(Watches { keys, feed })))
}

/// The keys whose change can let a waiter at `pos` in (see the module's doc), from "now": any
/// watch from a past revision (etcd's catch-up path) held back the events a waiter waits for by
/// up to 100 ms (bench/README.md).
fn lets_in(pos: &Position, max_holders: u32) -> Vec<Target> {
    assert!(
        !matches!(pos, Position::Holder | Position::Gone | Position::TooLarge),
        "nothing to wait for"
    );
    let wakes = protocol::wakes(pos, max_holders).into_iter();
    wakes
        .map(|(key, on)| match on {
            WakeOn::Deletion => Target::deletion(&key),
            WakeOn::Any => Target::any_change(&key),
        })
        .collect()
}

/// Reads where `ticket` stands under the lock's current settings. If the settings changed
/// since `declared`, it is updated and the position read again.
async fn standing(
    etcd: &Etcd,
    lock: &LockId,
    (ticket, ask): (&Ticket, Ask),
    declared: &mut Declared,
) -> Result<Standing, LockError> {
    loop {
        let max = declared.settings.max_holders;
        let behind = handoff::possible(ask.mode).then(|| handoff::behind(lock, ticket));
        let resp = etcd
            .txn(queue::position_read(lock, (ticket, ask), max, behind))
            .await?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let mut gets = etcd::gets(resp.op_responses());
        let (mine, config, ahead) = (gets.next(), gets.next(), gets.next());
        let (mine, config, ahead) = (mine.expect("own"), config.expect("config"), ahead.expect("queue"));
        let behind = gets
            .next()
            .map(|b| handoff::chain_of(b.kvs()))
            .unwrap_or_default();
        // Field note: re-check our own key before granting; a waiter's lease may have expired.
        let own = mine
            .kvs()
            .first()
            .filter(|kv| kv.create_revision() == ticket.revision);
        let Some(own) = own else {
            return Ok(gone(rev));
        };
        // A grant a release handed it (issue #54, F10): it holds from that write on, as every
        // view of the holders says, even if a later change (a lowered `maxHolders`) would not
        // let it in by the keys ahead. A waiter that reads rather than sees the write on its
        // feed (its watch was made again, or it read after the settings changed) learns it
        // here, and holds as if the read had let it in, with the keys read behind it.
        let handed = Entry::decode(own.value()).is_some_and(|e| e.handed && !e.is_granted())
            && !bugs::on(Bug::ReadIgnoresHanded);
        let standing = |position| Standing {
            chain: if position == Position::Holder {
                behind.clone()
            } else {
                vec![]
            },
            recording: queue::recording(ahead.kvs(), &position),
            position,
            revision: rev,
            queued: ahead.count(),
        };
        match config.kvs().first().map(Declared::from_kv).transpose()? {
            // Compared by value too: a settings value read from an etcd since wiped or
            // restored can have the revision of the new etcd's.
            Some(now) if now != *declared && !bugs::on(Bug::StaleLimit) => *declared = now,
            None if declared.revision != 0 => return Ok(gone(rev)), // lock deleted
            _ if handed => return Ok(standing(Position::Holder)),
            _ => {
                let at = queue::of_keys(ahead.kvs(), ahead.more(), max, ask);
                return Ok(standing(at));
            }
        }
    }
}

/// Where a waiter whose key is gone (or whose lock was deleted) stands, read at `revision`.
fn gone(revision: i64) -> Standing {
    Standing {
        position: Position::Gone,
        revision,
        queued: 0,
        chain: vec![],
        recording: false,
    }
}
