//! Recording etcd's log while the workers run, across the faults that rebuild etcd: each
//! rebuild starts a new *era* of revisions. A wiped etcd starts its revisions at 1 again (the
//! watch finds etcd's revision below the one it waits for, and watches the new era from 1); one
//! restored from a snapshot with `--bump-revision --mark-compacted` has no history before its
//! restore (the watch is cancelled as compacted, and the new era starts from the keys etcd
//! holds at the compacted revision, then watches on from there).

use etcd_client::{Client, EventType, GetOptions, WatchOptions, WatchResponse};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::{sleep, timeout};

use super::{Arrival, Event, Log};
use crate::now;

/// Every podlock key.
const PREFIX: &str = "/podlock/v1/";

/// Where the recording stands: the era and the next revision to watch from.
struct Cursor {
    era: usize,
    next: i64,
}

/// Watches every podlock key from revision 1 until it has delivered revision `end` (set by
/// the caller when it is done: until then `i64::MAX`), watching again from the next revision
/// whenever the stream breaks (a member killed, stalled or cut off), and in a new era whenever
/// etcd was rebuilt (see the module's doc).
pub async fn record(endpoints: String, end: Arc<AtomicI64>) -> Log {
    let endpoints: Vec<&str> = endpoints.split(',').collect();
    let log = Mutex::new(Log::default());
    let mut at = Cursor { era: 0, next: 1 };
    while at.next <= end.load(Ordering::Relaxed) {
        let watched = async {
            let mut etcd = Client::connect(&endpoints, None).await?;
            let revision = etcd.get(PREFIX, None).await?.header().map_or(0, |h| h.revision());
            if revision < at.next - 1 {
                // Wiped: the new etcd's history is whole, from its first revision.
                at = Cursor {
                    era: at.era + 1,
                    next: 1,
                };
            }
            follow(&mut etcd, &log, &mut at, &end).await
        };
        if watched.await.is_err() {
            sleep(Duration::from_millis(100)).await;
        }
    }
    log.into_inner().unwrap()
}

/// Follows one watch from `at` until `end`, the stream's end, or an error; a watch cancelled
/// because its revision was compacted starts the next era (see [`restored`]).
async fn follow(
    etcd: &mut Client,
    log: &Mutex<Log>,
    at: &mut Cursor,
    end: &AtomicI64,
) -> Result<(), etcd_client::Error> {
    let opts = WatchOptions::new().with_prefix().with_start_revision(at.next);
    let mut stream = etcd.watch(PREFIX, Some(opts)).await?;
    while at.next <= end.load(Ordering::Relaxed) {
        // Waits a while at most: the end may be set while no event comes.
        let Ok(resp) = timeout(Duration::from_millis(200), stream.message()).await else {
            continue;
        };
        let Some(resp) = resp? else { break };
        if resp.compact_revision() > 0 {
            restored(etcd, log, at, resp.compact_revision()).await?;
            break;
        }
        at.next = at.next.max(take(log, at.era, &resp) + 1);
    }
    Ok(())
}

/// Starts the era of an etcd restored with its history compacted up to `compacted`: the keys
/// it holds there, as put at that revision (in the order of their creation, their create
/// revisions kept), then the watch from the next revision.
async fn restored(
    etcd: &mut Client,
    log: &Mutex<Log>,
    at: &mut Cursor,
    compacted: i64,
) -> Result<(), etcd_client::Error> {
    let opts = GetOptions::new().with_prefix().with_revision(compacted);
    let resp = etcd.get(PREFIX, Some(opts)).await?;
    let mut kvs: Vec<_> = resp.kvs().iter().collect();
    kvs.sort_by_key(|kv| kv.create_revision());
    let era = at.era + 1;
    let mut log = log.lock().unwrap();
    for kv in kvs {
        log.events.push(Event {
            era,
            revision: compacted,
            created: kv.create_revision(),
            key: String::from_utf8_lossy(kv.key()).into(),
            value: serde_json::from_slice(kv.value()).ok(),
            seeded: true,
        });
    }
    log.arrivals.push(Arrival {
        at: now(),
        era,
        revision: compacted,
    });
    *at = Cursor {
        era,
        next: compacted + 1,
    };
    Ok(())
}

/// Adds a watch response's events to the log, in `era`; its newest revision.
fn take(log: &Mutex<Log>, era: usize, resp: &WatchResponse) -> i64 {
    let mut log = log.lock().unwrap();
    let mut newest = 0;
    for ev in resp.events() {
        let Some(kv) = ev.kv() else { continue };
        newest = newest.max(kv.mod_revision());
        log.events.push(Event {
            era,
            revision: kv.mod_revision(),
            created: kv.create_revision(),
            key: String::from_utf8_lossy(kv.key()).into(),
            value: match ev.event_type() {
                EventType::Put => serde_json::from_slice(kv.value()).ok(),
                EventType::Delete => None,
            },
            seeded: false,
        });
    }
    if newest > 0 {
        log.arrivals.push(Arrival {
            at: now(),
            era,
            revision: newest,
        });
    }
    newest
}
