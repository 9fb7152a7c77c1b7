//! The fence check after a restore that no operator handles (issue #54, finding 4): a restore
//! with `--bump-revision` brings back the key of a hold released after the snapshot, on its
//! sidecar's lease. Nothing in etcd tells that key from a hold that goes on, so only its
//! sidecar can: it answers its own fence checks from its registry, and removes such keys once
//! it finds etcd restored (docs/design.md, "Fencing"). Real etcd, `etcdutl`, no operator.

use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{EtcdServer, Sidecar, declare};

const LOCK: &str = "ledger";

/// How long after etcd's return a brought-back hold may still read as current through another
/// sidecar: its own sidecar's removal (docs/api.md, "What `current: true` guarantees").
const REMOVED_WITHIN: Duration = Duration::from_secs(2);

/// `GET .../fence?token=N` on `s` once etcd answers again (503 until then).
async fn fence(s: &Sidecar, token: i64) -> Value {
    let start = Instant::now();
    loop {
        let (status, body) = s.get(&format!("/v1/locks/{LOCK}/fence?token={token}")).await;
        if status == 200 {
            return body;
        }
        assert!(
            status == 503 && start.elapsed() < Duration::from_secs(20),
            "{status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A snapshot taken while `a` held and `b` waited, then `a` released and `b` was granted; the
/// sidecars (b's granted hold running), the snapshot's directory, a's token and b's.
struct Released {
    a: Sidecar,
    b: Sidecar,
    snapshot: tempfile::TempDir,
    first: i64,
    second: i64,
}

impl Released {
    async fn on(etcd: &EtcdServer) -> Self {
        let a = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
        let b = Arc::new(Sidecar::start(&etcd.endpoint, "pod-b", &[]).await);
        let first = a.must_acquire(LOCK, json!({})).await;
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.must_acquire(LOCK, json!({"waitSeconds": 20})).await }
        });
        while a.get(&format!("/v1/locks/{LOCK}")).await.1["waiters"] != 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let snapshot = tempfile::tempdir().unwrap();
        etcd.snapshot(&snapshot.path().join("held.db"));
        let (status, body) = a.post(LOCK, "release", json!({})).await;
        assert_eq!(status, 200, "{body}");
        let second = waiter.await.unwrap();
        let b = Arc::into_inner(b).unwrap();
        Released {
            a,
            b,
            snapshot,
            first,
            second,
        }
    }

    /// Restores `etcd` from the snapshot with a revision bump, `down` after stopping it.
    async fn restore(&self, etcd: &mut EtcdServer, down: Duration) -> Instant {
        etcd.stop();
        tokio::time::sleep(down).await;
        let bump = ["--bump-revision", "1000000", "--mark-compacted"];
        etcd.restore(&self.snapshot.path().join("held.db"), &bump).await;
        Instant::now()
    }
}

/// How long after `since` `s`'s fence check went on calling `token` current (at most 20 s).
async fn current_for(s: &Sidecar, token: i64, since: Instant) -> Duration {
    loop {
        let answer = fence(s, token).await;
        if answer["current"] == false || since.elapsed() > Duration::from_secs(20) {
            return since.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The released hold's own sidecar never calls its token current: its registry knows the hold
/// ended, whatever etcd brought back. Before, it answered `current: true` until its orphan
/// sweep removed the key, 5 to 10 s later.
#[tokio::test]
async fn the_sidecar_of_a_released_hold_never_calls_its_token_current_after_a_restore() {
    let mut etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &[LOCK]);
    let run = Released::on(&etcd).await;
    run.restore(&mut etcd, Duration::ZERO).await;
    let answer = fence(&run.a, run.first).await;
    assert_eq!(
        answer["current"], false,
        "a's own sidecar, token {} released before the restore: {answer}",
        run.first
    );
}

/// Through any other sidecar, the brought-back hold reads as current until its sidecar, whose
/// session lived through the restore, finds etcd restored and removes the key: within
/// [`REMOVED_WITHIN`] of etcd's return. Before, the orphan sweep took 5 to 10 s.
#[tokio::test]
async fn a_hold_brought_back_by_a_restore_is_removed_by_its_sidecar_soon_after_etcd_returns() {
    let mut etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &[LOCK]);
    let run = Released::on(&etcd).await;
    let back = run.restore(&mut etcd, Duration::ZERO).await;
    let took = current_for(&run.b, run.first, back).await;
    eprintln!(
        "a released {} after the snapshot, b granted {}; restored: a's key current through b's \
         sidecar for {took:?} after etcd came back",
        run.first, run.second
    );
    assert!(
        took < REMOVED_WITHIN,
        "token {} current for {took:?} after the restore\na's log:\n{}",
        run.first,
        run.a.log()
    );
}

/// etcd down longer than the TTL, then restored: every session of the sidecars was lost
/// (their holds told `lost`), but the snapshot brings their leases back, with a's released key
/// and b's key. The sidecars revoke their lost leases as soon as etcd answers. Before, they
/// tried once while etcd was down, and the keys lived on for a TTL after etcd's return.
#[tokio::test]
async fn leases_lost_while_etcd_was_down_are_revoked_when_it_returns() {
    const TTL: u64 = 6;
    let mut etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &[LOCK, "--ttl-seconds", &TTL.to_string()]);
    let run = Released::on(&etcd).await;
    let c = Sidecar::start(&etcd.endpoint, "pod-c", &[]).await;
    let back = run.restore(&mut etcd, Duration::from_secs(TTL + 1)).await;
    let took = current_for(&c, run.first, back).await;
    eprintln!(
        "etcd down {}s with a TTL of {TTL}s, restored: a's released key current for {took:?} \
         after etcd came back",
        TTL + 1
    );
    assert!(
        took < REMOVED_WITHIN,
        "token {} current for {took:?} after the restore\na's log:\n{}",
        run.first,
        run.a.log()
    );
    let (status, body) = run.b.post(LOCK, "heartbeat", json!({})).await;
    assert_eq!(status, 410, "b's hold ended with its session: {body}");
}
