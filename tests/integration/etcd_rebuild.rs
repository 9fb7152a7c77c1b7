//! Fencing tokens across a lock etcd wiped and started again, restored from an older snapshot
//! (with and without `--bump-revision`), and grown past what a token carries: on a real etcd,
//! with the operator on a real API server (or `podlock declare` without one), and the fenced
//! example store (`examples/fenced_store.py`) checking every token. Run with `--nocapture` to
//! see the tokens before and after.

use kube::api::Api;
use podlock::crd::DistributedLock;
use serde_json::json;
use std::time::{Duration, Instant};

use crate::common::kube::{ControlPlane, Operator, with_crd};
use crate::common::store::FencedStore;
use crate::common::{EtcdServer, Sidecar, declare};
use crate::operator::{declare_until_free, status_until};

const LOCK: &str = "ledger";

/// Takes and releases the lock `n` times on `s`, writing to `store` under each grant; returns
/// the tokens.
async fn grants(s: &Sidecar, store: &FencedStore, n: usize) -> Vec<i64> {
    let mut tokens = vec![];
    for _ in 0..n {
        let token = s.must_acquire(LOCK, json!({"waitSeconds": 5})).await;
        assert_eq!(store.write(token, &s.pod).await, 200, "token {token} refused");
        let (status, body) = s.post(LOCK, "release", json!({})).await;
        assert_eq!(status, 200, "{body}");
        tokens.push(token);
    }
    tokens
}

/// The first grant etcd and the lock's publisher allow after a rebuild: the sidecar answers
/// 404 until the lock is published again and 503 while its lease is being replaced. Written
/// to `store`, which must accept it, and released; returns the token.
async fn first_grant_after(s: &Sidecar, store: &FencedStore) -> i64 {
    let token = granted_after_rebuild(s, LOCK).await;
    let written = store.write(token, &s.pod).await;
    assert_eq!(
        written,
        200,
        "the fenced store refused token {token}: {:?}",
        store.state().await
    );
    let (status, body) = s.post(LOCK, "release", json!({})).await;
    assert_eq!(status, 200, "{body}");
    token
}

/// The token of `s`'s first grant of `lock` once etcd, rebuilt, has the lock published again
/// (404 until then, 503 while the sidecar's lease is being replaced), within 30 s.
pub(crate) async fn granted_after_rebuild(s: &Sidecar, lock: &str) -> i64 {
    let start = Instant::now();
    loop {
        let (status, body) = s.post(lock, "acquire", json!({"waitSeconds": 5})).await;
        if status == 200 {
            return body["fencingToken"].as_i64().unwrap();
        }
        assert!(
            [404, 503].contains(&status) && start.elapsed() < Duration::from_secs(30),
            "acquire after the rebuild: {status} {body}\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// An operator for namespace `name` on its own lock etcd, with the lock declared and Free.
async fn with_operator(name: &str) -> (&'static ControlPlane, String, EtcdServer, Operator) {
    let plane = with_crd();
    let ns = plane.namespace(name);
    let etcd = EtcdServer::start().await;
    let op = Operator::start_with(plane, &ns, &etcd.endpoint, &[]).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    declare_until_free(plane, &api, &ns, LOCK, "{}").await;
    (plane, ns, etcd, op)
}

/// The notes of the lock's `NewFencingEpoch` Events.
fn epoch_events(plane: &ControlPlane, ns: &str) -> String {
    let (_, notes, _) = plane.kubectl(&[
        "get",
        "events",
        "-n",
        ns,
        "--field-selector",
        "reason=NewFencingEpoch",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    notes
}

#[tokio::test]
async fn after_the_lock_etcd_is_wiped_tokens_continue_above_every_earlier_one() {
    let (plane, ns, mut etcd, op) = with_operator("etcd-wiped").await;
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &["--namespace", &ns]).await;
    let store = FencedStore::start().await;
    let before = grants(&s, &store, 5).await;
    etcd.wipe().await;
    let after = first_grant_after(&s, &store).await;
    eprintln!(
        "etcd wiped: tokens before {before:?}; the first after {after} (epoch {})",
        after >> 40
    );
    let highest = *before.last().unwrap();
    assert!(
        after > highest,
        "token {after} after the wipe, not above {highest}"
    );
    assert_eq!(after >> 40, 1, "the first rebuild moves the lock to epoch 1");
    told_and_fenced(plane, &ns, &op, &store, "etcd does not have the lock's settings").await;
}

/// Finding 1 of the edges review, as a user met it: after a wipe moved the lock to epoch 1,
/// its DistributedLock deleted and created again published epoch 0 (the finalizer's
/// withdrawal took the settings, the new object had no status), and the next token was a bare
/// revision, which the fenced store refused. Fails on the old withdrawal with `token 16 ...`.
#[tokio::test]
async fn a_lock_deleted_and_created_again_after_a_wipe_keeps_its_tokens_rising() {
    let (plane, ns, mut etcd, _op) = with_operator("etcd-wiped-recreated").await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &["--namespace", &ns]).await;
    let store = FencedStore::start().await;
    grants(&s, &store, 2).await;
    etcd.wipe().await;
    let after = first_grant_after(&s, &store).await;
    assert!(
        plane
            .kubectl(&["delete", "dlock", LOCK, "-n", &ns, "--wait=true"])
            .0
    );
    declare_until_free(plane, &api, &ns, LOCK, "{}").await;
    let again = first_grant_after(&s, &store).await;
    eprintln!("etcd wiped: first token after {after}; the lock deleted and created again: {again}");
    assert!(
        again > after,
        "token {again} after the re-create, not above {after}"
    );
}

/// An Event on the lock said why it moved to epoch 1 (`cause`), and the fenced store accepted
/// every one of the test's 6 writes, rejecting none.
async fn told_and_fenced(plane: &ControlPlane, ns: &str, op: &Operator, store: &FencedStore, cause: &str) {
    let notes = epoch_events(plane, ns);
    assert!(
        notes.contains(cause) && notes.contains("fencing tokens continue at epoch 1"),
        "Event notes: {notes:?}; operator log:\n{}",
        op.log()
    );
    let state = store.state().await;
    assert_eq!(
        (state["accepted"].as_u64(), state["rejected"].as_u64()),
        (Some(6), Some(0)),
        "{state}"
    );
}

#[tokio::test]
async fn a_restore_from_an_older_snapshot_is_detected_and_tokens_continue_above() {
    let (plane, ns, mut etcd, op) = with_operator("etcd-restored").await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &["--namespace", &ns]).await;
    let store = FencedStore::start().await;
    let early = grants(&s, &store, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("early.db");
    etcd.snapshot(&snapshot);
    let mut later = grants(&s, &store, 2).await;
    // The operator detects the restore by the largest token its status recorded, from the
    // holders it saw: the last hold lasts until the status shows it.
    let highest = s.must_acquire(LOCK, json!({})).await;
    assert_eq!(store.write(highest, &s.pod).await, 200);
    let shown = |st: &podlock::crd::DistributedLockStatus| st.fencing_token == Some(highest);
    status_until(&api, LOCK, "the last token", shown).await;
    s.post(LOCK, "release", json!({})).await;
    later.push(highest);
    etcd.restore(&snapshot, &[]).await;
    let revision = etcd.revision().await;
    // Grants before the operator's reconcile could go below (docs/operations.md): wait for it.
    let bumped = wait_for_new_epoch(plane, &ns).await;
    let after = first_grant_after(&s, &store).await;
    eprintln!(
        "etcd restored without --bump-revision (revision {revision}): tokens before the snapshot \
         {early:?}, after it {later:?}; the operator moved to epoch 1 in {bumped:?}; the first token \
         after {after}"
    );
    assert!(
        revision < highest,
        "the restore did not take etcd's revision back"
    );
    assert!(
        after > highest,
        "token {after} after the restore, not above {highest}"
    );
    told_and_fenced(plane, &ns, &op, &store, "etcd's revision went backwards").await;
    let st = api.get_status(LOCK).await.unwrap().status.unwrap();
    assert_eq!(st.fencing_epoch, Some(1), "{st:?}");
}

#[tokio::test]
async fn a_restore_with_bump_revision_keeps_the_epoch() {
    let (plane, ns, mut etcd, op) = with_operator("etcd-bumped").await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &["--namespace", &ns]).await;
    let store = FencedStore::start().await;
    grants(&s, &store, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("early.db");
    etcd.snapshot(&snapshot);
    let later = grants(&s, &store, 2).await;
    let bump = ["--bump-revision", "1000000", "--mark-compacted"];
    etcd.restore(&snapshot, &bump).await;
    let after = first_grant_after(&s, &store).await;
    eprintln!("etcd restored with --bump-revision 1000000: tokens before {later:?}; the first after {after}");
    assert!(
        after > *later.last().unwrap() && after >> 40 == 0,
        "token {after}"
    );
    let st = api.get_status(LOCK).await.unwrap().status.unwrap();
    assert_eq!(st.fencing_epoch, Some(0), "{st:?}\n{}", op.log());
    assert_eq!(
        epoch_events(plane, &ns),
        "",
        "a bumped restore needs no new epoch"
    );
}

/// Finding 2 of the edges review, as a user met it: pod-a holds, pod-b waits; a snapshot; a
/// releases and b is granted; etcd restored from the snapshot with `--bump-revision`. a's key
/// came back at the head of the queue on a's live lease: the fence check called a's old token
/// current beside b's, until a's orphan sweep removed the key. Now the operator, whose watch had
/// seen that key end, moves the lock to a new epoch. Fails on the code before with `no
/// NewFencingEpoch Event`.
#[tokio::test]
async fn a_restore_that_brings_back_a_released_hold_moves_the_lock_to_a_new_epoch() {
    let (plane, ns, mut etcd, op) = with_operator("etcd-brought-back").await;
    let a = Sidecar::start(&etcd.endpoint, "pod-a", &["--namespace", &ns]).await;
    let b = Sidecar::start(&etcd.endpoint, "pod-b", &["--namespace", &ns]).await;
    let first = a.must_acquire(LOCK, json!({})).await;
    let waiter = tokio::spawn(async move {
        let token = b.must_acquire(LOCK, json!({"waitSeconds": 20})).await;
        (b, token)
    });
    while a.get(&format!("/v1/locks/{LOCK}")).await.1["waiters"] != 1 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("held.db");
    etcd.snapshot(&snapshot);
    let (status, body) = a.post(LOCK, "release", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (b, second) = waiter.await.unwrap();
    // a's sidecar stalled: it would remove its brought-back key itself once it found etcd
    // restored (`restored_fence`), and this test is of the operator's part.
    a.signal(libc::SIGSTOP);
    let bump = ["--bump-revision", "1000000", "--mark-compacted"];
    etcd.restore(&snapshot, &bump).await;
    let restored = Instant::now();
    let bumped = wait_for_new_epoch(plane, &ns).await;
    a.signal(libc::SIGCONT);
    let fence = a.get(&format!("/v1/locks/{LOCK}/fence?token={first}")).await.1;
    assert_eq!(
        fence["current"], false,
        "token {first} after the restore: {fence}"
    );
    let (status, body) = b.post(LOCK, "heartbeat", json!({})).await;
    assert_eq!(status, 410, "b's hold of the old epoch: {body}");
    let after = b.must_acquire(LOCK, json!({"waitSeconds": 5})).await;
    eprintln!(
        "a held {first}, b waited; snapshot; b granted {second}; restored with --bump-revision: \
         a new epoch {bumped:?} after etcd came back ({:?} in all); the first token \
         after {after}",
        restored.elapsed()
    );
    assert!(after > second && after >> 40 == 1, "token {after}");
    let notes = epoch_events(plane, &ns);
    assert!(notes.contains("brought back"), "{notes}\n{}", op.log());
}

/// Waits until the operator has published the lock under a new epoch (its Event comes after
/// the write to etcd); returns how long that took.
async fn wait_for_new_epoch(plane: &ControlPlane, ns: &str) -> Duration {
    let start = Instant::now();
    while epoch_events(plane, ns).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no NewFencingEpoch Event"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

#[tokio::test]
async fn without_kubernetes_declare_min_token_carries_tokens_over_a_wipe() {
    let mut etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &[LOCK]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let store = FencedStore::start().await;
    let before = grants(&s, &store, 3).await;
    let highest = *before.last().unwrap();
    etcd.wipe().await;
    // Declared again as before, the lock starts over at epoch 0: the store refuses its tokens.
    declare(&etcd.endpoint, &[LOCK]);
    let (status, low) = wait_for_grant(&s).await;
    let refused = store.write(low, &s.pod).await;
    s.post(LOCK, "release", json!({})).await;
    assert_eq!((status, refused), (200, 409), "token {low} after a plain declare");
    declare(&etcd.endpoint, &[LOCK, "--min-token", &highest.to_string()]);
    let after = first_grant_after(&s, &store).await;
    eprintln!(
        "podlock declare after a wipe: tokens before {before:?}; a plain declare gave {low} \
         (refused); with --min-token {highest}: {after}"
    );
    assert!(after > highest && after >> 40 == 1, "token {after}");
    // Declared again without the flag, the lock keeps its epoch.
    declare(&etcd.endpoint, &[LOCK, "--ttl-seconds", "20"]);
    let next = grants(&s, &store, 1).await[0];
    assert!(
        next > after,
        "token {next} after a second declare, not above {after}"
    );
    // Deleted and declared again, too (finding 1 of the edges review: it fell to epoch 0).
    declare(&etcd.endpoint, &[LOCK, "--delete"]);
    declare(&etcd.endpoint, &[LOCK]);
    let last = first_grant_after(&s, &store).await;
    assert!(
        last > next,
        "token {last} after --delete and declare, not above {next}"
    );
}

/// The first grant once the sidecar's lease was replaced: (status, token).
async fn wait_for_grant(s: &Sidecar) -> (u16, i64) {
    let start = Instant::now();
    loop {
        let (status, body) = s.post(LOCK, "acquire", json!({"waitSeconds": 5})).await;
        if status == 200 || start.elapsed() > Duration::from_secs(30) {
            return (status, body["fencingToken"].as_i64().unwrap_or(-1));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_revision_a_token_cannot_carry_refuses_the_acquire() {
    let mut etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &[LOCK]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let snapshot = dir.path().join("now.db");
    etcd.snapshot(&snapshot);
    let limit = (1_i64 << 40).to_string();
    etcd.restore(&snapshot, &["--bump-revision", &limit, "--mark-compacted"])
        .await;
    let start = Instant::now();
    let (status, body) = loop {
        let (status, body) = s.post(LOCK, "acquire", json!({})).await;
        // The sidecar's lease did not survive the snapshot's restore: 503 until replaced.
        if status != 503 || body["message"].as_str().is_some_and(|m| m.contains("2^40")) {
            break (status, body);
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("etcd at revision {}: {status} {body}", etcd.revision().await);
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "backend_unavailable");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("new etcd"), "{message}");
    crate::common::wait_until(Duration::from_secs(5), || async {
        etcd.count("/podlock/v1/queue/").await == 0
    })
    .await
    .expect("the refused acquire's key is removed");
}
