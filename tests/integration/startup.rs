//! A sidecar starts without etcd: it listens first, its probe passes, its API answers 503 with
//! the reason until etcd answers, and then it serves locks. An etcd outage (or a leader
//! election) at a pod's start must not keep the pod from starting or take it out of its
//! Services.

use serde_json::json;
use std::process::Command;
use std::time::Duration;

use crate::common::{EtcdServer, Sidecar, declare, podlock_bin, wait_until};

/// `podlock probe` against the sidecar at `addr` (`http://HOST:PORT`): whether it passes.
fn probe(addr: &str) -> bool {
    Command::new(podlock_bin())
        .args(["probe", "--addr", addr.trim_start_matches("http://")])
        .env_remove("PODLOCK_LISTEN")
        .status()
        .unwrap()
        .success()
}

#[tokio::test]
async fn a_sidecar_serves_before_etcd_answers_and_locks_once_it_does() {
    let mut etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["job"]);
    etcd.enable_auth("secret").await;
    etcd.stop();

    let auth = ["--etcd-user", "root", "--etcd-password", "secret"];
    let sidecar = Sidecar::spawn(&etcd.endpoint, "p", &auth).await;
    assert!(probe(&sidecar.addr), "the probe passes while etcd is down");
    let (status, body) = sidecar.post("job", "acquire", json!({"waitSeconds": 0})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("backend_unavailable")),
        "{body}"
    );
    assert!(body["message"].as_str().unwrap().contains("etcd"), "{body}");
    assert_eq!(
        sidecar.get("/readyz").await.0,
        503,
        "/readyz still says etcd is away"
    );
    assert!(
        sidecar.log().contains("cannot reach etcd yet"),
        "the log names the cause:\n{}",
        sidecar.log()
    );

    etcd.resume().await;
    wait_until(Duration::from_secs(10), || async {
        sidecar.post("job", "acquire", json!({"waitSeconds": 0})).await.0 == 200
    })
    .await
    .unwrap_or_else(|e| panic!("never granted once etcd was back ({e}):\n{}", sidecar.log()));
    assert_eq!(sidecar.get("/readyz").await.0, 200);
    assert!(!probe("http://127.0.0.1:1"), "a probe of nothing fails");
}
