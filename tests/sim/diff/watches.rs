//! One etcd's watch streams and what each watch was told. etcd sends a stream's control
//! answers (created, cancelled) and its events on two channels merged in no fixed order, and
//! may split or join a catch-up's revisions across answers: so each watch's log keeps its
//! control answers, its events and its progress notices apart, and the logs are compared whole.
//! A progress request is the barrier: etcd answers it once every watch of the stream is caught
//! up, after the events up to then, and (etcd 3.6) not while a watch of it starts past the
//! current revision: such a stream is read for a while instead, and must stay silent.

use super::apply::normalise;
use super::requests::{Range, Step};
use etcd_client::proto::PbWatchResponse;
use etcd_client::{Client, WatchFilterType, WatchOptions, WatchStream};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// How long a barrier waits before it asks for progress again.
const PATIENCE: Duration = Duration::from_millis(120);

/// How long a barrier reads a stream that etcd must not answer (a watch starts ahead): longer
/// than etcd's 100 ms catch-up of the stream's other watches.
const AHEAD_WAIT: Duration = Duration::from_millis(300);

/// What one watch was told.
#[derive(Debug, Default, PartialEq)]
pub struct WatchLog {
    /// Created (or refused) and cancelled answers, with their header revisions.
    pub control: Vec<String>,
    /// Its events, one by one.
    pub events: Vec<String>,
    /// Progress notices naming it.
    pub progress: usize,
}

/// An etcd's watch streams, each opened with an anchor watch outside the workload's keys so
/// that it always has a watch to make a progress request answered.
pub struct Streams {
    /// Which etcd: for messages.
    side: &'static str,
    streams: Vec<WatchStream>,
    /// Per stream, per watch id (-1: refused creations), what it was told.
    pub logs: Vec<BTreeMap<i64, WatchLog>>,
    /// Watch events received.
    pub events: usize,
    /// Per stream, the start revisions of the watches asked for and not yet answered, in order
    /// (etcd answers a stream's creates in the order they were sent).
    asked: Vec<VecDeque<i64>>,
    /// Per stream, the start revision of each live watch, by id.
    live: Vec<BTreeMap<i64, i64>>,
    /// Per stream, the barriers at which a watch started ahead and etcd still answered the
    /// progress request (etcd 3.6 does not).
    pub answered_ahead: Vec<usize>,
}

impl Streams {
    pub async fn open(side: &'static str, c: &mut Client, n: usize) -> Self {
        let mut streams = Vec::new();
        for i in 0..n {
            streams.push(
                c.watch(format!("/anchor/{i}"), None)
                    .await
                    .expect("a watch stream"),
            );
        }
        Streams {
            side,
            logs: (0..n).map(|_| BTreeMap::new()).collect(),
            streams,
            events: 0,
            // The anchors, watched from now.
            asked: vec![VecDeque::from([0]); n],
            live: vec![BTreeMap::new(); n],
            answered_ahead: vec![0; n],
        }
    }

    /// Sends a watch or cancel step.
    pub async fn send(&mut self, step: &Step) {
        let sent = match step {
            Step::Watch {
                stream,
                range,
                start,
                prev_kv,
                filters,
                id,
            } => {
                let o = options(range, *start, *prev_kv, filters, *id);
                self.asked[*stream].push_back(*start);
                self.streams[*stream].watch(range.key.clone(), Some(o)).await
            }
            Step::Cancel { stream, id } => self.streams[*stream].cancel(*id).await,
            other => unreachable!("not a watch step: {other:?}"),
        };
        sent.expect("a watch stream takes requests");
    }

    /// Reads every stream up to its answer to a progress request, or, for a stream with a watch
    /// that starts past `revision` (etcd's current one), for [`AHEAD_WAIT`].
    pub async fn barrier(&mut self, revision: i64) {
        for i in 0..self.streams.len() {
            let mut starts = self.live[i].values().chain(&self.asked[i]);
            if starts.any(|&start| start > revision) {
                self.read_ahead(i).await;
                continue;
            }
            self.streams[i]
                .request_progress()
                .await
                .expect("a progress request");
            let mut waits = 0;
            loop {
                match tokio::time::timeout(PATIENCE, self.streams[i].message()).await {
                    Ok(Ok(Some(r))) if is_stream_progress(&r.0) => break,
                    Ok(Ok(Some(r))) => {
                        let compacted = r.0.compact_revision != 0;
                        let id = r.0.watch_id;
                        self.record(i, r.0);
                        if compacted {
                            // etcd keeps a compacted watch, and answers no progress request,
                            // until the client cancels it (as etcd's Go client does).
                            self.streams[i].cancel(id).await.expect("a cancel request");
                        }
                    }
                    Ok(other) => panic!("{}: watch stream {i} ended: {other:?}", self.side),
                    Err(_) => {
                        // etcd 3.5 drops a progress request while a watch is catching up: ask again.
                        waits += 1;
                        assert!(
                            waits < 80,
                            "{}: watch stream {i}: no progress answer in 10 s",
                            self.side
                        );
                        self.streams[i]
                            .request_progress()
                            .await
                            .expect("a progress request");
                    }
                }
            }
        }
    }

    /// Asks stream `i` for its progress and reads it for [`AHEAD_WAIT`], counting an answer.
    async fn read_ahead(&mut self, i: usize) {
        self.streams[i]
            .request_progress()
            .await
            .expect("a progress request");
        let until = tokio::time::Instant::now() + AHEAD_WAIT;
        while let Ok(r) = tokio::time::timeout_at(until, self.streams[i].message()).await {
            let r = r.expect("a watch stream").expect("an open watch stream");
            if is_stream_progress(&r.0) {
                // A lease may expire meanwhile and move the revision up to the start.
                let at = r.0.header.as_ref().map_or(0, |h| h.revision);
                if self.live[i].values().any(|&start| start > at) {
                    self.answered_ahead[i] += 1;
                }
            } else {
                self.record(i, r.0);
            }
        }
    }

    /// Reads what arrives within `quiet` of the last answer, on every stream.
    pub async fn drain(&mut self, quiet: Duration) {
        for i in 0..self.streams.len() {
            while let Ok(r) = tokio::time::timeout(quiet, self.streams[i].message()).await {
                let r = r.expect("a watch stream").expect("an open watch stream");
                if !is_stream_progress(&r.0) {
                    self.record(i, r.0);
                }
            }
        }
    }

    fn record(&mut self, stream: usize, mut r: PbWatchResponse) {
        self.track(stream, &r);
        normalise(&mut r.header);
        let log = self.logs[stream].entry(r.watch_id).or_default();
        if r.created || r.canceled {
            let rev = r.header.as_ref().map_or(-1, |h| h.revision);
            log.control.push(format!(
                "created={} canceled={} compact_revision={} reason={:?} header_revision={rev}",
                r.created, r.canceled, r.compact_revision, r.cancel_reason
            ));
        }
        if r.events.is_empty() && !r.created && !r.canceled {
            log.progress += 1;
        }
        self.events += r.events.len();
        log.events.extend(r.events.iter().map(|e| format!("{e:?}")));
    }
}

impl Streams {
    /// Which etcd these streams are on.
    pub fn side(&self) -> &'static str {
        self.side
    }

    /// Keeps [`Streams::live`] up to date with a stream's created and cancelled answers.
    fn track(&mut self, stream: usize, r: &PbWatchResponse) {
        if r.created {
            let start = self.asked[stream]
                .pop_front()
                .expect("a create answered was asked");
            if !r.canceled {
                self.live[stream].insert(r.watch_id, start);
            }
        } else if r.canceled {
            self.live[stream].remove(&r.watch_id);
        }
    }
}

/// A progress request's answer: for the whole stream, watch id -1, nothing else.
fn is_stream_progress(r: &PbWatchResponse) -> bool {
    r.watch_id == -1 && !r.created && !r.canceled && r.events.is_empty()
}

fn options(range: &Range, start: i64, prev_kv: bool, filters: &[i32], id: i64) -> WatchOptions {
    let mut o = WatchOptions::new().with_start_revision(start).with_watch_id(id);
    if !range.end.is_empty() {
        o = o.with_range(range.end.clone());
    }
    if prev_kv {
        o = o.with_prev_key();
    }
    let filters: Vec<WatchFilterType> = (filters.iter())
        .map(|&f| WatchFilterType::try_from(f).expect("a filter type"))
        .collect();
    o.with_filters(filters)
}
