//! Weighted permits (`"permits": N`): a hold of a semaphore that takes N of its slots, on the
//! same FIFO queue as every other hold.

use kube::api::Api;
use podlock::crd::DistributedLock;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

use crate::common::kube::with_crd;
use crate::common::{EtcdServer, Sidecar, declare};
use crate::operator::{declare_until_free, operator_for, status_until};

/// A sidecar on a fresh etcd with `lock` declared as a semaphore of `max` slots.
async fn pool(lock: &str, max: &str) -> (EtcdServer, Arc<Sidecar>) {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &[lock, "--max-holders", max]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    (etcd, Arc::new(s))
}

fn asks(holder: &str, permits: u32, wait: f64) -> Value {
    json!({"holderId": holder, "permits": permits, "waitSeconds": wait})
}

/// Acquires in the background; the task returns the status and the answer.
fn later(s: &Arc<Sidecar>, lock: &str, body: Value) -> tokio::task::JoinHandle<(u16, Value)> {
    let (s, lock) = (s.clone(), lock.to_string());
    tokio::spawn(async move { s.post(&lock, "acquire", body).await })
}

async fn release(s: &Sidecar, lock: &str, holder: &str) {
    let (status, body) = s.post(lock, "release", json!({"holderId": holder})).await;
    assert_eq!(status, 200, "release {holder}: {body}");
}

/// Each holder of `info` (a `GET` or a fence check) as (holderId, permits).
fn holders(info: &Value) -> Vec<(String, u64)> {
    let list = info["holders"]
        .as_array()
        .unwrap_or_else(|| panic!("no holders: {info}"));
    (list.iter())
        .map(|h| {
            (
                h["holderId"].as_str().unwrap().to_string(),
                h["permits"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn held(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
    pairs.iter().map(|&(h, p)| (h.to_string(), p)).collect()
}

/// A semaphore of 3: a hold of 2 and one of 1 fill it. A request of 2 queued behind them is
/// not passed by a later request of 1, even once a slot is free that the 1 would fit in.
#[tokio::test]
async fn a_hold_takes_its_permits_and_a_larger_request_is_not_passed() {
    let (_etcd, s) = pool("pool", "3").await;
    let (status, grant) = s.post("pool", "acquire", asks("a", 2, 0.0)).await;
    assert_eq!((status, grant["permits"].as_u64()), (200, Some(2)), "{grant}");
    let b = s.must_acquire("pool", asks("b", 1, 0.0)).await;
    // The same holder id again, for other permits: never answered with the hold it has.
    let (status, body) = s.post("pool", "acquire", asks("a", 1, 0.0)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("holder_in_use")),
        "{body}"
    );
    assert!(
        body["message"].as_str().unwrap().contains("holds 2 permits"),
        "{body}"
    );
    let (_, info) = s.get("/v1/locks/pool").await;
    assert_eq!(holders(&info), held(&[("a", 2), ("b", 1)]), "{info}");
    let (status, body) = s.post("pool", "acquire", asks("x", 1, 0.0)).await;
    assert_eq!(status, 409, "a fourth permit was granted: {body}");

    let large = later(&s, "pool", asks("c", 2, 10.0));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!large.is_finished(), "c was granted 2 permits beside 3 held");
    let small = later(&s, "pool", asks("d", 1, 10.0));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // One slot free: d would fit, but c is ahead of it and does not.
    release(&s, "pool", "b").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!small.is_finished(), "d passed c, which waits for 2 permits");
    assert!(!large.is_finished(), "c was granted 2 permits beside a's 2");
    let (_, info) = s.get("/v1/locks/pool").await;
    assert_eq!(
        (holders(&info), info["waiters"].as_u64()),
        (held(&[("a", 2)]), Some(2)),
        "{info}"
    );

    release(&s, "pool", "a").await;
    let (status, c) = large.await.unwrap();
    assert_eq!((status, c["permits"].as_u64()), (200, Some(2)), "{c}");
    let (status, d) = small.await.unwrap();
    assert_eq!(status, 200, "{d}");
    let (c, d) = (
        c["fencingToken"].as_i64().unwrap(),
        d["fencingToken"].as_i64().unwrap(),
    );
    assert!(b < c && c < d, "grants out of queue order: b {b}, c {c}, d {d}");
    let (status, fence) = s.get(&format!("/v1/locks/pool/fence?token={c}")).await;
    assert_eq!((status, fence["current"].as_bool()), (200, Some(true)), "{fence}");
    assert_eq!(holders(&fence), held(&[("c", 2), ("d", 1)]), "{fence}");
}

/// Permits that cannot apply are refused with a 400 that names the field and what to do: never
/// a silent change.
#[tokio::test]
async fn permits_that_cannot_apply_are_refused_naming_the_field() {
    let (etcd, s) = pool("pool", "3").await;
    declare(&etcd.endpoint, &["rw"]);
    declare(&etcd.endpoint, &["other", "--max-holders", "3"]);
    let refused = |(status, body): (u16, Value), says: &str| {
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid_request")),
            "{body}"
        );
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(says), "{message} does not say {says:?}");
        body
    };
    let above = refused(s.post("pool", "acquire", asks("a", 4, 0.0)).await, "permits 4");
    assert!(
        above["message"].as_str().unwrap().contains("at most 3 permits"),
        "{above}"
    );
    assert_eq!(above["maxHolders"], 3, "{above}");
    refused(
        s.post("pool", "acquire", asks("a", 0, 0.0)).await,
        "permits 0 must be at least 1",
    );
    let shared = json!({"permits": 2, "mode": "shared"});
    refused(
        s.post("rw", "acquire", shared).await,
        "permits 2 applies to exclusive holds",
    );
    let set = json!({"permits": 2, "with": ["other"]});
    refused(s.post("pool", "acquire", set).await, "multi-lock acquire");
    refused(
        s.post("pool", "acquire", json!({"permits": "two"})).await,
        "permits",
    );
    // The hold's own connection (`/hold`) is refused the same way, before any stream starts.
    let (status, body) = s.post("pool", "hold", asks("h", 4, 0.0)).await;
    refused((status, body), "permits 4");
    let (_, info) = s.get("/v1/locks/pool").await;
    assert_eq!(
        (holders(&info).len(), info["waiters"].as_u64()),
        (0, Some(0)),
        "{info}"
    );
}

/// Lowering `maxHolders` below a held weight ends no hold (as for counts), and nothing new is
/// let in until the weight fits; a waiter whose permits no longer fit at all is refused at
/// once, and leaves the queue, rather than holding up everyone behind it.
#[tokio::test]
async fn lowering_max_holders_keeps_holds_and_refuses_a_request_that_cannot_fit() {
    let (etcd, s) = pool("pool", "3").await;
    s.must_acquire("pool", asks("a", 2, 0.0)).await;
    let whole = later(&s, "pool", asks("w", 3, 10.0));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let small = later(&s, "pool", asks("s", 1, 10.0));
    tokio::time::sleep(Duration::from_millis(300)).await;
    declare(&etcd.endpoint, &["pool", "--max-holders", "1"]);
    let (status, body) = tokio::time::timeout(Duration::from_secs(3), whole)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((status, body["maxHolders"].as_u64()), (400, Some(1)), "{body}");
    assert!(body["message"].as_str().unwrap().contains("permits 3"), "{body}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, info) = s.get("/v1/locks/pool").await;
    assert_eq!(
        (holders(&info), info["waiters"].as_u64()),
        (held(&[("a", 2)]), Some(1)),
        "{info}"
    );
    assert!(
        !small.is_finished(),
        "s was let in beside a hold of 2 under maxHolders 1"
    );
    release(&s, "pool", "a").await;
    let (status, grant) = small.await.unwrap();
    assert_eq!((status, grant["permits"].as_u64()), (200, Some(1)), "{grant}");
}

/// The operator's status states each holder's permits.
#[tokio::test]
async fn status_shows_each_holders_permits() {
    let plane = with_crd();
    let ns = plane.namespace("permits");
    let _op = operator_for(plane, &ns).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    declare_until_free(plane, &api, &ns, "pool", "{maxHolders: 3}").await;
    let s = Sidecar::start(&plane.etcd.endpoint, "pod-a", &["--namespace", &ns]).await;
    s.must_acquire("pool", asks("a", 2, 0.0)).await;
    s.must_acquire("pool", asks("b", 1, 0.0)).await;
    status_until(&api, "pool", "a 2 and b 1", |st| {
        let each: Vec<(&str, u32)> = (st.holders.iter())
            .map(|h| (h.holder_id.as_str(), h.permits))
            .collect();
        each == [("a", 2), ("b", 1)]
    })
    .await;
}
