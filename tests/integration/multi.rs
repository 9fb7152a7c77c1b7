//! Multi-lock acquires (`"with": [...]`): several locks taken as one, FIFO on each, one token,
//! no deadlock whatever the order of the sets, and no key left behind.

use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{EtcdServer, Sidecar, declare};

async fn sidecar(locks: &[(&str, &str)]) -> (EtcdServer, Arc<Sidecar>) {
    let etcd = EtcdServer::start().await;
    for (lock, max) in locks {
        declare(&etcd.endpoint, &[lock, "--max-holders", max]);
    }
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    (etcd, Arc::new(s))
}

/// The holders' ids of `lock` and how many wait.
async fn queue(s: &Sidecar, lock: &str) -> (Vec<String>, u64) {
    let (_, info) = s.get(&format!("/v1/locks/{lock}")).await;
    let holders = (info["holders"].as_array().unwrap().iter())
        .map(|h| h["holderId"].as_str().unwrap().to_string())
        .collect();
    (holders, info["waiters"].as_u64().unwrap())
}

async fn release(s: &Sidecar, lock: &str, holder: &str) -> (u16, Value) {
    s.post(lock, "release", json!({"holderId": holder})).await
}

#[tokio::test]
async fn a_set_holds_once_every_lock_is_free_in_fifo_order_with_one_token() {
    let (_etcd, s) = sidecar(&[("x", "1"), ("y", "1")]).await;
    s.must_acquire("x", json!({"holderId": "a"})).await;
    let set = {
        let s = s.clone();
        tokio::spawn(async move {
            s.post(
                "x",
                "acquire",
                json!({"holderId": "b", "with": ["y"], "waitSeconds": 10}),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!set.is_finished(), "the set was granted while x was held");
    assert_eq!(
        queue(&s, "y").await,
        (vec![], 1),
        "b waits on y too: it holds nothing yet"
    );
    let (status, body) = s
        .post("y", "acquire", json!({"holderId": "c", "waitSeconds": 0}))
        .await;
    assert_eq!(status, 409, "c overtook the set's key on y: {body}");

    assert_eq!(release(&s, "x", "a").await.0, 200);
    let (status, grant) = set.await.unwrap();
    assert_eq!(status, 200, "{grant}");
    let token = grant["fencingToken"].as_i64().unwrap();
    let locks = grant["locks"].as_array().unwrap();
    let named: Vec<(&str, i64)> = locks
        .iter()
        .map(|l| (l["lock"].as_str().unwrap(), l["fencingToken"].as_i64().unwrap()))
        .collect();
    assert_eq!(named, [("x", token), ("y", token)], "{grant}");
    for lock in ["x", "y"] {
        let (_, info) = s.get(&format!("/v1/locks/{lock}")).await;
        assert_eq!(info["holders"][0]["holderId"], "b", "{info}");
        assert_eq!(info["fencingToken"], token, "{info}");
    }
    assert_eq!(
        s.post("y", "acquire", json!({"holderId": "c", "waitSeconds": 0}))
            .await
            .0,
        409
    );

    // A release of either lock of the set releases both, at once.
    let (status, body) = release(&s, "y", "b").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(queue(&s, "x").await, (vec![], 0));
    assert_eq!(queue(&s, "y").await, (vec![], 0));
    let (status, body) = release(&s, "x", "b").await;
    assert_eq!(status, 409, "the set was released as one: {body}");
}

/// Sets taken in opposite orders, and single acquires of their locks, all contending: every
/// acquire is granted (no deadlock), no two holders ever hold one lock together, and each
/// lock's tokens rise.
#[tokio::test]
async fn crossed_sets_never_deadlock_and_never_share_a_lock() {
    let (_etcd, s) = sidecar(&[("x", "1"), ("y", "1"), ("z", "2")]).await;
    let holding: Arc<Mutex<HashMap<&'static str, usize>>> = Arc::default();
    let shapes: [(&str, &[&str]); 4] = [("x", &["y", "z"]), ("y", &["x"]), ("z", &["y"]), ("x", &[])];
    let workers: Vec<_> = (0..8)
        .map(|i| {
            let (s, holding) = (s.clone(), holding.clone());
            let (first, with) = shapes[i % shapes.len()];
            tokio::spawn(async move {
                let holder = format!("w{i}");
                let mut tokens = vec![];
                for _ in 0..6 {
                    let body = json!({"holderId": holder, "with": with, "waitSeconds": 20});
                    let token = s.must_acquire(first, body).await;
                    let locks: Vec<&'static str> =
                        std::iter::once(first).chain(with.iter().copied()).collect();
                    enter(&holding, &locks, &holder);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    leave(&holding, &locks);
                    assert_eq!(release(&s, first, &holder).await.0, 200);
                    tokens.push(token);
                }
                tokens
            })
        })
        .collect();
    let all = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(workers)).await;
    for tokens in all.expect("a deadlock: the workers did not finish") {
        let tokens = tokens.unwrap();
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    }
    for lock in ["x", "y", "z"] {
        assert_eq!(queue(&s, lock).await, (vec![], 0), "{lock} kept a key");
    }
}

/// Counts `holder` in every lock of `locks`; panics if that puts a mutex (`x`, `y`) over one
/// holder or the semaphore `z` over two.
fn enter(holding: &Mutex<HashMap<&'static str, usize>>, locks: &[&'static str], holder: &str) {
    let mut map = holding.lock().unwrap();
    for lock in locks {
        let n = map.entry(*lock).or_default();
        *n += 1;
        let max = if *lock == "z" { 2 } else { 1 };
        assert!(*n <= max, "{holder} holds {lock} beside {} others", *n - 1);
    }
}

fn leave(holding: &Mutex<HashMap<&'static str, usize>>, locks: &[&'static str]) {
    let mut map = holding.lock().unwrap();
    for lock in locks {
        *map.get_mut(lock).unwrap() -= 1;
    }
}

#[tokio::test]
async fn a_set_that_times_out_or_disconnects_leaves_no_key_in_any_queue() {
    let (_etcd, s) = sidecar(&[("x", "1"), ("y", "1")]).await;
    s.must_acquire("y", json!({"holderId": "a"})).await;
    let (status, body) = s
        .post(
            "x",
            "acquire",
            json!({"holderId": "b", "with": ["y"], "waitSeconds": 0.5}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "lock_held", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("/y"),
        "names the lock it waited for: {body}"
    );
    assert_eq!(queue(&s, "x").await, (vec![], 0));
    assert_eq!(queue(&s, "y").await, (vec!["a".to_string()], 0));
    // x was free all along, and is at once.
    s.must_acquire("x", json!({"holderId": "c", "waitSeconds": 0}))
        .await;
}

/// One lock of a held set is lost (here: moved to a new token epoch, which ends its holds):
/// the whole set is lost, its other keys removed. A set taken afterwards has a token per lock.
#[tokio::test]
async fn losing_one_lock_of_a_set_loses_the_set() {
    let (etcd, s) = sidecar(&[("x", "1"), ("y", "1")]).await;
    s.must_acquire("x", json!({"holderId": "b", "with": ["y"]})).await;
    declare(&etcd.endpoint, &["x", "--min-token", "1000000"]);
    let gone = crate::common::wait_until(Duration::from_secs(5), || async {
        queue(&s, "y").await == (vec![], 0)
    })
    .await;
    gone.expect("y's key outlived the set's loss");
    let (status, body) = release(&s, "y", "b").await;
    assert_eq!(status, 410, "the set is told lost on either lock: {body}");

    let (status, grant) = s
        .post("y", "acquire", json!({"holderId": "b", "with": ["x"]}))
        .await;
    assert_eq!(status, 200, "{grant}");
    let tokens: HashMap<&str, i64> = (grant["locks"].as_array().unwrap().iter())
        .map(|l| (l["lock"].as_str().unwrap(), l["fencingToken"].as_i64().unwrap()))
        .collect();
    assert!(
        tokens["x"] > 1_000_000 && tokens["y"] < 1_000_000,
        "each lock's epoch: {grant}"
    );
    assert_eq!(grant["fencingToken"], tokens["y"], "{grant}");
}

#[tokio::test]
async fn a_set_is_one_hold_for_its_holder_id() {
    let (_etcd, s) = sidecar(&[("x", "1"), ("y", "1")]).await;
    let token = s.must_acquire("x", json!({"holderId": "b", "with": ["y"]})).await;
    let (status, body) = s.post("y", "acquire", json!({"holderId": "b"})).await;
    assert_eq!((status, &body["error"]), (409, &json!("holder_in_use")), "{body}");
    assert!(body["message"].as_str().unwrap().contains("[x, y]"), "{body}");
    // The same set, named in any order, is answered with the hold it has.
    assert_eq!(
        s.must_acquire("y", json!({"holderId": "b", "with": ["x"]})).await,
        token
    );
    let (status, body) = s
        .post("y", "acquire", json!({"holderId": "b", "with": ["z"]}))
        .await;
    assert_eq!(status, 409, "another set: {body}");
    // A heartbeat of one lock of the set is a heartbeat of the set.
    let (status, body) = s.post("y", "heartbeat", json!({"holderId": "b"})).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_bad_set_is_refused_naming_what_to_fix() {
    let (_etcd, s) = sidecar(&[("x", "1"), ("y", "1"), ("sem", "3")]).await;
    let nine: Vec<String> = (0..8).map(|i| format!("l{i}")).collect();
    let cases = [
        (json!({"with": ["y", "y"]}), "named twice"),
        (json!({"with": ["x"]}), "named twice"),
        (json!({"with": nine}), "at most 8"),
        (json!({"with": ["Bad_Name"]}), "Bad_Name"),
        (json!({"with": "y"}), ""),
        (json!({"with": ["sem"], "mode": "shared"}), "maxHolders 1"),
        (json!({"with": ["undeclared"]}), "undeclared"),
    ];
    for (body, says) in cases {
        let (status, answer) = s.post("x", "acquire", body.clone()).await;
        if says.is_empty() {
            assert_eq!(status, 200, "a comma list is a list: {answer}");
            assert_eq!(release(&s, "x", "pod-a").await.0, 200);
            continue;
        }
        assert!((400..500).contains(&status), "{body} -> {status} {answer}");
        assert!(
            answer["message"].as_str().unwrap().contains(says),
            "{body} -> {answer}"
        );
    }
    for lock in ["x", "y", "sem"] {
        assert_eq!(
            queue(&s, lock).await,
            (vec![], 0),
            "{lock} kept a key of a refused set"
        );
    }
}

/// A set bound to its connection (`POST .../hold`) is released, on every lock, when its
/// client goes.
#[tokio::test]
async fn a_set_held_by_a_connection_ends_with_it() {
    let (_etcd, s) = sidecar(&[("x", "1"), ("y", "1")]).await;
    let url = format!("{}/v1/locks/x/hold?with=y", s.addr);
    let resp = reqwest::Client::new().post(url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let holder = crate::common::wait_until(Duration::from_secs(5), || async {
        !queue(&s, "y").await.0.is_empty()
    })
    .await;
    holder.expect("the stream's set holds y");
    drop(resp);
    let freed = crate::common::wait_until(Duration::from_secs(5), || async {
        queue(&s, "x").await == (vec![], 0) && queue(&s, "y").await == (vec![], 0)
    })
    .await;
    freed.expect("the set outlived its connection");
}

/// Finding 8 of the edges review: a try-once acquire of a semaphore behind a set's key, which
/// waits for another lock of its set, waited the whole 1 s grace meant for a holder recording
/// its grant. Fails on the old grace with `refused after 1.0s`.
#[tokio::test]
async fn a_try_once_behind_a_waiting_set_is_refused_at_once() {
    let (_etcd, s) = sidecar(&[("pool", "2"), ("gate", "1")]).await;
    s.must_acquire("gate", json!({"holderId": "g"})).await;
    let set = waiting_set(
        &s,
        "pool",
        json!({"holderId": "set", "with": ["gate"], "waitSeconds": 10}),
    )
    .await;
    assert_eq!(queue(&s, "pool").await, (vec![], 1), "the set waits for gate");
    let started = std::time::Instant::now();
    let (status, body) = (s.post("pool", "acquire", json!({"holderId": "late", "waitSeconds": 0}))).await;
    let took = started.elapsed();
    assert_eq!(status, 409, "{body}");
    assert!(took < Duration::from_millis(700), "refused after {took:?}");
    assert_eq!(release(&s, "gate", "g").await.0, 200);
    assert_eq!(set.await.unwrap().0, 200);
}

/// Finding 9 of the edges review: a set whose client disconnected while it waited left its
/// queues one key per request, not in one transaction as its enqueue put them. Fails on the old
/// removal with `not ended in one revision`.
#[tokio::test]
async fn a_set_whose_client_disconnects_leaves_every_queue_at_one_revision() {
    let (etcd, s) = sidecar(&[("x", "1"), ("y", "1")]).await;
    s.must_acquire("y", json!({"holderId": "a"})).await;
    let set = waiting_set(
        &s,
        "x",
        json!({"holderId": "b", "with": ["y"], "waitSeconds": 30}),
    )
    .await;
    assert_eq!(queue(&s, "x").await, (vec![], 1), "the set waits for y");
    let before = etcd.revision().await;
    set.abort(); // the client goes away: its connection closes
    let ended = crate::clusters::deletions_in(&etcd, "/podlock/v1/queue/default/", before).await;
    assert_eq!(ended.len(), 2, "{ended:?}");
    assert_eq!(ended[0].1, ended[1].1, "not ended in one revision: {ended:?}");
}

/// An acquire of `lock` with `body` (a set that will wait), sent in a task of its own, and
/// given 300 ms to take its place in the queues.
async fn waiting_set(
    s: &Arc<Sidecar>,
    lock: &'static str,
    body: Value,
) -> tokio::task::JoinHandle<(u16, Value)> {
    let s = s.clone();
    let set = tokio::spawn(async move { s.post(lock, "acquire", body).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    set
}
