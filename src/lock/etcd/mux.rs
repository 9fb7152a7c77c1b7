//! The one watch stream that a process's feeds share (see [`feed`](super::feed)).
//!
//! A task owns the stream. It makes each feed's watches on it, with watch ids of its own
//! choosing, and passes each response to the feed whose watch it is: events to that feed,
//! an answer to a progress request to all of them. Like every watch of the engine, it notices a
//! stalled member: after [`WATCH_SILENCE`] without a message it asks etcd for its progress, and
//! a member that does not answer within another one is taken for stalled. Then every feed ends
//! (its followers read again) and the next follower opens a new stream, on another member. A
//! stream left without feeds ends too.
//!
//! Each [`Feed`] keeps its latest changes and passes them on to its followers; the registry of
//! feeds and the followers' side are in `feed`, which this module knows only as a [`Registry`].

use etcd_client::Event;
use etcd_client::{WatchResponse, WatchStream};
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior, interval, sleep_until, timeout};
use tracing::debug;

use super::Stats;
use super::link::Link;
use super::members::Members;
use super::watch::Target;
use super::watch::WATCH_SILENCE;
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

/// What the stream's task asks of the registry of the feeds it serves.
pub(super) trait Registry: Send + Sync {
    /// Removes the feeds of `generation` nobody followed for a while, and returns them.
    fn idle(&self, generation: u64) -> Vec<Arc<Feed>>;
    /// Forgets the stream of `generation`, which ended, and its feeds.
    fn forget(&self, generation: u64);
}

/// How many commands may wait for the task.
const COMMANDS: usize = 1024;

/// How often the task looks for feeds nobody followed for `LINGER`.
const SWEEP: Duration = Duration::from_secs(1);

/// Opens a stream for the feeds of `generation` on the first [`Command::Open`] sent to the
/// returned channel.
pub(super) fn spawn(
    link: Link,
    stats: Arc<Stats>,
    feeds: Weak<dyn Registry>,
    generation: u64,
) -> mpsc::Sender<Command> {
    let (commands, mut rx) = mpsc::channel(COMMANDS);
    tokio::spawn(async move {
        let mut mux = Mux {
            served: vec![],
            next_id: 1,
            stats,
        };
        let why = mux.run(link, &feeds, generation, &mut rx).await;
        debug!(generation, why = %why, "the feeds' watch stream ended");
        mux.end(why.clone(), &feeds, generation);
        // Feeds sent to this stream after it ended: their followers need not wait for them.
        rx.close();
        while let Ok(command) = rx.try_recv() {
            if let Command::Open(feed) = command {
                feed.end(why.clone());
            }
        }
    });
    commands
}

/// An open stream, and the member serving it.
struct Opened {
    stream: WatchStream,
    members: Arc<Members>,
    member: Option<usize>,
}

/// A feed the stream serves: its watch ids, and how many etcd confirmed.
struct Served {
    feed: Arc<Feed>,
    ids: Vec<i64>,
    created: usize,
    start: i64,
}

struct Mux {
    served: Vec<Served>,
    next_id: i64,
    stats: Arc<Stats>,
}

impl Mux {
    /// Serves feeds until the stream fails, stalls or has none left; returns why it ended.
    async fn run(
        &mut self,
        link: Link,
        feeds: &Weak<dyn Registry>,
        generation: u64,
        commands: &mut mpsc::Receiver<Command>,
    ) -> Arc<str> {
        match self.open(&link, commands).await {
            Ok(opened) => self.serve_stream(opened, feeds, generation, commands).await,
            Err(why) => why,
        }
    }

    /// Opens the stream with the first feed sent, on a member picked for it.
    async fn open(
        &mut self,
        link: &Link,
        commands: &mut mpsc::Receiver<Command>,
    ) -> Result<Opened, Arc<str>> {
        let first = loop {
            match commands.recv().await {
                Some(Command::Open(feed)) => break feed,
                Some(Command::Progress) => {}
                None => return Err("no feed".into()),
            }
        };
        let clients = link.current();
        let (member, client) = clients.pick();
        let mut requests = self.serve(first);
        let (key, options) = requests.remove(0);
        let mut watches = client.watch_client();
        let open = watches.watch(key, Some(options));
        let mut stream = match timeout(2 * WATCH_SILENCE, open).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(format!("could not open a watch stream: {e}").into()),
            Err(_) => return Err(stalled(&clients.members, member)),
        };
        send(&mut stream, requests).await?;
        let members = clients.members.clone();
        Ok(Opened {
            stream,
            members,
            member,
        })
    }

    /// Passes commands to the stream and its responses to the feeds, until it ends.
    async fn serve_stream(
        &mut self,
        Opened {
            mut stream,
            members,
            member,
        }: Opened,
        feeds: &Weak<dyn Registry>,
        generation: u64,
        commands: &mut mpsc::Receiver<Command>,
    ) -> Arc<str> {
        let (mut heard, mut asked) = (Instant::now(), None::<Instant>);
        let mut sweep = interval(SWEEP);
        sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let check_at = asked.unwrap_or(heard) + WATCH_SILENCE;
            tokio::select! {
                biased;
                command = commands.recv() => {
                    let sent = match command {
                        Some(Command::Open(feed)) => send(&mut stream, self.serve(feed)).await,
                        Some(Command::Progress) => progress(&mut stream).await,
                        None => return "the feeds are gone".into(),
                    };
                    if let Err(e) = sent {
                        return e;
                    }
                }
                message = stream.message() => {
                    (heard, asked) = (Instant::now(), None);
                    match message {
                        Ok(Some(resp)) => self.handle(resp),
                        Ok(None) => return "etcd closed the watch stream".into(),
                        Err(e) => return format!("the watch stream failed: {e}").into(),
                    }
                }
                _ = sleep_until(check_at) => {
                    if asked.is_some() {
                        return stalled(&members, member);
                    }
                    if let Err(e) = progress(&mut stream).await {
                        return e;
                    }
                    asked = Some(Instant::now());
                }
                _ = sweep.tick() => {
                    let Some(feeds) = feeds.upgrade() else { return "the feeds are gone".into() };
                    if let Err(e) = self.cancel(&mut stream, feeds.idle(generation)).await {
                        return e;
                    }
                    if self.served.is_empty() {
                        return "no feed left".into();
                    }
                }
            }
        }
    }

    /// Takes `feed` on: the create requests of its watches, with their ids.
    fn serve(&mut self, feed: Arc<Feed>) -> Vec<(Vec<u8>, etcd_client::WatchOptions)> {
        let ids: Vec<i64> = (0..feed.targets.len() as i64).map(|i| self.next_id + i).collect();
        self.next_id += ids.len() as i64;
        let requests = (feed.targets.iter().zip(&ids))
            .map(|(t, &id)| (t.key().to_vec(), t.watch_options().with_watch_id(id)))
            .collect();
        self.stats.watches.fetch_add(ids.len() as u64, Ordering::Relaxed);
        self.served.push(Served {
            feed,
            ids,
            created: 0,
            start: 0,
        });
        requests
    }

    /// Cancels the watches of `idle` feeds.
    async fn cancel(&mut self, stream: &mut WatchStream, idle: Vec<Arc<Feed>>) -> Result<(), Arc<str>> {
        for feed in idle {
            let Some(i) = self.served.iter().position(|s| Arc::ptr_eq(&s.feed, &feed)) else {
                continue;
            };
            for id in self.served.swap_remove(i).ids {
                stream
                    .cancel(id)
                    .await
                    .map_err(|e| format!("could not cancel a watch: {e}"))?;
            }
        }
        Ok(())
    }

    /// Passes `resp` on to the feed it is for (an answer to a progress request: to all).
    fn handle(&mut self, resp: WatchResponse) {
        let rev = resp.header().map_or(0, |h| h.revision());
        let id = resp.watch_id();
        if id == -1 && resp.events().is_empty() {
            self.served.iter().for_each(|s| s.feed.seen(rev));
            return;
        }
        let Some(i) = self.served.iter().position(|s| s.ids.contains(&id)) else {
            return; // a watch cancelled since
        };
        if resp.canceled() {
            let served = self.served.swap_remove(i);
            let why = format!("etcd cancelled a feed's watch: {}", resp.cancel_reason());
            served.feed.end(why.into());
            return;
        }
        let served = &mut self.served[i];
        if resp.created() {
            served.created += 1;
            served.start = served.start.max(rev);
            if served.created == served.ids.len() {
                served.feed.started(served.start);
            }
        }
        if !resp.events().is_empty() {
            let n = resp.events().len() as u64;
            self.stats.watch_events.fetch_add(n, Ordering::Relaxed);
            served.feed.deliver(resp.events(), rev);
        }
    }

    /// Ends every feed of the stream and forgets it, so the next follower opens a new one.
    fn end(&mut self, why: Arc<str>, feeds: &Weak<dyn Registry>, generation: u64) {
        if let Some(feeds) = feeds.upgrade() {
            feeds.forget(generation);
        }
        for served in self.served.drain(..) {
            served.feed.end(why.clone());
        }
    }
}

async fn send(
    stream: &mut WatchStream,
    requests: Vec<(Vec<u8>, etcd_client::WatchOptions)>,
) -> Result<(), Arc<str>> {
    for (key, options) in requests {
        (stream.watch(key, Some(options)).await).map_err(|e| format!("could not make a watch: {e}"))?;
    }
    Ok(())
}

async fn progress(stream: &mut WatchStream) -> Result<(), Arc<str>> {
    (stream.request_progress().await).map_err(|e| format!("could not ask for progress: {e}").into())
}

fn stalled(members: &Members, member: Option<usize>) -> Arc<str> {
    members.suspect(member, "the feeds' watch stream went silent");
    "the etcd member serving the feeds went silent".into()
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
