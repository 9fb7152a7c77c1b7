//! The feeds of one process, by lock and lease ([`Feeds`]), and their followers
//! ([`Subscription`]).

use etcd_client::Event;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio::time::{Instant, timeout};

use super::kept::{Command, Feed, Note, revision};
use super::stream::{self, Directory};
use crate::lock::error::{LockError, Unavailable};
use crate::lock::etcd::Stats;
use crate::lock::etcd::link::Link;
use crate::lock::protocol::names::LockId;

/// How long a feed nobody follows is kept: a process that takes a lock again within it (a busy
/// lock's contender, a retry, the next burst) makes no new watch. An idle feed costs etcd two
/// registered watches and no message (the stream's silence check is one per process).
const LINGER: Duration = Duration::from_secs(60);

/// How long [`Subscription::settle`] waits for the feed to pass a revision. It ends as soon as
/// the feed passes it: on loopback the grant's event or etcd's answer to the progress request
/// comes within a millisecond. The bound matters only when that answer does not come (a stream
/// with a watch still on etcd's catch-up path is not answered until the watch is synced, at
/// most 100 ms) or a busy machine runs the process late; then the waiter reads instead. At
/// 3 ms, a loaded 2-core machine (the test suite in parallel) ran past it and read after a
/// release that had handed it the grant.
const SETTLE: Duration = Duration::from_millis(20);

/// How long a follower waits for a new feed's watches to be made.
const OPENING: Duration = Duration::from_millis(800);

/// The feeds of one process, by lock and lease, and the stream they share.
pub(in crate::lock) struct Feeds {
    link: Link,
    stats: Arc<Stats>,
    shared: Mutex<Shared>,
}

#[derive(Default)]
struct Shared {
    feeds: BTreeMap<(LockId, i64), Arc<Feed>>,
    /// The current stream's generation and command channel, once one was opened.
    stream: Option<(u64, mpsc::Sender<Command>)>,
    generations: u64,
}

impl Feeds {
    pub(in crate::lock) fn new(link: Link, stats: Arc<Stats>) -> Arc<Self> {
        Arc::new(Feeds {
            link,
            stats,
            shared: Mutex::default(),
        })
    }

    /// How many feeds it keeps (followed or lingering), and how many of them are followed.
    pub(in crate::lock) fn count(&self) -> (usize, usize) {
        let shared = self.shared.lock().unwrap();
        let followed = (shared.feeds.values())
            .filter(|f| f.followers.load(Ordering::Relaxed) > 0)
            .count();
        (shared.feeds.len(), followed)
    }

    /// The feed of `lock` and `lease`, made (and its stream opened) if there is none.
    async fn feed(self: &Arc<Self>, lock: &LockId, lease: i64) -> Result<Arc<Feed>, LockError> {
        let (feed, open) = {
            let mut shared = self.shared.lock().unwrap();
            let id = (lock.clone(), lease);
            match shared.feeds.get(&id) {
                Some(feed) if feed.kept.lock().unwrap().ended.is_none() => (feed.clone(), false),
                _ => {
                    let (generation, commands) = self.stream(&mut shared);
                    let feed = Feed::new(lock, lease, generation, commands);
                    shared.feeds.insert(id, feed.clone());
                    (feed, true)
                }
            }
        };
        feed.followers.fetch_add(1, Ordering::Relaxed);
        if open && feed.commands.send(Command::Open(feed.clone())).await.is_err() {
            feed.end("the watch stream closed".into());
        }
        Ok(feed)
    }

    /// The current stream, opened if there is none.
    fn stream(self: &Arc<Self>, shared: &mut Shared) -> (u64, mpsc::Sender<Command>) {
        if let Some(stream) = &shared.stream {
            return stream.clone();
        }
        shared.generations += 1;
        let generation = shared.generations;
        let commands = stream::spawn(self.link.clone(), self.stats.clone(), registry(self), generation);
        shared.stream = Some((generation, commands.clone()));
        (generation, commands)
    }
}

impl Directory for Feeds {
    /// Removes the feeds of `generation` nobody followed for [`LINGER`], and returns them.
    fn idle(&self, generation: u64) -> Vec<Arc<Feed>> {
        let mut shared = self.shared.lock().unwrap();
        let idle = |f: &Arc<Feed>| {
            f.generation == generation
                && f.followers.load(Ordering::Relaxed) == 0
                && f.idle_since.lock().unwrap().elapsed() >= LINGER
        };
        let gone: Vec<_> = (shared.feeds.iter())
            .filter(|(_, f)| idle(f))
            .map(|(id, _)| id.clone())
            .collect();
        gone.iter().filter_map(|id| shared.feeds.remove(id)).collect()
    }

    /// Forgets the stream of `generation`, which ended, and its feeds.
    fn forget(&self, generation: u64) {
        let mut shared = self.shared.lock().unwrap();
        shared.feeds.retain(|_, f| f.generation != generation);
        if shared.stream.as_ref().is_some_and(|(g, _)| *g == generation) {
            shared.stream = None;
        }
    }
}

impl Feeds {
    /// Follows this process's own entries in `lock`'s queue under `lease`, and the lock's
    /// settings, from just after `after`, on a feed shared with every other follower (see the
    /// module's doc). Only changes to `keys` are passed on.
    pub(in crate::lock) async fn follow(
        self: &Arc<Self>,
        lock: &LockId,
        lease: i64,
        keys: Vec<Vec<u8>>,
        after: i64,
    ) -> Result<Subscription, LockError> {
        let feed = self.feed(lock, lease).await?;
        let mut sub = Subscription {
            feed,
            keys,
            notes: None,
            from: after,
            seen: 0,
            pending: vec![],
        };
        let mut ready = sub.feed.ready.subscribe();
        let opened = timeout(OPENING, ready.wait_for(Option::is_some)).await;
        let start = match opened.map(|state| state.map(|s| s.clone())) {
            Ok(Ok(Some(Ok(start)))) => start,
            Ok(Ok(Some(Err(why)))) => return Err(ended(&why)),
            Ok(_) => return Err(ended("the feed closed")),
            Err(_) => {
                return Err(Unavailable::MemberStalled {
                    what: "did not open a watch",
                    within: OPENING,
                }
                .into());
            }
        };
        let kept = sub.feed.kept.lock().unwrap();
        if let Some(why) = &kept.ended {
            return Err(ended(why));
        }
        sub.from = after.max(start).max(kept.floor);
        sub.seen = kept.seen;
        let from = sub.from;
        let mine = (kept.recent.iter()).filter(|e| revision(e) > from && sub.wants(e));
        sub.pending = mine.cloned().collect();
        sub.notes = Some(sub.feed.notes.subscribe());
        drop(kept);
        Ok(sub)
    }
}

/// `feeds` as the stream's task sees it.
fn registry(feeds: &Arc<Feeds>) -> Weak<dyn Directory> {
    let feeds: Arc<dyn Directory> = feeds.clone();
    Arc::downgrade(&feeds)
}

fn ended(why: &str) -> LockError {
    Unavailable::WatchEnded(why.to_string()).into()
}

/// One follower of a feed: the changes to its keys after [`Subscription::from`].
pub(in crate::lock) struct Subscription {
    feed: Arc<Feed>,
    keys: Vec<Vec<u8>>,
    notes: Option<broadcast::Receiver<Note>>,
    /// Every change to its keys after this revision is delivered: past the revision the caller
    /// read at if the feed started before it and still keeps what came since, else a gap the
    /// caller closes with a read.
    pub from: i64,
    seen: i64,
    pending: Vec<Event>,
}

impl Subscription {
    fn wants(&self, e: &Event) -> bool {
        e.kv().is_some_and(|kv| self.keys.iter().any(|k| k == kv.key()))
    }

    /// The next note of the feed, its changes to this follower's keys kept.
    async fn next(&mut self) -> Result<(), LockError> {
        let notes = self.notes.as_mut().expect("subscribed");
        match notes.recv().await {
            Ok(Note::Changes(events, rev)) => {
                let mine = events.iter().filter(|e| revision(e) > self.from);
                let mine: Vec<_> = mine.filter(|e| self.wants(e)).cloned().collect();
                self.pending.extend(mine);
                self.seen = self.seen.max(rev);
                Ok(())
            }
            Ok(Note::Seen(rev)) => {
                self.seen = self.seen.max(rev);
                Ok(())
            }
            Ok(Note::Ended(why)) => Err(ended(&why)),
            Err(broadcast::error::RecvError::Lagged(_)) => Err(ended("a follower fell behind its feed")),
            Err(broadcast::error::RecvError::Closed) => Err(ended("the feed closed")),
        }
    }

    /// Completes when one of its keys changes (at once if one already did).
    pub async fn changed(&mut self) -> Result<(), LockError> {
        while self.pending.is_empty() {
            self.next().await?;
        }
        Ok(())
    }

    /// The changes delivered so far, taken.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.pending)
    }

    /// Waits (up to [`SETTLE`]) until the feed delivered every change up to `rev`, asking etcd
    /// for its progress: a transaction that changed a key this follower watches elsewhere and
    /// one of its own keys is seen here too, or was not made. Gives up quietly.
    pub async fn settle(&mut self, rev: i64) {
        if self.seen >= rev {
            return;
        }
        let _ = self.feed.commands.try_send(Command::Progress);
        let passed = async {
            while self.seen < rev {
                if self.next().await.is_err() {
                    return;
                }
            }
        };
        let _ = timeout(SETTLE, passed).await;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        *self.feed.idle_since.lock().unwrap() = Instant::now();
        self.feed.followers.fetch_sub(1, Ordering::Relaxed);
    }
}
