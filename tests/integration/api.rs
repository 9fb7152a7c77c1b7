//! The HTTP API: answers, errors and metrics.

use serde_json::{Value, json};

use crate::common::{EtcdServer, Sidecar, declare};

#[tokio::test]
async fn try_once_names_the_holder_and_reacquire_is_idempotent() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["job"]);
    let a = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let b = Sidecar::start(&etcd.endpoint, "pod-b", &[]).await;
    let (status, grant) = a.post("job", "acquire", json!({})).await;
    assert_eq!(status, 200, "{grant}");
    for field in [
        "lock",
        "namespace",
        "holderId",
        "fencingToken",
        "leaseId",
        "ttlSeconds",
        "acquiredAt",
    ] {
        assert!(!grant[field].is_null(), "grant lacks {field}: {grant}");
    }
    assert_eq!(
        (grant["holderId"].as_str(), grant["ttlSeconds"].as_u64()),
        (Some("pod-a"), Some(15))
    );

    let (status, again) = a.post("job", "acquire", json!({})).await;
    assert_eq!(
        (status, &again["fencingToken"]),
        (200, &grant["fencingToken"]),
        "re-acquire: {again}"
    );

    let (status, err) = b.post("job", "acquire", json!({"waitSeconds": 0})).await;
    assert_eq!((status, err["error"].as_str()), (409, Some("lock_held")), "{err}");
    assert_eq!(err["holders"][0]["pod"], "pod-a");
    assert_eq!(err["holders"][0]["fencingToken"], grant["fencingToken"]);
    assert!(err["message"].as_str().unwrap().contains("pod-a"));

    let (status, info) = b.get("/v1/locks/job").await;
    assert_eq!(status, 200);
    assert_eq!(
        (info["held"].as_bool(), info["waiters"].as_u64()),
        (Some(true), Some(0)),
        "{info}"
    );
    assert_eq!(
        (info["maxHolders"].as_u64(), info["ttlSeconds"].as_u64()),
        (Some(1), Some(15))
    );
    let (_, mine) = a.get("/v1/locks").await;
    assert_eq!(mine["locks"][0]["state"], "held", "{mine}");
    let (_, theirs) = b.get("/v1/locks").await;
    assert_eq!(
        theirs["locks"],
        json!([]),
        "a failed try leaves nothing: {theirs}"
    );

    assert_eq!(
        b.post("job", "release", json!({})).await.0,
        409,
        "b is not the holder"
    );
    let (status, body) = b.post("job", "release", json!({})).await;
    assert_eq!((status, body["error"].as_str()), (409, Some("not_holder")));
    assert_eq!(
        a.post("job", "release", json!({})).await,
        (200, json!({"released": true}))
    );
    let token = b.must_acquire("job", json!({"waitSeconds": 0})).await;
    assert!(token > grant["fencingToken"].as_i64().unwrap());
}

#[tokio::test]
async fn undeclared_locks_are_404_unless_standalone() {
    let etcd = EtcdServer::start().await;
    let strict = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let (status, err) = strict.post("nowhere", "acquire", json!({})).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (404, Some("lock_not_found")),
        "{err}"
    );
    assert!(err["message"].as_str().unwrap().contains("podlock declare"));
    assert_eq!(strict.get("/v1/locks/nowhere").await.0, 404);

    let free = Sidecar::start(&etcd.endpoint, "pod-b", &["--standalone"]).await;
    let (status, grant) = free.post("nowhere", "acquire", json!({})).await;
    assert_eq!((status, grant["ttlSeconds"].as_u64()), (200, Some(15)), "{grant}");

    // Declaring it later applies its settings to new holds; deleting it makes it 404 again. The
    // holder whose hold the deletion ended is told 410 if its sidecar has not seen the loss yet.
    declare(&etcd.endpoint, &["later", "--ttl-seconds", "7"]);
    assert_eq!(
        strict.post("later", "acquire", json!({})).await.1["ttlSeconds"],
        7
    );
    declare(&etcd.endpoint, &["later", "--delete"]);
    let (status, body) = strict.post("later", "acquire", json!({})).await;
    assert!(matches!(status, 404 | 410), "{status} {body}");
    assert_eq!(strict.post("later", "acquire", json!({})).await.0, 404);
}

/// Sends a raw request and returns status and JSON body.
async fn raw(method: &str, url: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .request(method.parse().unwrap(), url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{url}: body is not JSON: {text:?}"));
    (status, body)
}

/// One bad request and what must come back.
type Case = (&'static str, String, Vec<u8>, u16, &'static str, &'static str);

#[tokio::test]
async fn bad_input_gets_a_json_4xx_that_says_what_to_fix() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["ok"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let base = format!("{}/v1/locks", s.addr);
    // (method, url, body, status, error code, a hint the message must contain)
    let cases: Vec<Case> = vec![
        (
            "POST",
            format!("{base}/Not_A_Name/acquire"),
            vec![],
            400,
            "invalid_request",
            "valid Kubernetes name",
        ),
        (
            "POST",
            format!("{base}/{}/acquire", "a".repeat(254)),
            vec![],
            400,
            "invalid_request",
            "253",
        ),
        (
            "POST",
            format!("{base}/ok/acquire"),
            b"{not json".to_vec(),
            400,
            "invalid_request",
            "JSON",
        ),
        (
            "POST",
            format!("{base}/ok/acquire"),
            b"[1,2]".to_vec(),
            400,
            "invalid_request",
            "JSON object",
        ),
        (
            "POST",
            format!("{base}/ok/acquire"),
            br#"{"waitSeconds":"soon"}"#.to_vec(),
            400,
            "invalid_request",
            "invalid type",
        ),
        (
            "POST",
            format!("{base}/ok/acquire"),
            br#"{"waitSeconds":-1}"#.to_vec(),
            400,
            "invalid_request",
            "waitSeconds",
        ),
        (
            "POST",
            format!("{base}/ok/acquire"),
            br#"{"ttlSeconds":1}"#.to_vec(),
            400,
            "invalid_request",
            "ttlSeconds",
        ),
        (
            "POST",
            format!("{base}/ok/acquire"),
            br#"{"ttlSeconds":3601}"#.to_vec(),
            400,
            "invalid_request",
            "3600",
        ),
        (
            "POST",
            format!("{base}/ok/acquire"),
            br#"{"heartbeatTimeoutSeconds":4000}"#.to_vec(),
            400,
            "invalid_request",
            "heartbeatTimeoutSeconds",
        ),
        (
            "POST",
            format!("{base}/ok/acquire"),
            br#"{"holderId":"a/b"}"#.to_vec(),
            400,
            "invalid_request",
            "holderId",
        ),
        (
            "POST",
            format!("{base}/ok/acquire"),
            br#"{"wait":1}"#.to_vec(),
            400,
            "invalid_request",
            "unknown field",
        ),
        (
            "POST",
            format!("{base}/ok/acquire?waitSeconds=abc"),
            vec![],
            400,
            "invalid_request",
            "query",
        ),
        (
            "POST",
            format!("{base}/ok/acquire"),
            vec![b' '; 1024 * 1024 + 1],
            413,
            "payload_too_large",
            "1 MiB",
        ),
        (
            "POST",
            format!("{base}/ok/release"),
            br#"{"holderId":7}"#.to_vec(),
            400,
            "invalid_request",
            "holderId",
        ),
        (
            "GET",
            format!("{base}/ok/acquire"),
            vec![],
            405,
            "method_not_allowed",
            "POST",
        ),
        (
            "GET",
            format!("{}/v2/nothing", s.addr),
            vec![],
            404,
            "not_found",
            "/v2/nothing",
        ),
    ];
    for (method, url, body, status, code, hint) in cases {
        let (got, err) = raw(method, &url, body).await;
        assert_eq!(
            (got, err["error"].as_str()),
            (status, Some(code)),
            "{method} {url}: {err}"
        );
        let message = err["message"].as_str().unwrap();
        assert!(
            message.contains(hint),
            "{method} {url}: message {message:?} lacks {hint:?}"
        );
    }
    // Nothing was queued by any of it.
    assert_eq!(etcd.count("/podlock/v1/queue/").await, 0);
    // Query-string options work like body options.
    let (status, grant) = raw(
        "POST",
        &format!("{base}/ok/acquire?holderId=q1&ttlSeconds=9"),
        vec![],
    )
    .await;
    assert_eq!(
        (status, grant["holderId"].as_str(), grant["ttlSeconds"].as_u64()),
        (200, Some("q1"), Some(9))
    );
}

#[tokio::test]
async fn metrics_and_health_endpoints() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["met"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    s.must_acquire("met", json!({})).await;
    assert_eq!(
        s.post("met", "acquire", json!({"holderId": "other", "waitSeconds": 0}))
            .await
            .0,
        409
    );
    assert_eq!(s.get("/healthz").await.0, 200);
    assert_eq!(s.get("/readyz").await.0, 200);
    let (_, text) = s.get("/metrics").await;
    let text = text.as_str().unwrap();
    for name in [
        "podlock_acquire_total{lock=\"met\",result=\"acquired\"} 1",
        "podlock_acquire_total{lock=\"met\",result=\"lock_held\"} 1",
        "podlock_acquire_wait_seconds_count{lock=\"met\"} 1",
        "podlock_held_locks 1",
        "podlock_locks_lost_total{lock=\"met\",reason=\"lease_expired\"} 0",
        "podlock_keepalive_failures_total 0",
        "podlock_etcd_requests_total",
    ] {
        assert!(text.contains(name), "metrics lack {name}:\n{text}");
    }
}

#[tokio::test]
async fn corrupt_settings_are_named_not_called_an_outage() {
    let etcd = EtcdServer::start().await;
    let key = "/podlock/v1/config/default/bad";
    etcd.client().await.put(key, "not json", None).await.unwrap();
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let (status, err) = s.post("bad", "acquire", json!({})).await;
    assert_eq!(
        (status, err["error"].as_str()),
        (500, Some("corrupt_data")),
        "{err}"
    );
    assert!(err["message"].as_str().unwrap().contains(key), "{err}");
    assert_eq!(s.get("/v1/locks/bad").await.0, 500);
}
