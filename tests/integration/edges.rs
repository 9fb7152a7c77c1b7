//! The lock's life at its edges (issue #40's findings), on a real etcd: a lock removed and
//! declared again keeps its token epoch, two clusters withdrawing at once leave nothing of the
//! lock behind (both through the operator's door, `Store`), and, for sidecars on a 3-member
//! etcd, a late copy of an enqueue does not hold the lock and a release sent again past the
//! hedge is answered by what its first copy did.

use etcd_client::{EventType, WatchOptions};
use podlock::lock::{LockId, Settings, Store};
use serde_json::json;
use std::time::{Duration, Instant};

use crate::common::held::HeldRequests;
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

/// How late the held copy of the enqueue reaches its member: past the 500 ms hedge, so the
/// acquire is granted through another copy and released before this one lands.
const LATE: Duration = Duration::from_millis(1500);

/// A late copy of an enqueue (the safety run's 5 s stalls after etcd leader kills): the first
/// copy of pod-a's enqueue reaches its member 1.5 s late, after the hedge sent it elsewhere and
/// pod-a was granted and released. etcd applies it then: the key is back on pod-a's live lease
/// with no acquire behind it. It held the lock until the orphan sweep removed it (5 to 10 s),
/// and pod-b's acquire waited that long; fails so on the code before the guard
/// (`src/lock/life/late.rs`) with `pod-b waited 8.603540009s behind a late copy`.
#[tokio::test]
async fn a_late_copy_of_an_enqueue_does_not_hold_the_lock() {
    let members = EtcdServer::cluster(3).await;
    declare(&members[0].endpoint, &["ledger"]);
    let late = HeldRequests::new(LATE);
    let mut endpoints = vec![];
    for m in &members {
        endpoints.push(late.proxy(&m.endpoint).await);
    }
    let a = Sidecar::start(&endpoints.join(","), "pod-a", &[]).await;
    let b = Sidecar::start(&members[0].endpoint, "pod-b", &[]).await;
    let landed = puts_of(&members[0], "/podlock/v1/queue/default/ledger/").await;
    late.arm(b"/podlock/v1/queue/default/ledger/");
    a.must_acquire("ledger", json!({"waitSeconds": 10})).await;
    assert_eq!(late.held(), 1, "the enqueue was not held back");
    let (status, body) = a.post("ledger", "release", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let copy = tokio::time::timeout(LATE * 2, landed)
        .await
        .expect("the late copy never landed: the test made no fault")
        .unwrap();
    let (status, body) = b.post("ledger", "acquire", json!({"waitSeconds": 10})).await;
    let waited = copy.elapsed();
    assert_eq!(status, 200, "{body}");
    eprintln!("a late copy of pod-a's enqueue landed; pod-b was granted {waited:?} later");
    assert!(
        waited < Duration::from_secs(2),
        "pod-b waited {waited:?} behind a late copy"
    );
}

/// Completes when a key under `prefix` of pod-a is put a second time (its late copy), with
/// when that was seen.
async fn puts_of(etcd: &EtcdServer, prefix: &str) -> tokio::task::JoinHandle<Instant> {
    let mut client = etcd.client().await;
    let mut stream = client
        .watch(prefix, Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    tokio::spawn(async move {
        let mut created = 0;
        loop {
            let resp = stream.message().await.unwrap().expect("the watch ended");
            for e in resp.events() {
                let kv = e.kv().unwrap();
                let ours = kv.key_str().unwrap().ends_with("/pod-a");
                if e.event_type() == EventType::Put && kv.version() == 1 && ours {
                    created += 1;
                    if created == 2 {
                        return Instant::now();
                    }
                }
            }
        }
    })
}

/// Finding 3: a release whose first copy went to a member that answers late (800 ms, past the
/// 500 ms hedge) is sent again to another member, which finds the key already deleted by the
/// first copy. Without the release receipt it was answered 410 `lock_lost`, with a `lost`
/// event, though it had succeeded; fails so on the code before receipts with `release 0
/// answered 410`.
#[tokio::test]
async fn a_release_sent_again_past_the_hedge_is_answered_released() {
    let members = EtcdServer::cluster(3).await;
    declare(&members[0].endpoint, &["ledger"]);
    declare(&members[0].endpoint, &["audit"]);
    let late = HeldRequests::answers(Duration::from_millis(800));
    let mut endpoints = vec![];
    for m in &members {
        endpoints.push(late.proxy(&m.endpoint).await);
    }
    let s = Sidecar::start(&endpoints.join(","), "pod-a", &[]).await;
    let rounds = 6;
    for i in 0..rounds {
        // Every other round a set of two locks, released in one transaction (`set::release`).
        let with: &[&str] = if i % 2 == 0 { &[] } else { &["audit"] };
        s.must_acquire("ledger", json!({"waitSeconds": 10, "with": with}))
            .await;
        late.arm(b"/podlock/v1/queue/default/ledger/");
        let (status, body) = s.post("ledger", "release", json!({})).await;
        assert_eq!(status, 200, "release {i} answered {status}: {body}");
    }
    let resent = s.metric("podlock_etcd_requests_resent_total").await;
    eprintln!(
        "{rounds} releases (3 of a set), each first sent to a member that answers 800 ms late: all 200; {resent} requests resent"
    );
    assert!(
        resent >= f64::from(rounds) / 2.0,
        "only {resent} requests were sent again: the late member was not used"
    );
}

/// The entry of the only key under `lock`'s queue, as JSON.
async fn only_entry(etcd: &EtcdServer, lock: &str) -> serde_json::Value {
    let prefix = format!("/podlock/v1/queue/default/{lock}/");
    let opts = etcd_client::GetOptions::new().with_prefix();
    let resp = etcd.client().await.get(prefix, Some(opts)).await.unwrap();
    assert_eq!(resp.kvs().len(), 1, "one key under {lock}'s queue");
    serde_json::from_slice(resp.kvs()[0].value()).unwrap()
}

/// Issue #54, F2: a copy of a hold's grant record (`acquiredAt`) reaches its member 1.5 s
/// late, after the hedge's copy recorded the grant and the operator wrote a yield request into
/// the entry. Guarded by create revision only, the late copy put the entry back without the
/// request: the holder was never told, never ended, and the request vanished from status.
/// Fails so on the code before the fix with `the late record erased the yield request`.
#[tokio::test]
async fn a_late_copy_of_a_grant_record_keeps_a_yield_request() {
    let members = EtcdServer::cluster(3).await;
    // Two slots: a grant made at the enqueue records itself right after its answer.
    declare(&members[0].endpoint, &["ledger", "--max-holders", "2"]);
    let late = HeldRequests::new(LATE);
    let mut endpoints = vec![];
    for m in &members {
        endpoints.push(late.proxy(&m.endpoint).await);
    }
    let a = Sidecar::start(&endpoints.join(","), "pod-a", &[]).await;
    late.arm(b"acquiredAt"); // only a grant record writes it
    a.must_acquire("ledger", json!({})).await;
    let recorded = crate::common::wait_until(Duration::from_secs(5), || async {
        only_entry(&members[0], "ledger").await["acquiredAt"].is_string()
    })
    .await;
    recorded.expect("the hedge's copy of the record landed");
    assert_eq!(late.held(), 1, "the record was not held back");
    let store = store(&members[0]).await;
    let lock = LockId::new("default", "ledger").unwrap();
    let held = store.holding(&lock).await.unwrap();
    let by = std::time::SystemTime::now() + Duration::from_secs(600);
    let asked = store.ask_to_yield(&held[0], by).await.unwrap();
    assert!(asked.is_some(), "the yield request was written");
    tokio::time::sleep(LATE + Duration::from_millis(1000)).await; // the late copy lands
    let entry = only_entry(&members[0], "ledger").await;
    assert!(
        entry["yieldDeadline"].is_string(),
        "the late record erased the yield request: {entry}"
    );
    let (_, view) = a.get("/v1/locks/ledger").await;
    assert!(view["holders"][0]["yieldDeadline"].is_string(), "{view}");
}

/// Issue #54, F5: two holder ids of one pod hold a semaphore; one's release is applied at
/// once but its member answers 800 ms late, so the hedge sends it again; meanwhile the other
/// holder releases. With one receipt per lock and lease, the second release overwrote the
/// first's, and the copy sent again found the key gone and another key's receipt: a release
/// that succeeded was answered 410 (`podlock lock` exits as lost). Fails so on the code before
/// the fix with `release of first answered 410`.
#[tokio::test]
async fn two_holders_of_one_pod_releasing_at_once_are_both_answered_released() {
    let members = EtcdServer::cluster(3).await;
    declare(&members[0].endpoint, &["ledger", "--max-holders", "2"]);
    let late = HeldRequests::answers(Duration::from_millis(800));
    let mut endpoints = vec![];
    for m in &members {
        endpoints.push(late.proxy(&m.endpoint).await);
    }
    let s = std::sync::Arc::new(Sidecar::start(&endpoints.join(","), "pod-a", &[]).await);
    for round in 0u32..3 {
        for holder in ["first", "second"] {
            s.must_acquire("ledger", json!({"holderId": holder})).await;
        }
        late.arm(b"/first"); // the first holder's release: its key ends with its holder id
        let first = {
            let s = s.clone();
            tokio::spawn(async move { s.post("ledger", "release", json!({"holderId": "first"})).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (status, body) = s.post("ledger", "release", json!({"holderId": "second"})).await;
        assert_eq!(
            status, 200,
            "round {round}: release of second answered {status}: {body}"
        );
        let (status, body) = first.await.unwrap();
        assert_eq!(
            status, 200,
            "round {round}: release of first answered {status}: {body}"
        );
        assert_eq!(late.held(), round + 1, "the first release was not held back");
    }
    let resent = s.metric("podlock_etcd_requests_resent_total").await;
    assert!(resent >= 3.0, "only {resent} requests were sent again");
}

/// Issue #54, F9: a release's receipt lies outside its lock's queue, bound to the sidecar's
/// lease: a lock removed (`declare --delete`, or its DistributedLock deleted) left it in etcd
/// until that lease ended, which a live sidecar's never does. Fails so on the code before the
/// fix with `receipts left after the lock's removal: 1`.
#[tokio::test]
async fn a_locks_removal_removes_its_release_receipts() {
    let etcd = EtcdServer::start().await;
    let store = store(&etcd).await;
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let receipts = |lock: &str| format!("/podlock/v1/queue/default/.released/{lock}/");
    for lock in ["ledger", "audit", "audit-2"] {
        declare(&etcd.endpoint, &[lock]);
        s.must_acquire(lock, json!({})).await;
        assert_eq!(s.post(lock, "release", json!({})).await.0, 200);
        assert_eq!(
            etcd.count(&receipts(lock)).await,
            1,
            "{lock}'s release left a receipt"
        );
    }
    declare(&etcd.endpoint, &["ledger", "--delete"]);
    let left = etcd.count(&receipts("ledger")).await;
    assert_eq!(left, 0, "receipts left after the lock's removal: {left}");
    // Through the operator's door too (a DistributedLock deleted), and only the lock's own.
    let audit = LockId::new("default", "audit").unwrap();
    assert!(store.withdraw(&audit, "").await.unwrap().unwrap().removed);
    assert_eq!(etcd.count(&receipts("audit")).await, 0);
    assert_eq!(
        etcd.count(&receipts("audit-2")).await,
        1,
        "another lock's receipt kept"
    );
}
