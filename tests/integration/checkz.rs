//! What `helm test` asks the operator (`/checkz`): a lock's round trip through etcd with the
//! operator's credentials, failing with a message that names the cause while etcd is down,
//! whereas `/readyz` stays 200 (the webhook needs no etcd).

use std::time::Duration;

use crate::common::kube::{Operator, with_crd};
use crate::common::{EtcdServer, wait_until};

async fn ask(op: &Operator, path: &str) -> (u16, String) {
    let resp = reqwest::get(format!("{}{path}", op.addr)).await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

#[tokio::test]
async fn checkz_makes_an_etcd_round_trip_and_names_etcd_when_it_is_down() {
    let plane = with_crd();
    let ns = plane.namespace("checkz");
    let mut etcd = EtcdServer::start().await;
    let op = Operator::start_with(plane, &ns, &etcd.endpoint, &[]).await;
    wait_until(Duration::from_secs(15), || async {
        ask(&op, "/checkz").await.0 == 200
    })
    .await
    .unwrap_or_else(|e| panic!("/checkz never 200 ({e}):\n{}", op.log()));
    let (_, body) = ask(&op, "/checkz").await;
    assert!(body.contains("round trip"), "{body}");
    assert_eq!(
        etcd.count("/podlock/v1/check/").await,
        0,
        "the round trip leaves no key"
    );

    etcd.stop();
    let (status, body) = ask(&op, "/checkz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("etcd: "), "the cause is named: {body}");
    eprintln!("/checkz with etcd stopped: {status} {body}");
    assert_eq!(
        ask(&op, "/readyz").await.0,
        200,
        "readiness does not hang on etcd"
    );
}

/// With credentials etcd accepts but that may not write (a user whose role grants nothing), the
/// round trip fails naming etcd's refusal, not an outage.
#[tokio::test]
async fn checkz_names_etcd_refusing_the_operators_credentials() {
    let plane = with_crd();
    let ns = plane.namespace("checkz-refused");
    let etcd = EtcdServer::start().await;
    let mut admin = etcd.client().await;
    admin.role_add("nothing").await.unwrap();
    admin.user_add("no-rights", "pw", None).await.unwrap();
    admin.user_grant_role("no-rights", "nothing").await.unwrap();
    etcd.enable_auth("root-pw").await;
    let flags = ["--etcd-user", "no-rights", "--etcd-password", "pw"];
    let op = Operator::start_with(plane, &ns, &etcd.endpoint, &flags).await;
    let (status, body) = ask(&op, "/checkz").await;
    eprintln!("/checkz with credentials that may not write: {status} {body}");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("etcd refused access"), "the cause is named: {body}");
    assert!(
        body.contains("permission denied"),
        "etcd's answer is passed on: {body}"
    );
}
