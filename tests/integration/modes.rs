//! Shared and exclusive holds on one FIFO queue: a lock with `maxHolders` 1 is a reader-writer
//! lock when acquires say `"mode": "shared"`.

use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{EtcdServer, Sidecar, declare};

async fn one_sidecar(lock: &str) -> (EtcdServer, Arc<Sidecar>) {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &[lock]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    (etcd, Arc::new(s))
}

fn shared(holder: &str, wait: f64) -> serde_json::Value {
    json!({"holderId": holder, "mode": "shared", "waitSeconds": wait})
}

/// Acquires in the background; the task returns the token and when it was granted.
fn later(s: &Arc<Sidecar>, lock: &str, body: serde_json::Value) -> tokio::task::JoinHandle<(i64, Instant)> {
    let (s, lock) = (s.clone(), lock.to_string());
    tokio::spawn(async move { (s.must_acquire(&lock, body).await, Instant::now()) })
}

async fn release(s: &Sidecar, lock: &str, holder: &str) {
    let (status, body) = s.post(lock, "release", json!({"holderId": holder})).await;
    assert_eq!(status, 200, "release {holder}: {body}");
}

#[tokio::test]
async fn shared_holders_share_and_an_exclusive_one_stands_alone() {
    let (_etcd, s) = one_sidecar("rw").await;
    let mut tokens = vec![];
    for r in ["r1", "r2", "r3"] {
        tokens.push(s.must_acquire("rw", shared(r, 0.0)).await); // try-once: no waiting
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let (_, info) = s.get("/v1/locks/rw").await;
    let holders = info["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 3, "{info}");
    assert!(holders.iter().all(|h| h["mode"] == "shared"), "{info}");

    // A writer queues; a reader that comes after it must not overtake it.
    let writer = later(&s, "rw", json!({"holderId": "w", "waitSeconds": 10}));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = s.post("rw", "acquire", shared("r4", 0.0)).await;
    assert_eq!(status, 409, "a reader overtook a waiting writer: {body}");
    let reader = later(&s, "rw", shared("r4", 10.0));
    for r in ["r1", "r2", "r3"] {
        release(&s, "rw", r).await;
    }
    let (w_token, w_at) = writer.await.unwrap();
    assert!(w_token > tokens[2]);
    let (_, info) = s.get("/v1/locks/rw").await;
    assert_eq!(
        info["holders"].as_array().unwrap().len(),
        1,
        "the writer stands alone: {info}"
    );
    assert_eq!(info["holders"][0]["mode"], "exclusive");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!reader.is_finished(), "a reader was granted beside the writer");
    release(&s, "rw", "w").await;
    let (r_token, r_at) = reader.await.unwrap();
    assert!(r_token > w_token && r_at > w_at);
}

#[tokio::test]
async fn a_stream_of_readers_does_not_starve_a_writer() {
    let (_etcd, s) = one_sidecar("busy").await;
    // Two readers take turns so that one always holds: without FIFO a writer would never get in.
    let stop = Instant::now() + Duration::from_secs(3);
    let readers: Vec<_> = (0..2)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i * 40)).await;
                let mut grants = vec![];
                while Instant::now() < stop {
                    let holder = format!("reader-{i}");
                    let token = s.must_acquire("busy", shared(&holder, 10.0)).await;
                    grants.push((token, Instant::now()));
                    tokio::time::sleep(Duration::from_millis(80)).await;
                    release(&s, "busy", &holder).await;
                }
                grants
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = Instant::now();
    let w_token = s
        .must_acquire("busy", json!({"holderId": "w", "waitSeconds": 5}))
        .await;
    let waited = asked.elapsed();
    let w_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(100)).await;
    release(&s, "busy", "w").await;
    eprintln!("a writer among a stream of readers was granted after {waited:?}");
    assert!(waited < Duration::from_secs(1), "the writer waited {waited:?}");
    for r in readers {
        for (token, at) in r.await.unwrap() {
            // Tokens follow grants: readers granted before the writer have smaller ones, those
            // after it larger ones.
            assert_eq!(
                token > w_token,
                at > w_at,
                "reader token {token}, writer {w_token}"
            );
        }
    }
}

#[tokio::test]
async fn a_mode_that_cannot_apply_is_refused_naming_the_field() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["pool", "--max-holders", "3"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let (status, body) = s.post("pool", "acquire", shared("r", 0.0)).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("maxHolders 1"),
        "{body}"
    );
    let (status, body) = s.post("pool", "acquire", json!({"mode": "read"})).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["message"].as_str().unwrap().contains("mode"), "{body}");
}

/// Finding 2 of the safety review: `r1` holding shared and acquiring again as exclusive was
/// answered 200 with its shared grant, so it wrote while `r2` read. Every grant now states its
/// mode, and a re-acquire in the other mode is refused.
#[tokio::test]
async fn a_reacquire_in_the_other_mode_is_refused() {
    let (_etcd, s) = one_sidecar("rw").await;
    let r1 = s.must_acquire("rw", shared("r1", 0.0)).await;
    s.must_acquire("rw", shared("r2", 0.0)).await;
    let (status, body) = s
        .post("rw", "acquire", json!({"holderId": "r1", "mode": "exclusive"}))
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("mode_conflict")),
        "r1 was told it may write while r2 reads: {body}"
    );
    let (status, grant) = s.post("rw", "acquire", shared("r1", 0.0)).await;
    assert_eq!(
        (status, grant["fencingToken"].as_i64()),
        (200, Some(r1)),
        "{grant}"
    );
    assert_eq!(grant["mode"], "shared", "{grant}");
    let (_, grant) = s
        .post("rw", "acquire", json!({"holderId": "solo", "waitSeconds": 0}))
        .await;
    assert_eq!(grant["error"], "lock_held", "{grant}");
}

/// Finding 4 of the safety review: raising `maxHolders` to 2 while a reader held and a writer
/// waited granted the writer beside the reader. Shared and exclusive holds never mix, whatever
/// `maxHolders` becomes.
#[tokio::test]
async fn raising_max_holders_never_puts_a_writer_beside_a_reader() {
    let (etcd, s) = one_sidecar("grow").await;
    let r1 = s.must_acquire("grow", shared("r1", 0.0)).await;
    let writer = later(&s, "grow", json!({"holderId": "w", "waitSeconds": 10}));
    tokio::time::sleep(Duration::from_millis(300)).await;
    declare(&etcd.endpoint, &["grow", "--max-holders", "2"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!writer.is_finished(), "the writer was granted beside the reader");
    release(&s, "grow", "r1").await;
    let (w, _) = writer.await.unwrap();
    assert!(w > r1);
    let (_, info) = s.get("/v1/locks/grow").await;
    assert_eq!(info["holders"].as_array().unwrap().len(), 1, "{info}");
}

/// Finding 3 of the safety review, a live holder's part: a grant whose one attempt to record
/// itself failed (etcd down at that moment) stayed unrecorded for the whole hold, and so held
/// back every later key of a semaphore's or readers' window. The record is retried until it
/// lands.
#[tokio::test]
async fn a_grant_whose_record_failed_is_recorded_once_etcd_is_back() {
    let mut etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["m", "--ttl-seconds", "60"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    // A mutex hold records its grant 30 ms after answering: etcd is gone by then.
    s.must_acquire("m", json!({"holderId": "h"})).await;
    etcd.stop();
    tokio::time::sleep(Duration::from_secs(8)).await; // past a request's 5 s budget
    etcd.resume().await;
    let recorded = crate::common::wait_until(Duration::from_secs(10), || async {
        let opts = etcd_client::GetOptions::new().with_prefix();
        let resp = etcd
            .client()
            .await
            .get("/podlock/v1/queue/default/m/", Some(opts))
            .await
            .unwrap();
        let entry: serde_json::Value = serde_json::from_slice(resp.kvs()[0].value()).unwrap();
        entry["acquiredAt"].is_string()
    })
    .await;
    assert!(recorded.is_ok(), "the grant was never recorded:\n{}", s.log());
}
