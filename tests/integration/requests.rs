//! What a grant costs etcd. On a small cluster etcd's CPU bounds the handoffs per second, so
//! each request saved is handoffs gained (issues #15, #28): a busy mutex needs its two writes
//! (enqueue, and the release that hands the lock on) and, once per chain of keys a holder
//! knows behind it, one read, nothing more. The benchmark (`cargo bench --bench handoff`)
//! prints the same figures at 1, 8 and 64 contenders.

use serde_json::json;
use std::sync::Arc;

use crate::common::{EtcdServer, Sidecar, declare};

/// Unary etcd requests made by `sidecars` so far.
async fn requests(sidecars: &[Arc<Sidecar>]) -> f64 {
    let mut total = 0.0;
    for s in sidecars {
        total += s.metric("podlock_etcd_requests_total").await;
    }
    total
}

/// `contenders` sidecars take and release `lock` `rounds` times each, all at once; returns the
/// etcd requests they made per grant.
async fn requests_per_grant(contenders: usize, rounds: usize) -> f64 {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["busy"]);
    let mut sidecars = vec![];
    for i in 0..contenders {
        let s = Sidecar::start(&etcd.endpoint, &format!("p{i}"), &[]).await;
        // One round first: the session's lease and the lock's settings are read once per
        // sidecar, not per grant.
        s.must_acquire("busy", json!({"waitSeconds": 30})).await;
        assert_eq!(s.post("busy", "release", json!({})).await.0, 200);
        sidecars.push(Arc::new(s));
    }
    let before = requests(&sidecars).await;
    let loops: Vec<_> = (sidecars.iter().cloned())
        .map(|s| {
            tokio::spawn(async move {
                for _ in 0..rounds {
                    s.must_acquire("busy", json!({"waitSeconds": 30})).await;
                    assert_eq!(s.post("busy", "release", json!({})).await.0, 200);
                }
            })
        })
        .collect();
    for l in loops {
        l.await.unwrap();
    }
    (requests(&sidecars).await - before) / (contenders * rounds) as f64
}

#[tokio::test]
async fn an_uncontended_grant_costs_its_two_writes() {
    let per_grant = requests_per_grant(1, 30).await;
    eprintln!("etcd requests per uncontended grant: {per_grant:.2}");
    assert!(
        per_grant <= 2.0,
        "{per_grant:.2} etcd requests per uncontended grant; enqueue and release are all it needs"
    );
}

#[tokio::test]
async fn a_busy_mutex_costs_about_two_requests_per_grant() {
    let per_grant = requests_per_grant(4, 25).await;
    eprintln!("etcd requests per grant, 4 contenders: {per_grant:.2}");
    // Two writes per grant, and one read each time a chain runs out: with 4 contenders a
    // holder knows at most 3 keys behind it, so one grant in 4 is read (2.25). A waiter's
    // occasional extra read (its position moved while it set up its watch) is what the
    // headroom is for.
    assert!(
        per_grant <= 2.6,
        "{per_grant:.2} etcd requests per grant with 4 contenders (enqueue, release, a read per chain)"
    );
}

/// A holder granted by a read knows the key behind it; its release hands the lock on in the
/// same transaction, and the waiter learns its grant from the watch on its key: no request.
#[tokio::test]
async fn a_release_hands_the_lock_to_the_next_waiter_without_a_read() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["baton"]);
    let start = async |pod| Arc::new(Sidecar::start(&etcd.endpoint, pod, &[]).await);
    let (a, b, c) = (start("p0").await, start("p1").await, start("p2").await);
    a.must_acquire("baton", json!({})).await;
    let wait = json!({"waitSeconds": 30});
    let b_waits = tokio::spawn({
        let (b, wait) = (b.clone(), wait.clone());
        async move { b.must_acquire("baton", wait).await }
    });
    settle(&b).await;
    let c_waits = tokio::spawn({
        let c = c.clone();
        async move { c.must_acquire("baton", wait).await }
    });
    settle(&c).await;
    // b is granted by its read (a's release is a plain delete: a knew nobody behind it).
    assert_eq!(a.post("baton", "release", json!({})).await.0, 200);
    let b_token = b_waits.await.unwrap();
    let c_before = c.metric("podlock_etcd_requests_total").await;
    let b_before = b.metric("podlock_etcd_requests_total").await;
    assert_eq!(b.post("baton", "release", json!({})).await.0, 200);
    let c_token = c_waits.await.unwrap();
    assert!(c_token > b_token, "tokens rise: {b_token} then {c_token}");
    let c_spent = c.metric("podlock_etcd_requests_total").await - c_before;
    let b_spent = b.metric("podlock_etcd_requests_total").await - b_before;
    assert_eq!(c_spent, 0.0, "the waiter read or wrote to learn of its grant");
    assert_eq!(b_spent, 1.0, "the release that hands on is one transaction");
    assert_eq!(c.post("baton", "release", json!({})).await.0, 200);
}

/// Waits until `sidecar` has placed its key and set up its watches (its requests stop rising).
async fn settle(sidecar: &Sidecar) {
    let mut last = -1.0;
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let now = sidecar.metric("podlock_etcd_requests_total").await;
        if now == last {
            return;
        }
        last = now;
    }
}
