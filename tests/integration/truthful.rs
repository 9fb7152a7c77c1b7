//! Every hold ends truthfully: a release, heartbeat or re-acquire that finds the hold already
//! ended is told `lock_lost` (410) and a `lost` event is sent; a revoked lease is noticed at
//! once; a shutdown reports its holds lost.

use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::events::Events;
use crate::common::{EtcdServer, Sidecar, declare, wait_until};

/// Acquires `lock` on `s` with an open events stream, and reads the `acquired` event.
async fn hold_with_events(s: &Sidecar, lock: &str, body: Value) -> (i64, Events) {
    let mut events = Events::open(s, lock).await;
    let token = s.must_acquire(lock, body).await;
    assert_eq!(events.next(Duration::from_secs(1)).await["type"], "acquired");
    (token, events)
}

/// The next event must be `lost` for `token`.
async fn expect_lost(events: &mut Events, token: i64) {
    let ev = events.next(Duration::from_secs(1)).await;
    assert_eq!(
        (ev["type"].as_str(), ev["fencingToken"].as_i64()),
        (Some("lost"), Some(token)),
        "{ev}"
    );
}

/// A sidecar holding `lock` whose key was deleted behind its back, within the first 100 ms of
/// the hold (before its key is watched).
struct KeyGone {
    _etcd: EtcdServer,
    sidecar: Sidecar,
    token: i64,
    events: Events,
}

impl KeyGone {
    async fn new(lock: &str, options: Value) -> Self {
        let etcd = EtcdServer::start().await;
        declare(&etcd.endpoint, &[lock]);
        let sidecar = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
        let (token, events) = hold_with_events(&sidecar, lock, options).await;
        etcd.delete_queue(lock).await;
        KeyGone {
            _etcd: etcd,
            sidecar,
            token,
            events,
        }
    }

    /// `verb` on `lock` must answer 410 `lock_lost` and send a `lost` event.
    async fn expect_lost_on(&mut self, lock: &str, verb: &str) {
        let (status, body) = self.sidecar.post(lock, verb, json!({})).await;
        let answer = (status, body["error"].as_str());
        assert_eq!(answer, (410, Some("lock_lost")), "{verb}: {body}");
        expect_lost(&mut self.events, self.token).await;
    }
}

#[tokio::test]
async fn a_release_that_finds_the_key_gone_is_lost_not_released() {
    let mut gone = KeyGone::new("r", json!({})).await;
    gone.expect_lost_on("r", "release").await;
    let (status, body) = gone.sidecar.post("r", "release", json!({})).await;
    assert_eq!(status, 410, "a second release of a lost hold: {body}");
}

#[tokio::test]
async fn a_heartbeat_that_finds_the_key_gone_is_lost() {
    let mut gone = KeyGone::new("hb", json!({"heartbeatTimeoutSeconds": 30})).await;
    gone.expect_lost_on("hb", "heartbeat").await;
}

#[tokio::test]
async fn a_reacquire_that_finds_the_key_gone_is_lost_then_a_new_acquire_works() {
    let mut gone = KeyGone::new("ra", json!({})).await;
    gone.expect_lost_on("ra", "acquire").await;
    let again = gone.sidecar.must_acquire("ra", json!({})).await;
    let token = gone.token;
    assert!(
        again > token,
        "a new hold gets a new, higher token: {again} after {token}"
    );
}

#[tokio::test]
async fn a_holder_paused_past_its_ttl_is_told_lost_when_it_releases() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["p", "--ttl-seconds", "2"]);
    let a = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let b = Arc::new(Sidecar::start(&etcd.endpoint, "pod-b", &[]).await);
    let (token, mut events) = hold_with_events(&a, "p", json!({})).await;
    let next = {
        let b = b.clone();
        tokio::spawn(async move { b.must_acquire("p", json!({"waitSeconds": 20})).await })
    };
    a.signal(libc::SIGSTOP);
    let next = tokio::time::timeout(Duration::from_secs(10), next).await;
    a.signal(libc::SIGCONT);
    assert!(next.expect("b was granted after a's lease expired").unwrap() > token);
    let (status, body) = a.post("p", "release", json!({})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (410, Some("lock_lost")),
        "{body}"
    );
    expect_lost(&mut events, token).await;
}

#[tokio::test]
async fn a_sidecar_shutdown_reports_its_holds_lost() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["sd"]);
    let mut s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let (token, mut events) = hold_with_events(&s, "sd", json!({})).await;
    s.signal(libc::SIGTERM);
    let ev = events.next(Duration::from_secs(2)).await;
    assert_eq!(
        (ev["type"].as_str(), ev["fencingToken"].as_i64()),
        (Some("lost"), Some(token)),
        "{ev}"
    );
    assert!(ev["reason"].as_str().unwrap().contains("stopped"), "{ev}");
    assert!(s.terminate().success());
}

#[tokio::test]
async fn a_revoked_lease_ends_waits_at_once_and_the_next_acquire_gets_a_new_one() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["rv", "--ttl-seconds", "60"]);
    let other = Sidecar::start(&etcd.endpoint, "pod-o", &[]).await;
    other.must_acquire("rv", json!({})).await;
    let s = Arc::new(Sidecar::start(&etcd.endpoint, "pod-a", &[]).await);
    let (status, grant) = s
        .post("rv", "acquire", json!({"holderId": "h", "waitSeconds": 0}))
        .await;
    assert_eq!(status, 409, "{grant}");
    let waiting = {
        let s = s.clone();
        tokio::spawn(async move {
            let answer = s
                .post("rv", "acquire", json!({"holderId": "w", "waitSeconds": 30}))
                .await;
            (answer, Instant::now())
        })
    };
    wait_until(Duration::from_secs(5), || async {
        s.get("/v1/locks/rv").await.1["waiters"] == 1
    })
    .await
    .unwrap();
    let lease = lease_of(&etcd, "rv", "w").await;
    let revoked = Instant::now();
    etcd.client().await.lease_revoke(lease).await.unwrap();
    let ((status, body), answered) = waiting.await.unwrap();
    assert_eq!(status, 503, "{body}");
    let after = answered - revoked;
    eprintln!("waiter answered {after:?} after its lease was revoked");
    assert!(
        after < Duration::from_secs(2),
        "the waiter kept waiting {after:?}"
    );
    // The next acquire with the same TTL must not reuse the revoked lease.
    let (status, body) = s
        .post("rv", "acquire", json!({"holderId": "x", "waitSeconds": 0}))
        .await;
    assert_eq!(
        status, 409,
        "a new session, and the lock still held by pod-o: {body}"
    );
}

/// The lease behind `holder`'s queue key of `lock`.
async fn lease_of(etcd: &EtcdServer, lock: &str, holder: &str) -> i64 {
    let opts = etcd_client::GetOptions::new().with_prefix();
    let prefix = format!("/podlock/v1/queue/default/{lock}/");
    let resp = etcd.client().await.get(prefix, Some(opts)).await.unwrap();
    let kv = resp
        .kvs()
        .iter()
        .find(|kv| kv.key_str().unwrap().ends_with(&format!("/{holder}")))
        .expect("the holder's key");
    kv.lease()
}

/// Puts a queue key for `holder` of `lock` under `lease`, as a copy of an enqueue that etcd
/// applied after its acquire had ended would.
async fn put_late_copy(etcd: &EtcdServer, lock: &str, lease: i64, holder: &str) {
    let key = format!("/podlock/v1/queue/default/{lock}/{lease:016x}/{holder}");
    let entry = json!({"holderId": holder, "pod": {"namespace": "default", "name": "pod-a"},
        "requestedAt": "2026-01-01T00:00:00.000Z", "ttlSeconds": 15, "heartbeatTimeoutSeconds": 0});
    let put = etcd_client::PutOptions::new().with_lease(lease);
    etcd.client()
        .await
        .put(key, entry.to_string(), Some(put))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_late_enqueue_copy_neither_blocks_its_holder_nor_the_lock() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["late"]);
    declare(&etcd.endpoint, &["orphan"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let (status, grant) = s.post("late", "acquire", json!({"holderId": "h"})).await;
    assert_eq!(status, 200, "{grant}");
    let lease = grant["leaseId"].as_i64().unwrap();
    let (status, _) = s.post("late", "release", json!({"holderId": "h"})).await;
    assert_eq!(status, 200);

    // The same holder acquiring again takes its place, not a 503 for as long as the lease lives.
    put_late_copy(&etcd, "late", lease, "h").await;
    let (status, body) = s
        .post("late", "acquire", json!({"holderId": "h", "waitSeconds": 5}))
        .await;
    assert_eq!(status, 200, "{body}");

    // A copy whose holder never comes back is swept, and the lock moves on.
    put_late_copy(&etcd, "orphan", lease, "ghost").await;
    let b = Sidecar::start(&etcd.endpoint, "pod-b", &[]).await;
    let started = Instant::now();
    let (status, body) = b.post("orphan", "acquire", json!({"waitSeconds": 30})).await;
    assert_eq!(status, 200, "the orphan still blocks the lock: {body}");
    eprintln!("orphaned key removed, lock granted after {:?}", started.elapsed());
}
