//! The etcd rows of docs/operations.md's failure modes, on real etcd and sidecars: with etcd
//! down, or a cluster that lost its quorum, a holder is told `lost` once its lease may have
//! expired (its last confirmed keepalive plus the TTL), a waiter is answered 503 about then,
//! new acquires are 503; once etcd is back the lock is granted again, with a larger token, after
//! at most about one TTL (etcd keeps the old leases, with their time renewed, and nobody renews
//! them any more).

use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::events::Events;
use crate::common::{EtcdServer, Sidecar, declare, wait_until};

/// The lock's TTL in seconds.
const TTL: u64 = 3;

/// An etcd outage to cause and end.
enum Outage {
    /// The only member stopped.
    Down(EtcdServer),
    /// Two of three members stopped: the third runs, without a quorum.
    QuorumLost(Vec<EtcdServer>),
}

impl Outage {
    fn endpoints(&self) -> String {
        let members = match self {
            Outage::Down(m) => std::slice::from_ref(m),
            Outage::QuorumLost(ms) => ms.as_slice(),
        };
        members
            .iter()
            .map(|m| m.endpoint.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    fn begin(&mut self) {
        match self {
            Outage::Down(m) => m.stop(),
            Outage::QuorumLost(ms) => ms[1..].iter_mut().for_each(EtcdServer::stop),
        }
    }

    async fn end(&mut self) {
        match self {
            Outage::Down(m) => m.resume().await,
            Outage::QuorumLost(ms) => ms[1].resume().await,
        }
    }
}

async fn holders_and_waiters_through(mut outage: Outage) {
    let endpoints = outage.endpoints();
    declare(&endpoints, &["o", "--ttl-seconds", &TTL.to_string()]);
    let a = Sidecar::start(&endpoints, "pod-a", &[]).await;
    let b = Arc::new(Sidecar::start(&endpoints, "pod-b", &[]).await);
    let mut events = Events::open(&a, "o").await;
    let token = a.must_acquire("o", json!({"holderId": "holder"})).await;
    assert_eq!(events.next(Duration::from_secs(1)).await["type"], "acquired");
    let waiter = b.clone();
    let waiting = tokio::spawn(async move {
        let answer = waiter.post("o", "acquire", json!({"holderId": "waiter", "waitSeconds": 60}));
        (answer.await, Instant::now())
    });
    let queued = wait_until(Duration::from_secs(5), || async {
        b.get("/v1/locks").await.1["locks"][0]["state"] == "waiting"
    });
    queued.await.expect("the waiter queues");

    outage.begin();
    let began = Instant::now();
    let lost = events.next(Duration::from_secs(TTL + 2)).await;
    let lost_after = began.elapsed();
    assert_eq!(lost["type"], "lost", "{lost}");
    // The contract: `lost` within 1 s of the hold ending. The lease ends at most TTL after the
    // outage began (its last renewal came before), so `lost` is due within TTL + 1 s of it.
    assert!(
        lost_after <= Duration::from_secs(TTL + 1),
        "lost {lost_after:?} after the outage began (TTL {TTL} s)"
    );
    let ((status, body), answered) = waiting.await.unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("backend_unavailable")),
        "{body}"
    );
    let waiter_after = answered - began;
    assert!(waiter_after < Duration::from_secs(TTL + 10), "{waiter_after:?}");
    let (status, body) = a
        .post("o", "acquire", json!({"holderId": "new", "waitSeconds": 1}))
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("backend_unavailable")),
        "{body}"
    );
    assert_eq!(a.get("/readyz").await.0, 503);

    outage.end().await;
    let back = Instant::now();
    let granted = b
        .must_acquire("o", json!({"holderId": "after", "waitSeconds": 30}))
        .await;
    let granted_after = back.elapsed();
    assert!(granted > token, "tokens rise: {granted} after {token}");
    eprintln!(
        "TTL {TTL} s: the holder was told lost {lost_after:?} after the outage began, the waiter \
         answered 503 after {waiter_after:?}; once etcd was back, the next grant took {granted_after:?}"
    );
    assert!(granted_after < Duration::from_secs(TTL + 10), "{granted_after:?}");
}

#[tokio::test]
async fn etcd_down_ends_holds_at_their_ttl_answers_waiters_503_and_service_resumes() {
    holders_and_waiters_through(Outage::Down(EtcdServer::start().await)).await;
}

#[tokio::test]
async fn a_lost_quorum_ends_holds_at_their_ttl_answers_waiters_503_and_service_resumes() {
    holders_and_waiters_through(Outage::QuorumLost(EtcdServer::cluster(3).await)).await;
}
