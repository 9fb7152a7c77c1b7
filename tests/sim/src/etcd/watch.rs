//! The Watch service: per stream, watchers created, cancelled and asked for progress as etcd's
//! `serverWatchStream` does, each fed the events of its range from its next revision on.
//! Every watcher is caught up as soon as its stream task runs, so a watch is "unsynced" (and
//! compacted while behind) only between a change and that task's turn.

use super::state::State;
use super::store::KeyRange;
use super::{Held, Shared};
use etcd_client::proto::{PbEvent, PbWatchRequest, PbWatchRequestUnion, PbWatchResponse, PbWatchService};
use etcd_client::{EventType, WatchFilterType};
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// etcd's `clientv3.InvalidWatchID`: the id of a refused watch and of a stream's progress.
const INVALID_WATCH_ID: i64 = -1;

type Responses = Pin<Box<dyn Stream<Item = Result<PbWatchResponse, Status>> + Send>>;

/// The Watch service.
pub(crate) struct WatchService(pub(crate) Arc<Shared>);

#[tonic::async_trait]
impl PbWatchService for WatchService {
    type WatchStream = Responses;

    async fn watch(&self, r: Request<Streaming<PbWatchRequest>>) -> Result<Response<Responses>, Status> {
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(run(self.0.clone(), r.into_inner(), tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// One watcher of a stream.
struct Watcher {
    range: KeyRange,
    /// The revision asked for, 0 for "from now": etcd 3.6 answers no progress request for a
    /// watcher whose start is still ahead of its revision (etcd's `progressIfSync`).
    start: i64,
    /// The first revision whose events it has not been sent.
    next: i64,
    prev_kv: bool,
    filters: Vec<i32>,
    progress_notify: bool,
    /// No events sent since the last progress tick (etcd's `progress[id]`).
    quiet: bool,
    /// Cancelled by a compaction: etcd keeps such a watch on its stream, out of its synced
    /// set, until the client cancels it, and answers no progress request meanwhile.
    compacted: bool,
}

/// A stream's watchers, by id.
#[derive(Default)]
struct Watchers {
    by_id: BTreeMap<i64, Watcher>,
    next_id: i64,
}

async fn run(
    shared: Arc<Shared>,
    mut requests: Streaming<PbWatchRequest>,
    tx: mpsc::Sender<Result<PbWatchResponse, Status>>,
) {
    let generation = shared.generation();
    let mut changes = shared.subscribe();
    let every = shared.read(|s| s.config.progress_notify_interval);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let mut watchers = Watchers::default();
    loop {
        // Biased, as every `select!` of the simulated etcd: an unbiased one draws its first
        // branch from a random source no seed reaches.
        let mut out = tokio::select! {
            biased;
            req = requests.message() => match req {
                Ok(Some(req)) => {
                    if let Some(PbWatchRequestUnion::CreateRequest(c)) = &req.request_union {
                        shared.hold_back(Held::Watch, &c.key).await;
                    }
                    shared.read(|s| watchers.handle(s, req))
                }
                _ => return,
            },
            changed = changes.changed() => match changed {
                Ok(()) => Vec::new(),
                Err(_) => return,
            },
            _ = ticks.tick() => shared.read(|s| watchers.progress_tick(s)),
        };
        changes.borrow_and_update();
        if shared.generation() != generation {
            // The member's data was replaced (restore, wipe): its streams break, as a restart's do.
            let _ = tx
                .send(Err(Status::unavailable("etcdserver: server stopped")))
                .await;
            return;
        }
        out.extend(shared.read(|s| watchers.deliver(s)));
        for response in out {
            if tx.send(Ok(response)).await.is_err() {
                return;
            }
        }
    }
}

fn response(s: &State, watch_id: i64) -> PbWatchResponse {
    PbWatchResponse {
        header: s.header(),
        watch_id,
        ..Default::default()
    }
}

impl Watchers {
    /// Answers one request; events for a new watcher come with the next [`Watchers::deliver`].
    fn handle(&mut self, s: &State, req: PbWatchRequest) -> Vec<PbWatchResponse> {
        match req.request_union {
            Some(PbWatchRequestUnion::CreateRequest(c)) => {
                let start = if c.start_revision == 0 {
                    s.store.revision() + 1
                } else {
                    c.start_revision
                };
                let watcher = Watcher {
                    range: KeyRange::new(&c.key, &c.range_end),
                    start: c.start_revision,
                    next: start,
                    prev_kv: c.prev_kv,
                    filters: c.filters,
                    progress_notify: c.progress_notify,
                    quiet: true,
                    compacted: false,
                };
                vec![self.create(s, c.watch_id, watcher)]
            }
            Some(PbWatchRequestUnion::CancelRequest(c)) => match self.by_id.remove(&c.watch_id) {
                Some(_) => vec![PbWatchResponse {
                    canceled: true,
                    ..response(s, c.watch_id)
                }],
                None => Vec::new(),
            },
            Some(PbWatchRequestUnion::ProgressRequest(_)) => {
                // etcd answers once for the whole stream, once every watch is synced: not at
                // all without a watch, nor with one a compaction cancelled or one that starts
                // past the current revision. Every other watch here is caught up once
                // delivered to, as this is answered after.
                let mut out = self.deliver(s);
                let current = s.store.revision();
                if !self.by_id.is_empty() && self.by_id.values().all(|w| w.answers_progress(current)) {
                    out.push(response(s, INVALID_WATCH_ID));
                }
                out
            }
            None => Vec::new(),
        }
    }

    fn create(&mut self, s: &State, id: i64, watcher: Watcher) -> PbWatchResponse {
        let refused = |reason: &str| PbWatchResponse {
            created: true,
            canceled: true,
            cancel_reason: reason.to_string(),
            ..response(s, INVALID_WATCH_ID)
        };
        let end = &watcher.range.end;
        if !matches!(end.as_slice(), [] | [0]) && watcher.range.key >= *end {
            return refused("mvcc: watcher range is empty");
        }
        let id = match id {
            0 => {
                while self.by_id.contains_key(&self.next_id) {
                    self.next_id += 1;
                }
                self.next_id += 1;
                self.next_id - 1
            }
            id if self.by_id.contains_key(&id) => {
                return refused("mvcc: duplicate watch ID provided on the WatchStream");
            }
            id => id,
        };
        self.by_id.insert(id, watcher);
        PbWatchResponse {
            created: true,
            ..response(s, id)
        }
    }

    /// Sends each watcher the events it has not had, one answer per revision; a watcher left
    /// behind a compaction is told so (cancelled, with the compacted revision) and fed no more.
    fn deliver(&mut self, s: &State) -> Vec<PbWatchResponse> {
        let mut out = Vec::new();
        let compacted = s.store.compacted();
        let current = s.store.revision();
        for (&id, w) in self.by_id.iter_mut().filter(|(_, w)| !w.compacted) {
            if w.next < compacted {
                w.compacted = true;
                // etcd's compaction answer carries revision 0 in its header.
                let mut r = PbWatchResponse {
                    compact_revision: compacted,
                    canceled: true,
                    ..response(s, id)
                };
                r.header.get_or_insert_with(Default::default).revision = 0;
                out.push(r);
                continue;
            }
            let mut batch: Vec<PbEvent> = Vec::new();
            for e in s.store.events_from(w.next).filter(|e| w.wants(e)) {
                let rev = e.kv.as_ref().map_or(0, |kv| kv.mod_revision);
                if batch
                    .first()
                    .is_some_and(|b| b.kv.as_ref().map_or(0, |kv| kv.mod_revision) != rev)
                {
                    out.push(events(s, id, std::mem::take(&mut batch)));
                }
                batch.push(w.with_prev(s, e));
            }
            if !batch.is_empty() {
                out.push(events(s, id, batch));
                w.quiet = false;
            }
            w.next = w.next.max(current + 1);
        }
        out
    }

    /// etcd's progress ticker: each watcher that asked for progress notifications and had no
    /// event since the last tick is told the current revision.
    fn progress_tick(&mut self, s: &State) -> Vec<PbWatchResponse> {
        let mut out = self.deliver(s);
        let current = s.store.revision();
        for (&id, w) in self.by_id.iter_mut().filter(|(_, w)| !w.compacted) {
            if w.progress_notify && w.quiet && w.answers_progress(current) {
                out.push(response(s, id));
            }
            w.quiet = true;
        }
        out
    }
}

fn events(s: &State, watch_id: i64, events: Vec<PbEvent>) -> PbWatchResponse {
    let revision = events[0].kv.as_ref().map_or(0, |kv| kv.mod_revision);
    let mut r = response(s, watch_id);
    r.header.get_or_insert_with(Default::default).revision = revision;
    r.events = events;
    r
}

impl Watcher {
    /// Whether etcd would tell this watcher its progress at revision `current`.
    fn answers_progress(&self, current: i64) -> bool {
        !self.compacted && current >= self.start
    }

    fn wants(&self, e: &PbEvent) -> bool {
        let Some(kv) = &e.kv else { return false };
        let filtered = |f: WatchFilterType| self.filters.contains(&(f as i32));
        let dropped = match EventType::try_from(e.r#type) {
            Ok(EventType::Put) => filtered(WatchFilterType::NoPut),
            Ok(EventType::Delete) => filtered(WatchFilterType::NoDelete),
            Err(_) => true,
        };
        !dropped && self.range.contains(&kv.key)
    }

    /// The event with its previous key-value if asked for: etcd reads it when it sends, at the
    /// revision before the event, so none for a creation or once that revision is compacted.
    fn with_prev(&self, s: &State, e: &PbEvent) -> PbEvent {
        let mut e = e.clone();
        let kv = e.kv.as_ref().expect("an event has a key-value");
        let creation = e.r#type == EventType::Put as i32 && kv.version == 1;
        if self.prev_kv && !creation && s.store.check_readable(kv.mod_revision - 1).is_ok() {
            e.prev_kv = s.store.get_at(&kv.key, kv.mod_revision - 1);
        }
        e
    }
}
