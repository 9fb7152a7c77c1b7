//! Watches on etcd keys that notice a stalled member: see [`KeyWatch::next`]. Each new watch
//! goes to a member that answers (see [`Members`]).

use etcd_client::{WatchFilterType, WatchOptions, WatchStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::timeout;
use tracing::debug;

use super::members::Members;
use super::silence::{Silence, WATCH_SILENCE};
use crate::lock::error::{LockError, Unavailable};
use crate::lock::etcd::{Etcd, Stats};

/// How long etcd may take to answer a progress request on a stream whose watches are all on its
/// synced path (see [`Etcd::watch_keys_synced`]); on loopback it answers within a millisecond.
const SYNC_CHECK: Duration = Duration::from_millis(10);

/// How many times [`Etcd::watch_keys_synced`] makes its watches before it settles for watches
/// etcd may serve up to 100 ms late.
const SYNC_ATTEMPTS: u32 = 3;

impl Etcd {
    /// Watches each of `targets` on one stream, each from its own revision on (see
    /// [`Target::from`]) or from the current revision.
    ///
    /// Returns once etcd confirmed every watch, with the revision the watches start after:
    /// every change after it will be delivered. Watching from "now" rather than from a past
    /// revision keeps the watch on etcd's synced path; a watch that starts in the past waits for
    /// etcd's 100 ms catch-up loop, which is what makes etcd's own Mutex hand off slowly. Where
    /// that delay does not matter, a start revision saves the read that would close the gap.
    pub async fn watch_keys(&self, targets: &[Target]) -> Result<KeyWatch, LockError> {
        let (first, rest) = targets
            .split_first()
            .ok_or_else(|| LockError::Invalid("nothing to watch".into()))?;
        // Opening the stream waits for the member's answer: bounded, as a stalled member never
        // gives one (the watch's own silence check starts only once it is open).
        let clients = self.link.current();
        let (member, client) = clients.pick();
        let mut silence = Silence::new(client.clone(), first.key.clone());
        targets.iter().for_each(|t| silence.asked(t.from));
        let mut client = client.watch_client();
        let open = client.watch(first.key.clone(), first.options());
        let Ok(opened) = timeout(2 * WATCH_SILENCE, open).await else {
            clients.members.suspect(member, "it did not open a watch");
            return Err(LockError::Unavailable(Unavailable::MemberStalled {
                what: "did not open a watch",
                within: 2 * WATCH_SILENCE,
            }));
        };
        let mut stream = opened?;
        self.stats.watches.fetch_add(1, Ordering::Relaxed);
        for t in rest {
            self.stats.watches.fetch_add(1, Ordering::Relaxed);
            stream.watch(t.key.clone(), t.options()).await?;
        }
        // Counted from here on; `KeyWatch`'s drop counts it closed.
        self.stats.open_streams.fetch_add(1, Ordering::Relaxed);
        let mut watch = KeyWatch {
            stream,
            stats: self.stats.clone(),
            members: clients.members.clone(),
            member,
            silence,
            start_revision: 0,
            fired: false,
            events: vec![],
        };
        let mut created = 0;
        while created < targets.len() && !watch.fired {
            let resp = watch.next().await?;
            if resp.created() {
                // etcd answers a stream's creates in the order they were sent.
                let rev = match targets[created].from {
                    Some(from) => from - 1,
                    None => resp.header().map_or(0, |h| h.revision()),
                };
                created += 1;
                watch.start_revision = watch.start_revision.max(rev);
            }
        }
        Ok(watch)
    }

    /// Like [`Etcd::watch_keys`] for targets watched from now, but makes sure etcd serves them on
    /// its synced path; returns whether the watches had to be made again (so their start moved
    /// on). etcd 3.5 registers a watch "from now" at a revision it read just before: a write
    /// committed in between leaves the watch among the unsynced ones, which etcd's catch-up loop
    /// serves only every 100 ms. About 2% of watches made on a busy lock met that race, and a
    /// waiter woken late holds up everyone queued behind it (bench/README.md). etcd answers a
    /// progress request only when every watch of the stream is synced (`progressIfSync`), so an
    /// unanswered one says this stream met the race: make the watches again, on a new stream.
    pub async fn watch_keys_synced(&self, targets: &[Target]) -> Result<(KeyWatch, bool), LockError> {
        let mut made = 1;
        loop {
            let mut watch = self.watch_keys(targets).await?;
            if made == SYNC_ATTEMPTS || watch.synced().await? {
                return Ok((watch, made > 1));
            }
            debug!(
                start_revision = watch.start_revision,
                "etcd left a watch from now unsynced; making it again"
            );
            made += 1;
        }
    }
}

/// A key (or every key under a prefix) to watch, for deletion only or for any change, from a
/// revision or from now.
#[derive(Debug, Clone)]
pub struct Target {
    key: Vec<u8>,
    puts: bool,
    prefix: bool,
    from: Option<i64>,
}

impl Target {
    /// Watch `key` for its deletion.
    pub fn deletion(key: &[u8]) -> Self {
        Target {
            key: key.to_vec(),
            puts: false,
            prefix: false,
            from: None,
        }
    }

    /// Watch `key` for any write or deletion.
    pub fn any_change(key: &[u8]) -> Self {
        Target {
            puts: true,
            ..Target::deletion(key)
        }
    }

    /// Watch every key under `prefix` for any write or deletion (a whole queue, for an
    /// observer of its holders: any key may change them).
    pub fn any_change_under(prefix: &[u8]) -> Self {
        Target {
            prefix: true,
            ..Target::any_change(prefix)
        }
    }

    /// Watch from revision `rev` on (`None`: from now). Changes after a read at `rev - 1` then
    /// cannot be missed without reading again, at the cost of etcd's catch-up delay (up to
    /// 100 ms) for this key.
    pub fn from(self, rev: Option<i64>) -> Self {
        Target { from: rev, ..self }
    }

    /// The key (or prefix) watched.
    pub(in crate::lock) fn key(&self) -> &[u8] {
        &self.key
    }

    /// The revision its watch starts at (`None`: from now).
    pub(in crate::lock) fn start(&self) -> Option<i64> {
        self.from
    }

    fn options(&self) -> Option<WatchOptions> {
        Some(self.watch_options())
    }

    /// The options of its watch's create request.
    pub(in crate::lock) fn watch_options(&self) -> WatchOptions {
        let filters = if self.puts {
            vec![]
        } else {
            vec![WatchFilterType::NoPut]
        };
        let mut o = WatchOptions::new().with_filters(filters);
        if self.prefix {
            o = o.with_prefix();
        }
        match self.from {
            Some(rev) => o.with_start_revision(rev),
            None => o,
        }
    }
}

/// Watches made by [`Etcd::watch_keys`].
pub struct KeyWatch {
    stream: WatchStream,
    stats: Arc<Stats>,
    /// Told when the member serving the stream (`member`) is found silent.
    members: Arc<Members>,
    member: Option<usize>,
    /// Whether a silence of the member is etcd's rule (a watch starts ahead of it).
    silence: Silence,
    /// The largest revision at which a watch was created.
    pub start_revision: i64,
    fired: bool,
    /// The changes delivered and not yet taken ([`KeyWatch::take_events`]).
    events: Vec<etcd_client::Event>,
}

impl Drop for KeyWatch {
    fn drop(&mut self) {
        self.stats.open_streams.fetch_sub(1, Ordering::Relaxed);
    }
}

impl KeyWatch {
    /// The next message on the stream. After [`WATCH_SILENCE`] without one, etcd is asked for a
    /// progress notification (answered at once by a member that serves); without an answer
    /// within another [`WATCH_SILENCE`] the member is taken for stalled and this fails, so the
    /// caller reads again and watches anew instead of sleeping on a silent stream until HTTP/2
    /// keepalive gives up (~5 s).
    async fn next(&mut self) -> Result<etcd_client::WatchResponse, LockError> {
        let mut asked = false;
        let resp = loop {
            match timeout(WATCH_SILENCE, self.stream.message()).await {
                Ok(message) => break message?,
                Err(_) if asked && self.silence.explained(&self.stats).await => asked = false,
                Err(_) if asked => {
                    self.members.suspect(self.member, "a watch on it went silent");
                    return Err(LockError::Unavailable(Unavailable::MemberStalled {
                        what: "serving a watch did not answer a progress request",
                        within: WATCH_SILENCE,
                    }));
                }
                Err(_) => {
                    self.stream.request_progress().await?;
                    asked = true;
                }
            }
        };
        let resp =
            resp.ok_or_else(|| LockError::from(Unavailable::WatchEnded("it closed the stream".into())))?;
        self.silence.heard(resp.header().map_or(0, |h| h.revision()));
        if resp.canceled() {
            return Err(LockError::from(Unavailable::WatchEnded(format!(
                "cancelled: {}",
                resp.cancel_reason()
            ))));
        }
        let n = resp.events().len() as u64;
        if n > 0 {
            self.stats.watch_events.fetch_add(n, Ordering::Relaxed);
            self.fired = true;
            self.events.extend_from_slice(resp.events());
        }
        Ok(resp)
    }

    /// Whether etcd serves every watch of this stream on its synced path: it answers a progress
    /// request within [`SYNC_CHECK`] (see [`Etcd::watch_keys_synced`]). A change already
    /// delivered counts as synced: the caller acts on it at once.
    async fn synced(&mut self) -> Result<bool, LockError> {
        if self.fired {
            return Ok(true);
        }
        self.stream.request_progress().await?;
        let answered = async {
            loop {
                let resp = self.next().await?;
                if is_progress(&resp) || self.fired {
                    return Ok(true);
                }
            }
        };
        timeout(SYNC_CHECK, answered).await.unwrap_or(Ok(false))
    }

    /// Completes when any watched key changes (at once if one already did).
    pub async fn changed(&mut self) -> Result<(), LockError> {
        while !self.fired {
            self.next().await?;
        }
        Ok(())
    }

    /// The changes delivered so far, taken: [`KeyWatch::changed`] then waits for the next.
    pub fn take_events(&mut self) -> Vec<etcd_client::Event> {
        self.fired = false;
        std::mem::take(&mut self.events)
    }

    /// Watches one more target on the same stream: a change to it also completes
    /// [`KeyWatch::changed`].
    pub async fn also(&mut self, target: &Target) -> Result<(), LockError> {
        self.stats.watches.fetch_add(1, Ordering::Relaxed);
        self.silence.asked(target.from);
        let key = target.key.clone();
        Ok(self.stream.watch(key, target.options()).await?)
    }
}

/// Whether `resp` answers a progress request (no watch, no event).
fn is_progress(resp: &etcd_client::WatchResponse) -> bool {
    resp.watch_id() == -1 && resp.events().is_empty()
}
