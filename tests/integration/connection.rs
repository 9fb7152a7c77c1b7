//! Holds bound to a connection (`POST /v1/locks/{name}/hold`): the grant is the stream's first
//! event, and the hold ends the moment its client goes, however it goes.

use serde_json::{Value, json};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

use crate::common::{EtcdServer, Sidecar, declare};

/// A hold's stream, read as text.
struct HoldStream {
    resp: reqwest::Response,
    text: String,
}

impl HoldStream {
    /// Opens `POST .../hold` on `s` with query `query`; panics unless it is granted.
    async fn open(s: &Sidecar, lock: &str, query: &str) -> (Self, i64) {
        let url = format!("{}/v1/locks/{lock}/hold{query}", s.addr);
        let resp = reqwest::Client::new().post(url).send().await.unwrap();
        assert_eq!(resp.status(), 200, "hold {lock}: {:?}", resp.text().await);
        let mut stream = HoldStream {
            resp,
            text: String::new(),
        };
        let grant = stream.event("acquired").await;
        (stream, grant["fencingToken"].as_i64().unwrap())
    }

    /// Reads until event `kind` has arrived; returns its data.
    async fn event(&mut self, kind: &str) -> Value {
        let head = format!("event: {kind}\ndata: ");
        loop {
            if let Some(at) = self.text.find(&head) {
                let data = &self.text[at + head.len()..];
                if let Some(end) = data.find('\n') {
                    return serde_json::from_str(&data[..end]).unwrap();
                }
            }
            match self.resp.chunk().await.unwrap() {
                Some(chunk) => self.text.push_str(&String::from_utf8_lossy(&chunk)),
                None => panic!("the stream ended without {kind}: {}", self.text),
            }
        }
    }
}

/// Starts `b` waiting for `lock`; the task returns the grant's token and when it came.
fn waiter(b: &std::sync::Arc<Sidecar>, lock: &str) -> tokio::task::JoinHandle<(i64, Instant)> {
    let (b, lock) = (b.clone(), lock.to_string());
    tokio::spawn(async move {
        let token = b.must_acquire(&lock, json!({"waitSeconds": 20})).await;
        (token, Instant::now())
    })
}

/// Two sidecars on a fresh etcd with `lock` declared.
async fn two_pods(lock: &str) -> (EtcdServer, Sidecar, std::sync::Arc<Sidecar>) {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &[lock, "--ttl-seconds", "30"]);
    let a = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let b = Sidecar::start(&etcd.endpoint, "pod-b", &[]).await;
    (etcd, a, std::sync::Arc::new(b))
}

/// Waits until `b`'s acquire of `lock` queues behind the holder.
async fn queued(b: &Sidecar, lock: &str) {
    crate::common::wait_until(Duration::from_secs(5), || async {
        b.get("/v1/locks").await.1["locks"]
            .as_array()
            .is_some_and(|l| l.iter().any(|e| e["lock"] == lock && e["state"] == "waiting"))
    })
    .await
    .expect("the waiter queued");
}

#[tokio::test]
async fn a_client_that_disconnects_hands_the_lock_on_at_once() {
    let (_etcd, a, b) = two_pods("conn").await;
    let (stream, token) = HoldStream::open(&a, "conn", "").await;
    let next = waiter(&b, "conn");
    queued(&b, "conn").await;
    let gone = Instant::now();
    drop(stream);
    let (next_token, at) = next.await.unwrap();
    let took = at - gone;
    eprintln!("client disconnected: the next waiter was granted {took:?} later");
    assert!(took < Duration::from_secs(1), "handoff took {took:?} (TTL 30 s)");
    assert!(next_token > token);
    assert_eq!(a.get("/v1/locks/conn").await.1["held"], true); // by pod-b now
    assert!(a.get("/v1/locks").await.1["locks"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn kill_9_of_a_curl_holder_hands_the_lock_on_at_once() {
    let (_etcd, a, b) = two_pods("curl").await;
    let mut curl = tokio::process::Command::new("curl")
        .args(["-sN", "-XPOST", &format!("{}/v1/locks/curl/hold", a.addr)])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("curl");
    let mut out = curl.stdout.take().unwrap();
    let mut seen = String::new();
    while !seen.contains("event: acquired") {
        let mut buf = [0u8; 512];
        let n = out.read(&mut buf).await.unwrap();
        assert!(n > 0, "curl ended without a grant: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let next = waiter(&b, "curl");
    queued(&b, "curl").await;
    let killed = Instant::now();
    curl.start_kill().unwrap(); // SIGKILL
    let (_, at) = next.await.unwrap();
    let took = at - killed;
    eprintln!("curl -N holder killed (kill -9): the next waiter was granted {took:?} later");
    assert!(took < Duration::from_secs(1), "handoff took {took:?} (TTL 30 s)");
}

#[tokio::test]
async fn the_sidecars_sigterm_ends_the_stream_with_lost() {
    let (_etcd, mut a, _b) = two_pods("term").await;
    let (mut stream, token) = HoldStream::open(&a, "term", "").await;
    a.terminate();
    let lost = stream.event("lost").await;
    assert_eq!(lost["fencingToken"], token);
    assert!(
        stream.resp.chunk().await.map_or(true, |c| c.is_none()),
        "the stream ended"
    );
}

#[tokio::test]
async fn idle_streams_get_keep_alive_comments_and_bad_options_a_clear_400() {
    let (_etcd, a, b) = two_pods("idle").await;
    let (mut stream, _) = HoldStream::open(&a, "idle", "?keepAliveSeconds=1").await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    while let Ok(Ok(Some(chunk))) =
        tokio::time::timeout(Duration::from_millis(100), stream.resp.chunk()).await
    {
        stream.text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let comments = stream.text.lines().filter(|l| l.starts_with(':')).count();
    assert!(
        comments >= 2,
        "{comments} comment lines in 2.5 s: {}",
        stream.text
    );

    // The lock is held: a hold that may not wait is refused like an acquire, as JSON.
    let (status, body) = b.post("idle", "hold", json!({"waitSeconds": 0})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("lock_held")),
        "{body}"
    );
    for (verb, opts, field) in [
        ("acquire", json!({"keepAliveSeconds": 5}), "keepAliveSeconds"),
        ("hold", json!({"keepAliveSeconds": 0}), "keepAliveSeconds"),
        ("hold", json!({"waitSeconds": -1}), "waitSeconds"),
    ] {
        let (status, body) = b.post("idle", verb, opts.clone()).await;
        assert_eq!(status, 400, "{verb} {opts}: {body}");
        assert!(body["message"].as_str().unwrap().contains(field), "{body}");
    }
}

/// POSTs `verb`; returns its status and, unless it opened a hold's stream (200 to `hold`, which
/// stays open), its JSON body.
async fn answer(s: &Sidecar, lock: &str, verb: &str, body: Value) -> (u16, Value) {
    let url = format!("{}/v1/locks/{lock}/{verb}", s.addr);
    let resp = reqwest::Client::new().post(url).json(&body).send().await.unwrap();
    let status = resp.status().as_u16();
    if status == 200 && verb == "hold" {
        return (status, Value::Null);
    }
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Finding 1 of the safety review: two `/hold` streams of one pod without a holderId (two
/// containers, the default holder id = the pod's name) were both told `acquired` with one
/// token. Each connection is now a holder of its own and queues like any other.
#[tokio::test]
async fn two_holds_of_one_pod_without_a_holder_id_are_two_holders() {
    let (_etcd, a, _b) = two_pods("twice").await;
    let (first, token) = HoldStream::open(&a, "twice", "").await;
    let (status, body) = answer(&a, "twice", "hold", json!({"waitSeconds": 0})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("lock_held")),
        "a second connection of the same pod shared the first one's hold: {body}"
    );
    drop(first);
    let (_second, next) = HoldStream::open(&a, "twice", "?waitSeconds=5").await;
    assert!(next > token);
    let (_, info) = a.get("/v1/locks/twice").await;
    assert_eq!(info["holders"].as_array().unwrap().len(), 1, "{info}");
    assert_ne!(
        info["holders"][0]["holderId"], "pod-a",
        "a holder id of its own: {info}"
    );
}

/// The contract's "Holder identity": a holder id that a connection holds is that connection's;
/// another `/hold` or an acquire naming it is refused, and the first hold lives on.
#[tokio::test]
async fn a_holder_id_held_by_a_connection_is_refused_to_every_other_request() {
    let (etcd, a, _b) = two_pods("owned").await;
    declare(&etcd.endpoint, &["owned-too"]);
    let (mut stream, token) = HoldStream::open(&a, "owned", "?holderId=job").await;
    for verb in ["hold", "acquire"] {
        let (status, body) = answer(&a, "owned", verb, json!({"holderId": "job", "waitSeconds": 0})).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (409, Some("holder_in_use")),
            "{verb}: {body}"
        );
    }
    // A request-bound hold is not taken over by a connection either.
    a.must_acquire("owned-too", json!({"holderId": "app"})).await;
    let (status, body) = answer(&a, "owned-too", "hold", json!({"holderId": "app"})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("holder_in_use")),
        "{body}"
    );
    // The refusals ended nothing: the first stream still holds.
    let (_, info) = a.get("/v1/locks/owned").await;
    assert_eq!(info["fencingToken"], token, "{info}");
    let (status, _) = a.post("owned", "release", json!({"holderId": "job"})).await;
    assert_eq!(status, 200);
    assert_eq!(stream.event("released").await["fencingToken"], token);
}
