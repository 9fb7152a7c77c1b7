//! The fence check (`GET /v1/locks/{name}/fence?token=N`, `podlock fence`): whether a token is
//! a current hold, read from etcd, on a real etcd and real sidecars.

use serde_json::{Value, json};
use std::process::Command;
use std::sync::Arc;

use crate::common::{EtcdServer, Sidecar, declare, podlock_bin};

/// `GET .../fence?token=N` on `s`; panics unless it answers 200.
async fn fence(s: &Sidecar, lock: &str, token: i64) -> Value {
    let (status, body) = s.get(&format!("/v1/locks/{lock}/fence?token={token}")).await;
    assert_eq!(status, 200, "fence {lock} {token}: {body}");
    body
}

/// The tokens of an answer's holders, in its order.
fn holders(answer: &Value) -> Vec<i64> {
    let holders = answer["holders"].as_array().unwrap();
    holders
        .iter()
        .map(|h| h["fencingToken"].as_i64().unwrap())
        .collect()
}

async fn release(s: &Sidecar, lock: &str, holder: &str) {
    let (status, body) = s.post(lock, "release", json!({"holderId": holder})).await;
    assert_eq!(status, 200, "release {holder}: {body}");
}

/// Acquires `lock` as `holder` in the background, waiting up to 10 s.
fn later(s: &Arc<Sidecar>, lock: &str, body: Value) -> tokio::task::JoinHandle<i64> {
    let (s, lock) = (s.clone(), lock.to_string());
    tokio::spawn(async move { s.must_acquire(&lock, body).await })
}

/// `podlock fence LOCK TOKEN` against `s`: exit status and stdout.
fn fence_cmd(s: &Sidecar, lock: &str, token: &str) -> (i32, String) {
    let out = Command::new(podlock_bin())
        .args(["fence", lock, token, "--addr", &s.addr])
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[tokio::test]
async fn a_token_is_current_while_held_and_names_the_next_holder_after() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["fenced"]);
    let s = Arc::new(Sidecar::start(&etcd.endpoint, "pod-a", &[]).await);
    let first = s.must_acquire("fenced", json!({"holderId": "a"})).await;
    let answer = fence(&s, "fenced", first).await;
    assert_eq!(answer["current"], true, "{answer}");
    assert_eq!(holders(&answer), [first]);
    assert_eq!(
        (answer["lock"].as_str(), answer["token"].as_i64()),
        (Some("fenced"), Some(first))
    );
    assert!(answer["revision"].as_i64().unwrap() >= first, "{answer}");
    assert_eq!(fence_cmd(&s, "fenced", &first.to_string()).0, 0);

    let next = later(&s, "fenced", json!({"holderId": "b", "waitSeconds": 10}));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        holders(&fence(&s, "fenced", first).await),
        [first],
        "a waiter is no holder"
    );
    release(&s, "fenced", "a").await;
    let second = next.await.unwrap();
    let answer = fence(&s, "fenced", first).await;
    assert_eq!(answer["current"], false, "{answer}");
    assert_eq!(holders(&answer), [second], "{answer}");
    assert_eq!(answer["holders"][0]["holderId"], "b");
    assert!(answer["revision"].as_i64().unwrap() >= second, "{answer}");
    assert_eq!(fence(&s, "fenced", second).await["current"], true);

    let (code, out) = fence_cmd(&s, "fenced", &first.to_string());
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("\"fencingToken\":{second}")), "{out}");
    release(&s, "fenced", "b").await;
    let answer = fence(&s, "fenced", second).await;
    assert_eq!(
        (answer["current"].clone(), holders(&answer)),
        (json!(false), vec![])
    );
}

/// A semaphore `pool` of 2 slots held by `a` and `b` of one sidecar, and `c` waiting (up to
/// 10 s) for a slot: the etcd, the sidecar, the holders' tokens and the waiter's.
async fn two_holders_and_a_waiter() -> (EtcdServer, Arc<Sidecar>, [i64; 2], tokio::task::JoinHandle<i64>) {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["pool", "--max-holders", "2"]);
    let s = Arc::new(Sidecar::start(&etcd.endpoint, "pod-a", &[]).await);
    let a = s.must_acquire("pool", json!({"holderId": "a"})).await;
    let b = s.must_acquire("pool", json!({"holderId": "b"})).await;
    let c = later(&s, "pool", json!({"holderId": "c", "waitSeconds": 10}));
    (etcd, s, [a, b], c)
}

#[tokio::test]
async fn every_holder_of_a_semaphore_is_current_and_a_release_ends_only_its_own() {
    let (_etcd, s, [a, b], c) = two_holders_and_a_waiter().await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for token in [a, b] {
        let answer = fence(&s, "pool", token).await;
        assert_eq!(answer["current"], true, "{answer}");
        assert_eq!(holders(&answer), [a, b], "the waiter c is no holder: {answer}");
    }
    release(&s, "pool", "a").await;
    let c = c.await.unwrap();
    let answer = fence(&s, "pool", a).await;
    assert_eq!(answer["current"], false, "{answer}");
    assert_eq!(holders(&answer), [b, c]);
    assert_eq!(fence(&s, "pool", b).await["current"], true);
}

/// `maxHolders` lowered binds new grants only: a hold granted before goes on, and stays current.
#[tokio::test]
async fn a_hold_granted_before_max_holders_was_lowered_stays_current() {
    let (etcd, s, [a, b], c) = two_holders_and_a_waiter().await;
    declare(&etcd.endpoint, &["pool", "--max-holders", "1"]);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let answer = fence(&s, "pool", b).await;
    assert_eq!(answer["current"], true, "{answer}");
    assert_eq!(holders(&answer), [a, b], "{answer}");
    release(&s, "pool", "a").await;
    assert_eq!(holders(&fence(&s, "pool", b).await), [b], "c waits for b too");
    release(&s, "pool", "b").await;
    let c = c.await.unwrap();
    assert_eq!(holders(&fence(&s, "pool", b).await), [c]);
}

/// More shared holders than the check reads at first (the lock's slots and 8): it reads the
/// whole queue and still names them all.
#[tokio::test]
async fn every_shared_holder_is_current_however_many() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["rw"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let mut readers = vec![];
    for i in 0..12 {
        let body = json!({"holderId": format!("r{i}"), "mode": "shared", "waitSeconds": 0});
        readers.push(s.must_acquire("rw", body).await);
    }
    let answer = fence(&s, "rw", readers[11]).await;
    assert_eq!(answer["current"], true, "{answer}");
    assert_eq!(holders(&answer), readers);
    assert!(
        answer["holders"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["mode"] == "shared")
    );
}

#[tokio::test]
async fn a_bad_token_is_a_400_saying_what_to_send_and_an_unknown_lock_has_no_holders() {
    let etcd = EtcdServer::start().await;
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    for (query, says) in [
        ("", "?token=N"),
        ("?token=abc", "\"abc\""),
        ("?token=-1", "positive integer"),
        ("?tokn=5", "tokn"),
    ] {
        let (status, body) = s.get(&format!("/v1/locks/nope/fence{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"], "invalid_request", "{body}");
        assert!(
            body["message"].as_str().unwrap().contains(says),
            "{query}: {body}"
        );
    }
    let (status, body) = s.get("/v1/locks/Bad_Name/fence?token=5").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );
    let answer = fence(&s, "nope", 5).await;
    assert_eq!(
        (answer["current"].clone(), holders(&answer)),
        (json!(false), vec![])
    );
    let (code, out) = fence_cmd(&s, "nope", "five");
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("400") && out.contains("five"), "{out}");
}

/// A lock's name means the lock of the asking sidecar's namespace: another namespace's holder
/// of the same name is never reported, nor is its token current here.
#[tokio::test]
async fn a_token_of_another_namespaces_lock_is_not_current() {
    let etcd = EtcdServer::start().await;
    for ns in ["team-a", "team-b"] {
        declare(&etcd.endpoint, &["shared", "--namespace", ns]);
    }
    let a = Sidecar::start(&etcd.endpoint, "pod-a", &["--namespace", "team-a"]).await;
    let b = Sidecar::start(&etcd.endpoint, "pod-b", &["--namespace", "team-b"]).await;
    let theirs = b.must_acquire("shared", json!({})).await;
    assert_eq!(fence(&b, "shared", theirs).await["current"], true);
    let answer = fence(&a, "shared", theirs).await;
    assert_eq!(answer["current"], false, "{answer}");
    assert_eq!(
        (answer["namespace"].as_str(), holders(&answer)),
        (Some("team-a"), vec![])
    );
    let ours = a.must_acquire("shared", json!({})).await;
    assert_eq!(holders(&fence(&a, "shared", theirs).await), [ours]);
}
