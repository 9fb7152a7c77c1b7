//! A settings change applies to waiters already queued: lowering `maxHolders` never admits
//! more than the new limit, raising it admits the waiters in their order, and fencing tokens
//! rise strictly in grant order under any change.

use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;

use crate::common::held::HeldRequests;
use crate::common::{EtcdServer, Sidecar, declare, wait_until};

/// Grants in the order they were answered: (holder, token).
type Grants = Arc<Mutex<Vec<(String, i64)>>>;

/// Starts an acquire of `lock` by `holder` that records its grant in `grants`.
fn acquire_later(s: &Arc<Sidecar>, lock: &str, holder: &str, grants: &Grants) -> JoinHandle<i64> {
    let (s, lock, holder, grants) = (s.clone(), lock.to_string(), holder.to_string(), grants.clone());
    tokio::spawn(async move {
        let token = s
            .must_acquire(&lock, json!({"holderId": holder, "waitSeconds": 30}))
            .await;
        grants.lock().unwrap().push((holder, token));
        token
    })
}

async fn waiters(s: &Sidecar, lock: &str, n: u64) {
    wait_until(Duration::from_secs(5), || async {
        s.get(&format!("/v1/locks/{lock}")).await.1["waiters"] == n
    })
    .await
    .unwrap_or_else(|e| panic!("{n} waiters on {lock}: {e}"));
}

async fn release(s: &Sidecar, lock: &str, holder: &str) {
    let (status, body) = s.post(lock, "release", json!({"holderId": holder})).await;
    assert_eq!(status, 200, "release {holder}: {body}");
}

#[tokio::test]
async fn lowering_max_holders_never_admits_a_waiter_beside_the_holders_left() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["low", "--max-holders", "2"]);
    let s = Arc::new(Sidecar::start(&etcd.endpoint, "pod-a", &[]).await);
    let grants = Grants::default();
    s.must_acquire("low", json!({"holderId": "h1"})).await;
    s.must_acquire("low", json!({"holderId": "h2"})).await;
    let w = acquire_later(&s, "low", "w", &grants);
    waiters(&s, "low", 1).await;
    declare(&etcd.endpoint, &["low", "--max-holders", "1"]);
    release(&s, "low", "h1").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        grants.lock().unwrap().is_empty(),
        "w was granted beside h2 though maxHolders is now 1"
    );
    release(&s, "low", "h2").await;
    tokio::time::timeout(Duration::from_secs(2), w)
        .await
        .expect("w is granted once h2 leaves")
        .unwrap();
}

#[tokio::test]
async fn raising_max_holders_admits_waiters_in_order_with_rising_tokens() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["up"]);
    let s = Arc::new(Sidecar::start(&etcd.endpoint, "pod-a", &[]).await);
    let grants = Grants::default();
    let first = s.must_acquire("up", json!({"holderId": "h0"})).await;
    let w1 = acquire_later(&s, "up", "w1", &grants);
    waiters(&s, "up", 1).await;
    declare(&etcd.endpoint, &["up", "--max-holders", "3"]);
    let late = acquire_later(&s, "up", "late", &grants);
    let w1 = tokio::time::timeout(Duration::from_secs(2), w1)
        .await
        .expect("w1 is admitted by the raise while h0 still holds")
        .unwrap();
    let late = tokio::time::timeout(Duration::from_secs(2), late)
        .await
        .expect("late is admitted too")
        .unwrap();
    assert!(first < w1 && w1 < late, "tokens {first}, {w1}, {late}");
    let order: Vec<i64> = grants.lock().unwrap().iter().map(|g| g.1).collect();
    assert!(
        order.windows(2).all(|p| p[0] < p[1]),
        "tokens must rise in grant order: {:?}",
        grants.lock().unwrap()
    );
}

/// A lock declared with `first`, its settings cached, then declared with `then`; `allowed`: an
/// acquire that only the change allows.
struct Changed {
    lock: &'static str,
    first: &'static [&'static str],
    then: &'static [&'static str],
    allowed: Option<Value>,
}

/// #54 F3: an acquire's checks against its locks' settings (its permits, mode shared,
/// `maxHoldSeconds`, `deadlineWarningSeconds`) ran on the sidecar's cached settings, which
/// nothing on that path refreshed: after a change that allows the request, it was refused as
/// before, again and again (permits 3 after `maxHolders` 2 -> 4: "maxHolders 2"). Each lock's
/// settings are cached here by a `GET`, then changed; each acquire the change allows must be
/// granted, and a refusal must name the settings etcd has.
#[tokio::test]
async fn a_request_the_changed_settings_allow_is_not_refused_on_the_cached_ones() {
    let etcd = EtcdServer::start().await;
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &[]).await;
    let changed = |lock, first, then, allowed| Changed {
        lock,
        first,
        then,
        allowed,
    };
    let locks = [
        changed(
            "pool",
            &["--max-holders", "2"],
            &["--max-holders", "4"],
            Some(json!({"permits": 3})),
        ),
        changed(
            "rw",
            &["--max-holders", "2"],
            &[],
            Some(json!({"mode": "shared"})),
        ),
        changed(
            "timed",
            &["--max-hold-seconds", "60"],
            &["--max-hold-seconds", "600"],
            Some(json!({"maxHoldSeconds": 300})),
        ),
        changed(
            "untimed",
            &[],
            &["--max-hold-seconds", "60"],
            Some(json!({"deadlineWarningSeconds": 10})),
        ),
        // A multi-lock acquire, refused on its second lock's cached settings.
        changed(
            "left",
            &[],
            &[],
            Some(json!({"mode": "shared", "with": ["right"]})),
        ),
        changed("right", &["--max-holders", "2"], &[], None),
    ];
    for l in &locks {
        declare(&etcd.endpoint, &[&[l.lock], l.first].concat());
        let (status, body) = s.get(&format!("/v1/locks/{}", l.lock)).await;
        assert_eq!(status, 200, "{}: {body}", l.lock);
    }
    for l in &locks {
        declare(&etcd.endpoint, &[&[l.lock], l.then].concat());
    }
    let mut refused = vec![];
    for l in locks {
        let Some(mut body) = l.allowed else { continue };
        body["waitSeconds"] = json!(0);
        let (status, answer) = s.post(l.lock, "acquire", body.clone()).await;
        if status != 200 {
            refused.push(format!("{} {body}: {status} {answer}", l.lock));
        }
    }
    assert!(
        refused.is_empty(),
        "refused on the old settings:\n{}",
        refused.join("\n")
    );
    let (status, body) = s
        .post("pool", "acquire", json!({"holderId": "h", "permits": 5}))
        .await;
    assert_eq!((status, body["maxHolders"].as_u64()), (400, Some(4)), "{body}");
}

/// How late the `GET`'s read of the queue reaches etcd: long enough for a settings change and
/// an enqueue to land first, short of the engine's 500 ms hedge.
const HELD: Duration = Duration::from_millis(400);

/// #54 F7: `GET /v1/locks/{name}` judged holders on two reads, the settings and then the queue,
/// unlike the fence check, a watch and the status. Here its queue read reaches etcd late (a
/// proxy holds it back), after `maxHolders` went 2 -> 1 and `w` queued behind `h1`: a waiter,
/// which under the 2 of the first read the `GET` named a holder. One read of both at one
/// revision names `h1` alone and `w` a waiter, under `maxHolders` 1.
#[tokio::test]
async fn get_judges_holders_on_one_read_across_a_max_holders_change() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["sem", "--max-holders", "2"]);
    let a = Arc::new(Sidecar::start(&etcd.endpoint, "pod-a", &[]).await);
    let late = HeldRequests::new(HELD);
    let g = Sidecar::start(&late.proxy(&etcd.endpoint).await, "pod-g", &[]).await;
    a.must_acquire("sem", json!({"holderId": "h1"})).await;
    late.arm(b"/podlock/v1/queue/default/sem/");
    let get = tokio::spawn(async move { g.get("/v1/locks/sem").await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let endpoint = etcd.endpoint.clone();
    tokio::task::spawn_blocking(move || declare(&endpoint, &["sem", "--max-holders", "1"]))
        .await
        .unwrap();
    let w = {
        let a = a.clone();
        tokio::spawn(async move {
            a.post("sem", "acquire", json!({"holderId": "w", "waitSeconds": 5}))
                .await
        })
    };
    waiters(&a, "sem", 1).await;
    let (status, info) = get.await.unwrap();
    assert_eq!((status, late.held()), (200, 1), "{info}");
    let named: Vec<&str> = (info["holders"].as_array().unwrap().iter())
        .map(|h| h["holderId"].as_str().unwrap())
        .collect();
    let seen = named.len() as u64 + info["waiters"].as_u64().unwrap();
    assert_eq!(
        seen, 2,
        "the read landed before w queued, the test made no fault: {info}"
    );
    assert_eq!(
        (named, info["waiters"].as_u64(), info["maxHolders"].as_u64()),
        (vec!["h1"], Some(1), Some(1)),
        "{info}"
    );
    release(&a, "sem", "h1").await;
    let (status, body) = w.await.unwrap();
    assert_eq!(status, 200, "{body}");
}

/// Issue #54, F10: in a semaphore of 2, pod-b's holder, granted by a read that saw pod-c's key
/// behind it, releases while pod-c's only etcd member is stalled: its release hands its slot to
/// pod-c's key (direct handoff). Then `maxHolders` is lowered to 1. Every view names pod-c a
/// holder from the handoff on (a handed grant holds, as one made before a lowering), but
/// pod-c, back, read its position under the new limit and the holder ahead, and waited: a
/// still-waiting key named a holder, its token current to the fence check. Fails so on the code
/// before the fix with `pod-c still waits`.
#[tokio::test]
async fn a_grant_handed_on_before_a_lowering_is_taken_by_a_waiter_that_reads_it() {
    let etcd = EtcdServer::cluster(3).await;
    let leader = crate::common::members::elected(&etcd).await;
    let away = (leader + 1) % etcd.len();
    let others: Vec<&str> = (0..etcd.len())
        .filter(|&i| i != away)
        .map(|i| etcd[i].endpoint.as_str())
        .collect();
    let at = |args: &[&str]| {
        declare(
            &etcd[leader].endpoint,
            &[&["slots", "--ttl-seconds", "60"], args].concat(),
        )
    };
    at(&["--max-holders", "2"]);
    let a = Sidecar::start(&others.join(","), "pod-a", &[]).await;
    let b = Arc::new(Sidecar::start(&others.join(","), "pod-b", &[]).await);
    let c = Arc::new(Sidecar::start(&etcd[away].endpoint, "pod-c", &[]).await);
    a.must_acquire("slots", json!({"holderId": "a"})).await;
    a.must_acquire("slots", json!({"holderId": "x"})).await;
    let grants = Grants::default();
    let b_grant = acquire_later(&b, "slots", "b", &grants);
    waiters(&a, "slots", 1).await;
    let c_grant = {
        let c = c.clone();
        let body = json!({"holderId": "c", "waitSeconds": 30});
        tokio::spawn(async move { c.post("slots", "acquire", body).await })
    };
    waiters(&a, "slots", 2).await;
    assert_eq!(a.post("slots", "release", json!({"holderId": "x"})).await.0, 200);
    b_grant.await.unwrap(); // by a read, which saw pod-c's key behind it

    etcd[away].signal(libc::SIGSTOP);
    assert_eq!(b.post("slots", "release", json!({"holderId": "b"})).await.0, 200);
    at(&["--max-holders", "1"]);
    let (_, view) = a.get("/v1/locks/slots").await;
    let ids: Vec<&str> = (view["holders"].as_array().unwrap().iter())
        .map(|h| h["holderId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a", "c"], "the handoff named pod-c a holder: {view}");
    tokio::time::sleep(Duration::from_millis(1500)).await; // pod-c's watch gives up on its member
    etcd[away].signal(libc::SIGCONT);

    let answered = tokio::time::timeout(Duration::from_secs(8), c_grant).await;
    let (status, body) = answered
        .expect("pod-c still waits while every view names it a holder")
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let token = view["holders"][1]["fencingToken"].as_i64().unwrap();
    assert_eq!(body["fencingToken"].as_i64(), Some(token), "{body}");
}
