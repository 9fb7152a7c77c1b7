//! Observing a lock without holding it (`GET /v1/locks/{name}/watch`, `podlock observe`): the
//! holders now, then the holders at each change of them, until the lock is deleted; on a real
//! etcd and real sidecars.

use serde_json::{Value, json};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common::events::Events;
use crate::common::members::elected;
use crate::common::{EtcdServer, Sidecar, declare, podlock_bin, wait_until};

/// How long a change may take to be reported: a watch event and a read, on a loaded machine.
const EVENT: Duration = Duration::from_secs(3);

/// Opens the watch of `lock` on `s`.
async fn watch(s: &Sidecar, lock: &str) -> Events {
    Events::open_at(s, &format!("/v1/locks/{lock}/watch")).await
}

/// The next event, within `limit`; panics unless it is a `holders` event.
async fn holders_within(w: &mut Events, limit: Duration) -> Value {
    let (name, data) = w.next_named(limit).await;
    assert_eq!(name, "holders", "{data}");
    data
}

/// (holder id, token, mode) of each holder an answer or an event names, in its order.
fn named(data: &Value) -> Vec<(String, i64, String)> {
    let holders = data["holders"].as_array().expect("holders");
    (holders.iter())
        .map(|h| {
            let id = h["holderId"].as_str().unwrap().to_string();
            (
                id,
                h["fencingToken"].as_i64().unwrap(),
                h["mode"].as_str().unwrap().into(),
            )
        })
        .collect()
}

fn exclusive(id: &str, token: i64) -> (String, i64, String) {
    (id.into(), token, "exclusive".into())
}

/// Acquires `lock` on `s` in the background (waiting up to 20 s); the task returns the token.
fn later(s: &Arc<Sidecar>, lock: &str, holder: &str) -> tokio::task::JoinHandle<i64> {
    let (s, lock) = (s.clone(), lock.to_string());
    let body = json!({"holderId": holder, "waitSeconds": 20});
    tokio::spawn(async move { s.must_acquire(&lock, body).await })
}

async fn release(s: &Sidecar, lock: &str, holder: &str) {
    let (status, body) = s.post(lock, "release", json!({"holderId": holder})).await;
    assert_eq!(status, 200, "release {holder}: {body}");
}

#[tokio::test]
async fn the_first_event_names_the_holders_a_handoff_the_next_and_a_waiter_nothing() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["obs"]);
    let a = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let b = Arc::new(Sidecar::start(&etcd.endpoint, "pod-b", &[]).await);
    let first = a.must_acquire("obs", json!({"holderId": "first"})).await;

    // pod-b holds nothing and sees pod-a's hold at once, as the other views name it.
    let mut w = watch(&b, "obs").await;
    let now = holders_within(&mut w, EVENT).await;
    assert_eq!(named(&now), [exclusive("first", first)], "{now}");
    assert_eq!(
        (now["lock"].as_str(), now["namespace"].as_str()),
        (Some("obs"), Some("default"))
    );
    assert_eq!(now["holders"][0]["pod"], "pod-a", "{now}");
    assert!(now["revision"].as_i64().unwrap() >= first, "{now}");
    let fenced = b.get(&format!("/v1/locks/obs/fence?token={first}")).await.1;
    assert_eq!(named(&fenced), named(&now), "the fence check: {fenced}");
    assert_eq!(named(&b.get("/v1/locks/obs").await.1), named(&now), "GET");

    // A waiter queues: the holders are the same, so nothing is sent.
    let next = later(&b, "obs", "second");
    wait_until(Duration::from_secs(5), || async {
        b.get("/v1/locks/obs").await.1["waiters"] == 1
    })
    .await
    .expect("the waiter queued");
    w.none_within(Duration::from_millis(800)).await;

    // The release hands the lock on: the next event names the new holder and its token.
    release(&a, "obs", "first").await;
    let second = next.await.unwrap();
    assert!(second > first);
    let handed = holders_within(&mut w, EVENT).await;
    assert_eq!(named(&handed), [exclusive("second", second)], "{handed}");
    assert!(handed["revision"].as_i64().unwrap() > now["revision"].as_i64().unwrap());
    release(&b, "obs", "second").await;
    let free = holders_within(&mut w, EVENT).await;
    assert_eq!(named(&free), [], "{free}");
}

#[tokio::test]
async fn a_shared_holder_joining_is_news_and_so_is_its_leaving() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["rw"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let shared = |id: &str| json!({"holderId": id, "mode": "shared", "waitSeconds": 0});
    let r1 = s.must_acquire("rw", shared("r1")).await;
    let mut w = watch(&s, "rw").await;
    assert_eq!(named(&holders_within(&mut w, EVENT).await).len(), 1);
    let r2 = s.must_acquire("rw", shared("r2")).await;
    let both = holders_within(&mut w, EVENT).await;
    let mode = |id: &str, token| (String::from(id), token, String::from("shared"));
    assert_eq!(named(&both), [mode("r1", r1), mode("r2", r2)], "{both}");
    release(&s, "rw", "r1").await;
    assert_eq!(named(&holders_within(&mut w, EVENT).await), [mode("r2", r2)]);
}

/// `podlock observe` against `s`, its stdout read line by line.
fn observe_cmd(s: &Sidecar, lock: &str, extra: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(podlock_bin())
        .args(["observe", lock, "--addr", &s.addr])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The next line `child` prints, within `EVENT`.
async fn line(out: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) -> String {
    let next = tokio::time::timeout(EVENT, out.next_line()).await;
    next.expect("a line in time")
        .unwrap()
        .expect("a line before the end")
}

#[tokio::test]
async fn deleting_the_lock_sends_deleted_ends_the_stream_and_podlock_observe_exits_0() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["gone"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let token = s.must_acquire("gone", json!({"holderId": "h"})).await;
    let mut w = watch(&s, "gone").await;
    holders_within(&mut w, EVENT).await;
    let mut person = observe_cmd(&s, "gone", &[]);
    let mut script = observe_cmd(&s, "gone", &["--json"]);
    let mut said = BufReader::new(person.stdout.take().unwrap()).lines();
    let mut printed = BufReader::new(script.stdout.take().unwrap()).lines();
    let held = line(&mut said).await;
    assert!(
        held.contains(&format!("held by h (pod pod-a, token {token}, exclusive)")),
        "{held}"
    );
    let data: Value = serde_json::from_str(&line(&mut printed).await).unwrap();
    assert_eq!(named(&data), [exclusive("h", token)], "{data}");

    declare(&etcd.endpoint, &["gone", "--delete"]);
    let (name, data) = w.next_named(EVENT).await;
    assert_eq!(
        (name.as_str(), data["lock"].as_str()),
        ("deleted", Some("gone")),
        "{data}"
    );
    assert!(
        data.get("holders").is_none() && data["revision"].as_i64().is_some(),
        "{data}"
    );
    assert!(w.ends_within(EVENT).await, "the stream ends after deleted");

    assert!(line(&mut said).await.ends_with("lock gone deleted"));
    let data: Value = serde_json::from_str(&line(&mut printed).await).unwrap();
    assert_eq!(data["lock"], "gone", "{data}");
    for mut child in [person, script] {
        let status = tokio::time::timeout(EVENT, child.wait()).await.unwrap().unwrap();
        assert_eq!(
            status.code(),
            Some(0),
            "podlock observe exits 0 once the lock is deleted"
        );
    }
}

#[tokio::test]
async fn a_bad_keep_alive_is_a_400_naming_it_and_an_undeclared_lock_a_404() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["there"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    for (query, says) in [
        (
            "keepAliveSeconds=0",
            "keepAliveSeconds must be between 1 and 300, got 0",
        ),
        ("keepAliveSeconds=301", "got 301"),
        ("keepAliveSeconds=abc", "keepAliveSeconds must be a whole number"),
        ("keepAlive=5", "keepAlive"),
    ] {
        let (status, body) = s.get(&format!("/v1/locks/there/watch?{query}")).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid_request")),
            "{body}"
        );
        assert!(
            body["message"].as_str().unwrap().contains(says),
            "{query}: {body}"
        );
    }
    let (status, body) = s.get("/v1/locks/Bad_Name/watch").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );
    let (status, body) = s.get("/v1/locks/nope/watch").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("lock_not_found")),
        "{body}"
    );
    assert_eq!(s.get("/v1/locks/nope").await.0, 404, "as GET answers");

    let out = observe_cmd(&s, "nope", &[]).wait_with_output().await.unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("404") && said.contains("lock_not_found"), "{said}");
}

#[tokio::test]
async fn an_idle_watch_gets_keep_alive_comments() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["idle"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let url = format!("{}/v1/locks/idle/watch?keepAliveSeconds=1", s.addr);
    let mut resp = reqwest::get(url).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut text = String::new();
    let until = tokio::time::Instant::now() + Duration::from_millis(2500);
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(until, resp.chunk()).await {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.starts_with("event: holders\n"), "{text}");
    let comments = text.lines().filter(|l| l.starts_with(':')).count();
    assert!(comments >= 2, "{comments} comment lines in 2.5 s: {text}");
}

/// The observer's only etcd member is killed: its watch breaks. The lock changes hands while
/// it is away; when it is back, the observer reads again and reports the new holder.
#[tokio::test]
async fn a_change_made_while_the_watch_was_broken_is_reported_once_etcd_is_back() {
    let Split {
        mut etcd,
        away,
        holder,
        observer,
        mut w,
        ..
    } = observed_from_one_member("moved").await;

    etcd[away].stop();
    release(&holder, "moved", "a").await;
    let second = holder.must_acquire("moved", json!({"holderId": "b"})).await;
    w.none_within(Duration::from_millis(500)).await;
    etcd[away].resume().await;
    // Its reads and watch retry under the rewatch policy (up to 5 s apart), each read with
    // etcd's 5 s budget.
    let back = holders_within(&mut w, Duration::from_secs(20)).await;
    assert_eq!(named(&back), [exclusive("b", second)], "{back}");
    assert!(
        observer.log().contains("observing a lock: etcd failed"),
        "{}",
        observer.log()
    );
}

/// Issue #54, F10: the observer's only etcd member is away while the lock is deleted and
/// declared again. Back, the observer read the lock declared and reported its (empty) holders,
/// never `deleted`: the deletion was missed. Fails so on the code before the fix with
/// `holders` where `deleted` was due.
#[tokio::test]
async fn a_lock_deleted_and_declared_again_while_the_watch_was_broken_is_reported_deleted() {
    let Split {
        mut etcd,
        leader,
        away,
        holder: _holder,
        observer: _observer,
        mut w,
        ..
    } = observed_from_one_member("again").await;

    etcd[away].stop();
    declare(&etcd[leader].endpoint, &["again", "--delete"]);
    declare(&etcd[leader].endpoint, &["again"]);
    w.none_within(Duration::from_millis(500)).await;
    etcd[away].resume().await;
    let (name, data) = w.next_named(Duration::from_secs(20)).await;
    assert_eq!(name, "deleted", "{name} where deleted was due: {data}");
}

/// A lock held by `a` through a sidecar on two of three etcd members, and watched (its first
/// `holders` event read) through a sidecar on the third, `away`, which the test may stop.
struct Split {
    etcd: Vec<EtcdServer>,
    leader: usize,
    away: usize,
    holder: Sidecar,
    observer: Sidecar,
    w: Events,
}

async fn observed_from_one_member(lock: &str) -> Split {
    let etcd = EtcdServer::cluster(3).await;
    let leader = elected(&etcd).await;
    let away = (leader + 1) % etcd.len();
    let others: Vec<&str> = (0..etcd.len())
        .filter(|&i| i != away)
        .map(|i| etcd[i].endpoint.as_str())
        .collect();
    declare(&etcd[leader].endpoint, &[lock]);
    let holder = Sidecar::start(&others.join(","), "pod-h", &[]).await;
    let observer = Sidecar::start(&etcd[away].endpoint, "pod-o", &[]).await;
    let first = holder.must_acquire(lock, json!({"holderId": "a"})).await;
    let mut w = watch(&observer, lock).await;
    assert_eq!(
        named(&holders_within(&mut w, EVENT).await),
        [exclusive("a", first)]
    );
    Split {
        etcd,
        leader,
        away,
        holder,
        observer,
        w,
    }
}

/// etcd's count of watchers (its `etcd_debugging_mvcc_watcher_total` gauge).
async fn watchers(etcd: &EtcdServer) -> f64 {
    let text = reqwest::get(format!("{}/metrics", etcd.endpoint))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("etcd_debugging_mvcc_watcher_total "))
        .expect("etcd's watcher gauge");
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Issue #54, F9: a client opens a watch (keep-alive comments every 300 s) with a second
/// request pipelined behind it, then closes its connection. hyper, which reads no further
/// while a request of the connection is unread, learned of the close only at the next write,
/// and the watch's etcd watch lived until then. Fails so on the code before the fix with `the
/// etcd watch outlived its client: 2`.
#[tokio::test]
async fn a_watch_whose_client_left_ends_its_etcd_watch_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["left"]);
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let before = watchers(&etcd).await;
    let mut conn = tokio::net::TcpStream::connect(s.addr.trim_start_matches("http://"))
        .await
        .unwrap();
    let requests = "GET /v1/locks/left/watch?keepAliveSeconds=300 HTTP/1.1\r\nHost: podlock\r\n\r\n\
                    GET /healthz HTTP/1.1\r\nHost: podlock\r\n\r\n";
    conn.write_all(requests.as_bytes()).await.unwrap();
    let mut seen = String::new();
    while !seen.contains("event: holders") {
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(EVENT, conn.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "the watch ended: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let watching = wait_until(EVENT, || async { watchers(&etcd).await > before }).await;
    watching.expect("the watch's etcd watch was made");
    drop(conn);
    let gone = wait_until(Duration::from_secs(3), || async {
        watchers(&etcd).await <= before
    })
    .await;
    assert!(
        gone.is_ok(),
        "the etcd watch outlived its client: {}",
        watchers(&etcd).await
    );
}
