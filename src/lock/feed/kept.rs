//! One feed: a lock's settings key and one lease's keys in its queue, watched on the shared
//! stream, with its latest changes kept for followers that read before they subscribed, and
//! what it tells its followers.

use etcd_client::Event;
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;

use crate::lock::etcd::watch::Target;
use crate::lock::protocol::names::LockId;

/// What a stream's task is asked to do.
pub(super) enum Command {
    /// Make the feed's watches.
    Open(Arc<Feed>),
    /// Ask etcd for the stream's progress (see `Subscription::settle`).
    Progress,
}

/// How many of its latest changes a feed keeps for followers that read before they subscribed.
/// A wait subscribes within milliseconds of its read, and a feed's keys change a few times per
/// grant of this process; a sidecar follows up to hundreds of locks, so the memory is kept
/// small (a follower that read before the oldest change kept reads again).
const KEEP: usize = 64;

/// How many notes a follower may fall behind before it is told to read again. A follower waits
/// on its feed, and a feed's keys change a few times per grant of its process; the channel's
/// slots are allocated up front, per feed, and a sidecar may follow hundreds of locks (1,024
/// slots took the scale benchmark's sidecar with 200 holds from 20.7 to 28.4 MiB).
const BACKLOG: usize = 64;

/// What a feed tells its followers, in order.
#[derive(Clone, Debug)]
pub(super) enum Note {
    /// Changes etcd delivered, and the revision it delivered them at.
    Changes(Arc<[Event]>, i64),
    /// etcd delivered every change up to this revision (an answer to a progress request).
    Seen(i64),
    /// The feed ended (its stream broke, or etcd cancelled a watch): read again.
    Ended(Arc<str>),
}

/// One lock's settings key and one lease's keys in its queue, watched on the shared stream.
pub(super) struct Feed {
    pub(super) targets: Vec<Target>,
    pub(super) generation: u64,
    pub(super) commands: mpsc::Sender<Command>,
    pub(super) notes: broadcast::Sender<Note>,
    pub(super) kept: Mutex<Kept>,
    /// `Some(Ok(start))` once its watches are made: it delivers every change after `start`.
    pub(super) ready: watch::Sender<Option<Result<i64, Arc<str>>>>,
    pub(super) followers: AtomicUsize,
    pub(super) idle_since: Mutex<Instant>,
}

/// A feed's memory of its latest changes.
#[derive(Default)]
pub(super) struct Kept {
    /// Every change after this revision is in `recent`.
    pub(super) floor: i64,
    /// The newest revision etcd delivered everything up to.
    pub(super) seen: i64,
    pub(super) recent: VecDeque<Event>,
    pub(super) ended: Option<Arc<str>>,
}

pub(super) fn revision(e: &Event) -> i64 {
    e.kv().map_or(0, |kv| kv.mod_revision())
}

impl Feed {
    pub(super) fn new(
        lock: &LockId,
        lease: i64,
        generation: u64,
        commands: mpsc::Sender<Command>,
    ) -> Arc<Self> {
        let own = format!("{}{lease:016x}/", lock.queue_prefix());
        let targets = vec![
            Target::any_change(lock.config_key().as_bytes()),
            Target::any_change_under(own.as_bytes()),
        ];
        Arc::new(Feed {
            targets,
            generation,
            commands,
            notes: broadcast::Sender::new(BACKLOG),
            kept: Mutex::default(),
            ready: watch::Sender::new(None),
            followers: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        })
    }

    /// Its watches are made: it delivers every change after `start`.
    pub(super) fn started(&self, start: i64) {
        let mut kept = self.kept.lock().unwrap();
        (kept.floor, kept.seen) = (start, start);
        self.ready.send_replace(Some(Ok(start)));
    }

    /// Keeps `events`, delivered at `rev`, and passes them on.
    pub(super) fn deliver(&self, events: &[Event], rev: i64) {
        let mut kept = self.kept.lock().unwrap();
        kept.recent.extend(events.iter().cloned());
        while kept.recent.len() > KEEP {
            let old = kept.recent.pop_front().expect("kept");
            kept.floor = kept.floor.max(revision(&old));
        }
        kept.seen = kept.seen.max(rev);
        let _ = self.notes.send(Note::Changes(events.into(), rev));
    }

    /// etcd delivered every change up to `rev`.
    pub(super) fn seen(&self, rev: i64) {
        let mut kept = self.kept.lock().unwrap();
        kept.seen = kept.seen.max(rev);
        let _ = self.notes.send(Note::Seen(rev));
    }

    /// The feed ended: its followers read again, and a new one replaces it.
    pub(super) fn end(&self, why: Arc<str>) {
        let mut kept = self.kept.lock().unwrap();
        kept.ended.get_or_insert_with(|| why.clone());
        let _ = self.notes.send(Note::Ended(why.clone()));
        // Followers still waiting for the feed to open learn that it never will.
        self.ready.send_if_modified(|ready| {
            let waiting = ready.is_none();
            if waiting {
                *ready = Some(Err(why));
            }
            waiting
        });
    }
}
