//! The operator's readiness tells an install whose etcd does not answer (issue #55, item 4): a
//! replica is not Ready before etcd answered it once, so `helm install --wait` fails instead of
//! reporting success; after that, an etcd outage leaves it Ready (its webhook needs no etcd, and
//! pods created meanwhile must still get their sidecar) and its `/readyz` says so.

use std::time::Duration;

use crate::common::kube::{Operator, with_crd};
use crate::common::{EtcdServer, wait_until};

/// `/readyz`'s status and text.
async fn readyz(op: &Operator) -> (u16, String) {
    let response = reqwest::get(format!("{}/readyz", op.addr)).await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test]
async fn a_replica_is_ready_once_etcd_answered_and_stays_ready_through_an_outage() {
    let plane = with_crd();
    let ns = plane.namespace("ready-etcd");
    let mut etcd = EtcdServer::start().await;
    etcd.stop();
    let op = Operator::start_with(plane, &ns, &etcd.endpoint, &[]).await;
    // Two of etcd's probes (every 5 s) go unanswered: never Ready.
    for _ in 0..3 {
        let (status, text) = readyz(&op).await;
        assert_eq!(status, 503, "Ready without etcd: {text}\n{}", op.log());
        assert!(text.contains("etcd has not answered"), "{text}");
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    eprintln!("without etcd: {}", readyz(&op).await.1);

    etcd.resume().await;
    wait_until(Duration::from_secs(15), || async { readyz(&op).await.0 == 200 })
        .await
        .unwrap_or_else(|e| panic!("not Ready once etcd answers ({e}):\n{}", op.log()));

    etcd.stop();
    let outage = "etcd did not answer its last probe";
    let shown = wait_until(Duration::from_secs(15), || async {
        readyz(&op).await.1.contains(outage)
    })
    .await;
    let (status, text) = readyz(&op).await;
    assert!(shown.is_ok(), "the outage never showed: {status} {text}");
    assert_eq!(status, 200, "an etcd outage took the webhook out: {text}");
    eprintln!("in an outage after etcd answered: {text}");
}
