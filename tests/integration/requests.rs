//! What a grant costs etcd. On a small cluster etcd's CPU bounds the handoffs per second, so
//! each request saved is handoffs gained (issue #15): a busy mutex needs its two writes
//! (enqueue, release) and one read when a waiter's predecessor goes, nothing more. The
//! benchmark (`cargo bench --bench handoff`) prints the same figures at 1, 8 and 64 contenders.

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
async fn a_busy_mutex_costs_at_most_three_requests_per_grant() {
    let per_grant = requests_per_grant(4, 25).await;
    eprintln!("etcd requests per grant, 4 contenders: {per_grant:.2}");
    // Two writes and one read per grant; a waiter's occasional extra read (its position moved
    // while it set up its watch) is what the headroom is for.
    assert!(
        per_grant <= 3.3,
        "{per_grant:.2} etcd requests per grant with 4 contenders (enqueue, one read, release)"
    );
}
