//! The one watch stream that a process's feeds share (see [`feed`](super)).
//!
//! A task owns the stream. It makes each feed's watches on it, with watch ids of its own
//! choosing, and passes each response to the feed whose watch it is: events to that feed,
//! an answer to a progress request to all of them. Like every watch of the engine, it notices a
//! stalled member: after [`WATCH_SILENCE`] without a message it asks etcd for its progress, and
//! a member that does not answer within another one is taken for stalled. Then every feed ends
//! (its followers read again) and the next follower opens a new stream, on another member. A
//! stream left without feeds ends too.
//!
//! Each [`Feed`] keeps its latest changes and passes them on to its followers (`kept.rs`); the
//! feeds of the process and the followers' side are in `follow.rs`, which this module knows
//! only as a [`Directory`].

use etcd_client::{WatchResponse, WatchStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior, interval, sleep_until, timeout};
use tracing::debug;

use super::kept::{Command, Feed};
use crate::lock::etcd::Stats;
use crate::lock::etcd::link::Link;
use crate::lock::etcd::members::Members;
use crate::lock::etcd::silence::{Silence, WATCH_SILENCE};

/// What the stream's task asks of the directory of the feeds it serves.
pub(super) trait Directory: Send + Sync {
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
    feeds: Weak<dyn Directory>,
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
    silence: Silence,
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
        feeds: &Weak<dyn Directory>,
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
        let mut silence = Silence::new(client.clone(), first.targets[0].key().to_vec());
        first.targets.iter().for_each(|t| silence.asked(t.start()));
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
            silence,
        })
    }

    /// Passes commands to the stream and its responses to the feeds, until it ends.
    async fn serve_stream(
        &mut self,
        Opened {
            mut stream,
            members,
            member,
            mut silence,
        }: Opened,
        feeds: &Weak<dyn Directory>,
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
                        Some(Command::Open(feed)) => {
                            feed.targets.iter().for_each(|t| silence.asked(t.start()));
                            send(&mut stream, self.serve(feed)).await
                        }
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
                        Ok(Some(resp)) => self.handle(resp, &mut silence),
                        Ok(None) => return "etcd closed the watch stream".into(),
                        Err(e) => return format!("the watch stream failed: {e}").into(),
                    }
                }
                _ = sleep_until(check_at) => {
                    let serving = (&*members, member);
                    match self.silent(&mut stream, &mut silence, asked.is_some(), serving).await {
                        Ok(Some(at)) => asked = Some(at),
                        Ok(None) => (heard, asked) = (Instant::now(), None),
                        Err(e) => return e,
                    }
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

    /// After [`WATCH_SILENCE`] without a message: asks etcd for the stream's progress, or,
    /// asked already, finds the member stalled unless etcd's rule explains the silence (see
    /// [`Silence`]). Returns when it asked (`None`: the wait starts over).
    async fn silent(
        &self,
        stream: &mut WatchStream,
        silence: &mut Silence,
        asked: bool,
        (members, member): (&Members, Option<usize>),
    ) -> Result<Option<Instant>, Arc<str>> {
        if !asked {
            progress(stream).await?;
            return Ok(Some(Instant::now()));
        }
        if silence.explained(&self.stats).await {
            return Ok(None);
        }
        Err(stalled(members, member))
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

    /// Passes `resp` on to the feed it is for (an answer to a progress request: to all), and
    /// its revision to `silence`.
    fn handle(&mut self, resp: WatchResponse, silence: &mut Silence) {
        let rev = resp.header().map_or(0, |h| h.revision());
        silence.heard(rev);
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
    fn end(&mut self, why: Arc<str>, feeds: &Weak<dyn Directory>, generation: u64) {
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
