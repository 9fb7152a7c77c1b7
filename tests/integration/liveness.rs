//! Liveness: holds end when their sidecar dies, misses a heartbeat, or the lock is deleted;
//! waiters leave no trace; an etcd outage is an error, never a hang.

use etcd_client::{EventType, WatchOptions};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::events::Events;
use crate::common::{EtcdServer, Sidecar, declare, wait_until};

/// Starts a waiting acquire; resolves to (status, body, instant of the answer).
fn acquire_later(s: &Arc<Sidecar>, lock: &str) -> tokio::task::JoinHandle<(u16, Value, Instant)> {
    let (s, lock) = (s.clone(), lock.to_string());
    tokio::spawn(async move {
        let (status, body) = s.post(&lock, "acquire", json!({"waitSeconds": 30})).await;
        (status, body, Instant::now())
    })
}

async fn waiters(s: &Sidecar, lock: &str, n: u64) {
    wait_until(Duration::from_secs(5), || async {
        s.get(&format!("/v1/locks/{lock}")).await.1["waiters"] == n
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn sigterm_of_the_holders_sidecar_hands_over_at_once() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["t"]);
    let mut a = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let b = Arc::new(Sidecar::start(&etcd.endpoint, "pod-b", &[]).await);
    a.must_acquire("t", json!({})).await;
    let waiting = acquire_later(&b, "t");
    waiters(&b, "t", 1).await;
    let stopped = Instant::now();
    assert!(a.terminate().success());
    let (status, body, granted) = waiting.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let handoff = granted - stopped;
    eprintln!("SIGTERM handoff: {handoff:?}");
    assert!(handoff < Duration::from_secs(1), "handoff took {handoff:?}");
}

#[tokio::test]
async fn kill_9_of_the_holders_sidecar_hands_over_within_the_ttl() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["k", "--ttl-seconds", "2"]);
    let mut a = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let b = Arc::new(Sidecar::start(&etcd.endpoint, "pod-b", &[]).await);
    let first = a.must_acquire("k", json!({})).await;
    let waiting = acquire_later(&b, "k");
    waiters(&b, "k", 1).await;
    let killed = Instant::now();
    a.kill9();
    let (status, body, granted) = waiting.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body["fencingToken"].as_i64().unwrap() > first);
    let handoff = granted - killed;
    eprintln!("kill -9 handoff with a 2 s TTL: {handoff:?}");
    // etcd checks expiry every 500 ms and may add up to ~1.5 s beyond the TTL.
    assert!(
        handoff < Duration::from_millis(2000 + 1500),
        "handoff took {handoff:?}"
    );
}

#[tokio::test]
async fn a_missed_heartbeat_ends_the_hold_and_then_heartbeat_is_410() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["hb", "--heartbeat-timeout-seconds", "1"]);
    let a = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let b = Arc::new(Sidecar::start(&etcd.endpoint, "pod-b", &[]).await);
    let mut events = Events::open(&a, "hb").await;
    let token = a.must_acquire("hb", json!({})).await;
    assert_eq!(events.next(Duration::from_secs(1)).await["type"], "acquired");
    // Heartbeats within the window keep it.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (status, body) = a.post("hb", "heartbeat", json!({})).await;
        assert_eq!(status, 200, "{body}");
        assert!(body["expiresAt"].is_string());
    }
    let waiting = acquire_later(&b, "hb");
    waiters(&b, "hb", 1).await;
    // Then silence: the hold ends about 1 s after the last heartbeat, by revocation, not TTL.
    let silent = Instant::now();
    let lost = events.next(Duration::from_secs(3)).await;
    let lost_after = silent.elapsed();
    assert_eq!(
        (lost["type"].as_str(), lost["fencingToken"].as_i64()),
        (Some("lost"), Some(token)),
        "{lost}"
    );
    assert!(lost["reason"].as_str().unwrap().contains("heartbeat"), "{lost}");
    assert!(
        lost_after < Duration::from_millis(2000),
        "lost after {lost_after:?}"
    );
    let (status, body, granted) = waiting.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(granted - silent < Duration::from_millis(2500));
    let (status, body) = a.post("hb", "heartbeat", json!({})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (410, Some("lock_lost")),
        "{body}"
    );
    assert_eq!(a.metric("podlock_locks_lost_total").await, 1.0);
    let lost = "podlock_locks_lost_total{lock=\"hb\",reason=\"heartbeat\"}";
    assert_eq!(a.metric(lost).await, 1.0);
}

#[tokio::test]
async fn deleting_the_lock_reports_lost_within_a_second() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["gone"]);
    let a = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let mut events = Events::open(&a, "gone").await;
    a.must_acquire("gone", json!({})).await;
    assert_eq!(events.next(Duration::from_secs(1)).await["type"], "acquired");
    let deleted = Instant::now();
    declare(&etcd.endpoint, &["gone", "--delete"]);
    let lost = events.next(Duration::from_secs(2)).await;
    let after = deleted.elapsed();
    eprintln!("lost event {after:?} after the lock's deletion");
    assert_eq!(lost["type"], "lost", "{lost}");
    assert!(after < Duration::from_secs(1), "lost after {after:?}");
    assert_eq!(etcd.count("/podlock/v1/").await, 0, "no key of the lock remains");
}

#[tokio::test]
async fn a_waiter_that_disconnects_or_times_out_leaves_no_trace() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["dc"]);
    let a = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let b = Sidecar::start(&etcd.endpoint, "pod-b", &[]).await;
    a.must_acquire("dc", json!({})).await;
    // A client that queues, then goes away.
    let url = format!("{}/v1/locks/dc/acquire", b.addr);
    let waiting = tokio::spawn(async move {
        let body = json!({"waitSeconds": 30});
        reqwest::Client::new().post(&url).json(&body).send().await
    });
    wait_until(Duration::from_secs(5), || async {
        etcd.count("/podlock/v1/queue/").await == 2
    })
    .await
    .expect("the waiter queued");
    assert_eq!(b.get("/v1/locks").await.1["locks"][0]["state"], "waiting");
    waiting.abort();
    let gone = wait_until(Duration::from_secs(2), || async {
        etcd.count("/podlock/v1/queue/").await == 1
    })
    .await;
    eprintln!("disconnected waiter removed after {gone:?}");
    gone.expect("the disconnected waiter's key is removed at once");
    assert_eq!(b.get("/v1/locks").await.1["locks"], json!([]));
    // A wait that times out likewise.
    let (status, body) = b.post("dc", "acquire", json!({"waitSeconds": 0.3})).await;
    assert_eq!((status, body["error"].as_str()), (409, Some("lock_held")));
    assert_eq!(etcd.count("/podlock/v1/queue/").await, 1);
}

/// An acquire whose client goes away while etcd has not yet answered its enqueue: etcd applies
/// the enqueue afterwards, and the key it placed for nobody is removed at once (not left to the
/// orphan sweep, which takes two sweeps 5 s apart).
#[tokio::test]
async fn a_client_gone_while_its_enqueue_is_in_flight_leaves_no_key() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["inflight"]);
    let s = Arc::new(Sidecar::start(&etcd.endpoint, "pod-a", &[]).await);
    // Its session and the lock's settings are in place: the next acquire's first request to
    // etcd is its enqueue.
    s.must_acquire("inflight", json!({})).await;
    assert_eq!(s.post("inflight", "release", json!({})).await.0, 200);
    let prefix = WatchOptions::new().with_prefix();
    let mut client = etcd.client().await;
    let queue = "/podlock/v1/queue/default/inflight/"; // not the release receipt beside it
    let mut changes = client.watch(queue, Some(prefix)).await.unwrap();
    changes.message().await.unwrap(); // created
    etcd.signal(libc::SIGSTOP);
    let url = format!("{}/v1/locks/inflight/acquire", s.addr);
    let asking = tokio::spawn(async move {
        let body = json!({"waitSeconds": 30});
        reqwest::Client::new().post(&url).json(&body).send().await
    });
    let state = || async { s.get("/v1/locks").await.1["locks"].clone() };
    let waiting = wait_until(Duration::from_secs(2), || async {
        state().await[0]["state"] == "waiting"
    });
    waiting.await.expect("the acquire is under way");
    tokio::time::sleep(Duration::from_millis(100)).await; // its enqueue is sent to the stopped etcd
    asking.abort();
    let ended = wait_until(Duration::from_secs(2), || async { state().await == json!([]) }).await;
    etcd.signal(libc::SIGCONT);
    ended.expect("the acquire ends with its client, before etcd answers");
    let mut put = None;
    let deleted = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(batch) = changes.message().await.unwrap() {
            for e in batch.events() {
                let key = e.kv().unwrap().key_str().unwrap().to_string();
                match e.event_type() {
                    EventType::Put => put = Some(key),
                    EventType::Delete if put.as_ref() == Some(&key) => return,
                    EventType::Delete => {}
                }
            }
        }
    })
    .await;
    let put = put.expect("etcd applied the enqueue sent before the client went away");
    deleted.unwrap_or_else(|_| panic!("{put} was not removed within 2 s"));
    assert_eq!(etcd.count(queue).await, 0);
}

#[tokio::test]
async fn an_etcd_outage_is_503_not_a_hang_and_service_resumes() {
    let mut etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["out"]);
    let a = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    a.must_acquire("out", json!({"holderId": "before"})).await;
    etcd.stop();
    let asked = Instant::now();
    let (status, body) = a
        .post("out", "acquire", json!({"holderId": "during", "waitSeconds": 2}))
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("backend_unavailable")),
        "{body}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "took {:?}",
        asked.elapsed()
    );
    assert_eq!(a.get("/readyz").await.0, 503);
    assert_eq!(a.get("/healthz").await.0, 200);
    etcd.resume().await;
    wait_until(Duration::from_secs(15), || async {
        a.get("/readyz").await.0 == 200
    })
    .await
    .expect("ready again");
    let (status, body) = a
        .post("out", "acquire", json!({"holderId": "after", "waitSeconds": 0}))
        .await;
    // The earlier hold survives a short outage (its lease outlives it), so this one is refused.
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("lock_held")),
        "{body}"
    );
    assert_eq!(
        a.post("out", "release", json!({"holderId": "before"})).await.0,
        200
    );
    a.must_acquire("out", json!({"holderId": "after", "waitSeconds": 5}))
        .await;
}

#[tokio::test]
async fn without_etcd_a_hold_is_lost_when_its_lease_may_have_expired_not_later() {
    let mut etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["cut", "--ttl-seconds", "2"]);
    let a = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let mut events = Events::open(&a, "cut").await;
    a.must_acquire("cut", json!({})).await;
    assert_eq!(events.next(Duration::from_secs(1)).await["type"], "acquired");
    etcd.stop();
    let stopped = Instant::now();
    let lost = events.next(Duration::from_secs(4)).await;
    let after = stopped.elapsed();
    eprintln!("lost {after:?} after etcd stopped (TTL 2 s)");
    assert_eq!(lost["type"], "lost", "{lost}");
    assert!(lost["reason"].as_str().unwrap().contains("lease"), "{lost}");
    // The last keepalive was at most TTL/3 before the stop: lost between 2/3 TTL and TTL after it.
    assert!(
        after <= Duration::from_millis(2200),
        "reported held too long: {after:?}"
    );
    assert!(
        after >= Duration::from_millis(1200),
        "gave up too early: {after:?}"
    );
    assert_eq!(a.post("cut", "heartbeat", json!({})).await.0, 410);
    assert_eq!(a.get("/v1/locks").await.1["locks"], json!([]));
}
