//! The lock's life at its edges (issue #40's findings), on a real etcd: a lock removed and
//! declared again keeps its token epoch, two clusters withdrawing at once leave nothing of the
//! lock behind (both through the operator's door, `Store`), and a release sent again past the
//! hedge, its first copy answered late by a member behind a proxy, is never answered lost.

use podlock::lock::{LockId, Settings, Store};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::common::{EtcdServer, Sidecar, declare};

async fn store(etcd: &EtcdServer) -> Store {
    Store::new(etcd.client().await)
}

/// The token epoch in `lock`'s settings as etcd has them (`None`: no settings).
async fn epoch(etcd: &EtcdServer, lock: &str) -> Option<u64> {
    let key = format!("/podlock/v1/config/default/{lock}");
    let resp = etcd.client().await.get(key, None).await.unwrap();
    let kv = resp.kvs().first()?;
    let settings: serde_json::Value = serde_json::from_slice(kv.value()).unwrap();
    Some(settings["epoch"].as_u64().unwrap_or(0))
}

/// Finding 1: the removal deleted the settings and the epoch in them, so a lock declared
/// again published under epoch 0, its tokens bare revisions below every token of the epoch
/// an etcd wipe had moved it to. Fails on the old removal with `epoch Some(0) after
/// --delete and declare`.
#[tokio::test]
async fn a_lock_removed_and_declared_again_keeps_its_token_epoch() {
    let etcd = EtcdServer::start().await;
    let store = store(&etcd).await;
    let lock = LockId::new("default", "ledger").unwrap();
    let moved = Settings {
        epoch: 3,
        ..Settings::default()
    };
    assert_eq!(store.publish(&lock, &moved, "", 0, false).await.unwrap(), Some(0));
    declare(&etcd.endpoint, &["ledger", "--delete"]);
    assert_eq!(epoch(&etcd, "ledger").await, None);
    declare(&etcd.endpoint, &["ledger"]);
    let kept = epoch(&etcd, "ledger").await;
    assert_eq!(kept, Some(3), "epoch {kept:?} after --delete and declare");
    // A withdrawal (the DistributedLock deleted) keeps it too.
    let withdrawn = store.withdraw(&lock, "").await.unwrap().unwrap();
    assert!(withdrawn.removed, "{withdrawn:?}");
    declare(&etcd.endpoint, &["ledger"]);
    let kept = epoch(&etcd, "ledger").await;
    assert_eq!(kept, Some(3), "epoch {kept:?} after a withdrawal and declare");
    // Once published again the settings carry it; a lock that never left epoch 0 keeps
    // nothing.
    declare(&etcd.endpoint, &["plain"]);
    declare(&etcd.endpoint, &["plain", "--delete"]);
    assert_eq!(etcd.count("/podlock/v1/retired/").await, 0);
}

/// Finding 4: two clusters whose DistributedLocks are deleted at the same moment each saw the
/// other's declaration, took off their own and left the settings in etcd with no
/// DistributedLock anywhere. Fails on the old withdrawal with `settings left: 1`.
#[tokio::test]
async fn two_clusters_withdrawing_at_once_leave_nothing_behind() {
    let etcd = EtcdServer::start().await;
    let store = store(&etcd).await;
    for round in 0..5 {
        let lock = LockId::new("default", &format!("shared-{round}")).unwrap();
        store.declare_in(&lock, "east").await.unwrap();
        store.declare_in(&lock, "west").await.unwrap();
        let settings = Settings::default();
        store.publish(&lock, &settings, "east", 0, false).await.unwrap();
        let (east, west) = tokio::join!(store.withdraw(&lock, "east"), store.withdraw(&lock, "west"));
        let (east, west) = (east.unwrap().unwrap(), west.unwrap().unwrap());
        let settings_left = etcd
            .count(&format!("/podlock/v1/config/default/{}", lock.name))
            .await;
        let declared_left = etcd
            .count(&format!("/podlock/v1/declared/default/{}/", lock.name))
            .await;
        assert_eq!(
            (settings_left, declared_left),
            (0, 0),
            "settings left: {settings_left}, declarations left: {declared_left} (east {east:?}, west {west:?})"
        );
        assert!(east.removed || west.removed, "east {east:?}, west {west:?}");
    }
}

/// TCP proxies in front of etcd members that pass everything at once, except after [`arm`]:
/// the first proxy a request then reaches holds that member's answers back by `delay` for the
/// next `delay` (a member whose answers come late, past the engine's 500 ms hedge, while the
/// others answer at once).
///
/// [`arm`]: LateMember::arm
struct LateMember {
    armed: Arc<AtomicBool>,
    delay: Duration,
}

impl LateMember {
    fn new(delay: Duration) -> Self {
        LateMember {
            armed: Arc::default(),
            delay,
        }
    }

    /// The next request any proxy sees is answered late.
    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// A proxy in front of `upstream`; returns its URL.
    async fn proxy(&self, upstream: &str) -> String {
        let upstream = upstream.trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (armed, delay) = (self.armed.clone(), self.delay);
        let late_until = Arc::new(Mutex::new(Instant::now()));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let ((client_rx, client_tx), (server_rx, server_tx)) =
                    (client.into_split(), server.into_split());
                let claim = (armed.clone(), late_until.clone(), delay);
                tokio::spawn(requests(client_rx, server_tx, claim));
                tokio::spawn(answers(server_rx, client_tx, late_until.clone(), delay));
            }
        });
        url
    }
}

/// Copies requests to the member; the first one after an arm makes this member late.
async fn requests(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    (armed, late_until, delay): (Arc<AtomicBool>, Arc<Mutex<Instant>>, Duration),
) {
    let mut buf = vec![0; 64 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        if armed.swap(false, Ordering::SeqCst) {
            *late_until.lock().unwrap() = Instant::now() + delay;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Copies the member's answers back, in order; those that come while it is late, `delay`
/// after they came.
async fn answers(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    late_until: Arc<Mutex<Instant>>,
    delay: Duration,
) {
    let (chunks, mut queued) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    tokio::spawn(async move {
        let mut buf = vec![0; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            let now = Instant::now();
            let at = if now < *late_until.lock().unwrap() {
                now + delay
            } else {
                now
            };
            if chunks.send((at, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    });
    while let Some((at, chunk)) = queued.recv().await {
        tokio::time::sleep_until(at).await;
        if to.write_all(&chunk).await.is_err() {
            return;
        }
    }
}

/// Finding 3: a release whose first copy went to a member that answers late (here: 800 ms, past
/// the 500 ms hedge) was sent again to another member, which found the key already deleted (by
/// the first copy) and answered first: the release was reported 410 `lock_lost`, with a `lost`
/// event, though it had succeeded. Fails on the old hedge with `release 0 answered 410`.
#[tokio::test]
async fn a_release_sent_again_past_the_hedge_is_never_answered_lost() {
    let members = EtcdServer::cluster(3).await;
    declare(&members[0].endpoint, &["ledger"]);
    let late = LateMember::new(Duration::from_millis(800));
    let mut endpoints = vec![];
    for m in &members {
        endpoints.push(late.proxy(&m.endpoint).await);
    }
    let s = Sidecar::start(&endpoints.join(","), "pod-a", &[]).await;
    let rounds = 6;
    for i in 0..rounds {
        s.must_acquire("ledger", json!({"waitSeconds": 10})).await;
        late.arm();
        let (status, body) = s.post("ledger", "release", json!({})).await;
        assert_eq!(status, 200, "release {i} answered {status}: {body}");
    }
    let resent = s.metric("podlock_etcd_requests_resent_total").await;
    eprintln!(
        "{rounds} releases, each first sent to a member that answers 800 ms late: all 200; {resent} requests resent"
    );
    assert!(
        resent >= rounds as f64 / 2.0,
        "only {resent} requests were sent again: the late member was not used"
    );
}
