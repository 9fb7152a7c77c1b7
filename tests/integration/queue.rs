//! The queue: mutual exclusion, FIFO order, semaphores and wake-ups.

use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{EtcdServer, Sidecar, declare, wait_until};

#[tokio::test]
async fn mutual_exclusion_with_rising_tokens() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["m"]);
    let mut sidecars = vec![];
    for i in 0..4 {
        sidecars.push(Arc::new(
            Sidecar::start(&etcd.endpoint, &format!("pod-{i}"), &[]).await,
        ));
    }
    // Each worker records (token, enter, exit) of every hold; holds must not overlap.
    let log = Arc::new(Mutex::new(Vec::new()));
    let inside = Arc::new(Mutex::new(0));
    let mut tasks = vec![];
    for s in &sidecars {
        let (s, log, inside) = (s.clone(), log.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..15 {
                let token = s.must_acquire("m", json!({"waitSeconds": 30})).await;
                let enter = Instant::now();
                {
                    let mut n = inside.lock().unwrap();
                    *n += 1;
                    assert_eq!(*n, 1, "two holders inside at once");
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                *inside.lock().unwrap() -= 1;
                let exit = Instant::now();
                let (status, body) = s.post("m", "release", json!({})).await;
                assert_eq!(status, 200, "{body}");
                log.lock().unwrap().push((token, enter, exit));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 60);
    log.sort_by_key(|(_, enter, _)| *enter);
    for pair in log.windows(2) {
        assert!(
            pair[0].0 < pair[1].0,
            "tokens must rise in grant order: {:?}",
            (pair[0].0, pair[1].0)
        );
        assert!(pair[0].2 <= pair[1].1, "holds overlap");
    }
}

/// Starts an acquire of `lock` by `s` in the background; returns its (token, grant time).
fn acquire_later(s: &Arc<Sidecar>, lock: &str, holder: &str) -> tokio::task::JoinHandle<(i64, Instant)> {
    let (s, lock, holder) = (s.clone(), lock.to_string(), holder.to_string());
    tokio::spawn(async move {
        let token = s
            .must_acquire(&lock, json!({"waitSeconds": 30, "holderId": holder}))
            .await;
        (token, Instant::now())
    })
}

async fn waiters(s: &Sidecar, lock: &str, n: u64) {
    wait_until(Duration::from_secs(5), || async {
        s.get(&format!("/v1/locks/{lock}")).await.1["waiters"] == n
    })
    .await
    .unwrap_or_else(|e| panic!("{n} waiters on {lock}: {e}"));
}

#[tokio::test]
async fn waiters_are_granted_in_arrival_order() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["fifo"]);
    let s = Arc::new(Sidecar::start(&etcd.endpoint, "pod-a", &[]).await);
    s.must_acquire("fifo", json!({"holderId": "h0"})).await;
    let mut pending = vec![];
    for i in 1..=5 {
        pending.push(acquire_later(&s, "fifo", &format!("h{i}")));
        waiters(&s, "fifo", i).await;
    }
    let mut order = vec![];
    let mut holder = "h0".to_string();
    for (i, p) in pending.into_iter().enumerate() {
        let (status, _) = s.post("fifo", "release", json!({"holderId": holder})).await;
        assert_eq!(status, 200);
        let (token, _) = p.await.unwrap();
        order.push(token);
        holder = format!("h{}", i + 1);
    }
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "FIFO order broken: {order:?}"
    );
}

#[tokio::test]
async fn semaphore_admits_max_holders_and_never_misses_a_wake_up() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["sem", "--max-holders", "2"]);
    let s = Arc::new(Sidecar::start(&etcd.endpoint, "pod-a", &[]).await);
    s.must_acquire("sem", json!({"holderId": "a"})).await;
    s.must_acquire("sem", json!({"holderId": "b"})).await;
    let (status, body) = s
        .post("sem", "acquire", json!({"holderId": "c", "waitSeconds": 0}))
        .await;
    assert_eq!(
        (status, body["holders"].as_array().unwrap().len()),
        (409, 2),
        "{body}"
    );

    // c and d wait. Releasing the *newer* holder b must wake c, whatever c watches.
    let c = acquire_later(&s, "sem", "c");
    waiters(&s, "sem", 1).await;
    let d = acquire_later(&s, "sem", "d");
    waiters(&s, "sem", 2).await;
    let released = Instant::now();
    assert_eq!(s.post("sem", "release", json!({"holderId": "b"})).await.0, 200);
    let (_, granted) = tokio::time::timeout(Duration::from_secs(2), c)
        .await
        .expect("c woken")
        .unwrap();
    assert!(granted - released < Duration::from_secs(1));
    // Now a and c hold and d is the first waiter: it must learn that c got in, and be woken
    // by the release of a, which it did not watch while c was ahead of it.
    waiters(&s, "sem", 1).await;
    let released = Instant::now();
    assert_eq!(s.post("sem", "release", json!({"holderId": "a"})).await.0, 200);
    let (_, granted) = tokio::time::timeout(Duration::from_secs(2), d)
        .await
        .expect("d woken")
        .unwrap();
    assert!(granted - released < Duration::from_secs(1));
    let (_, info) = s.get("/v1/locks/sem").await;
    let holders: Vec<_> = info["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["holderId"].clone())
        .collect();
    assert_eq!(holders, vec![json!("c"), json!("d")]);
}

#[tokio::test]
async fn a_waiter_that_gives_up_mid_queue_does_not_strand_the_next() {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["mid", "--max-holders", "2"]);
    let s = Arc::new(Sidecar::start(&etcd.endpoint, "pod-a", &[]).await);
    s.must_acquire("mid", json!({"holderId": "a"})).await;
    s.must_acquire("mid", json!({"holderId": "b"})).await;
    // w1 waits briefly and gives up; w2, queued behind it, must move up and get in on release.
    let w1 = s.clone();
    let giving_up = tokio::spawn(async move {
        w1.post("mid", "acquire", json!({"holderId": "w1", "waitSeconds": 1}))
            .await
    });
    waiters(&s, "mid", 1).await;
    let w2 = acquire_later(&s, "mid", "w2");
    waiters(&s, "mid", 2).await;
    assert_eq!(giving_up.await.unwrap().0, 409);
    waiters(&s, "mid", 1).await;
    assert_eq!(s.post("mid", "release", json!({"holderId": "a"})).await.0, 200);
    tokio::time::timeout(Duration::from_secs(2), w2)
        .await
        .expect("w2 granted")
        .unwrap();
}

/// Sum of watch events over every sidecar.
async fn watch_events(sidecars: &[Arc<Sidecar>]) -> f64 {
    let mut total = 0.0;
    for s in sidecars {
        total += s.metric("podlock_watch_events_total").await;
    }
    total
}

/// Watch events per release with `queue` waiters behind the holder.
async fn events_per_release(queue: usize) -> f64 {
    let etcd = EtcdServer::start().await;
    declare(&etcd.endpoint, &["herd"]);
    let mut sidecars = vec![];
    for i in 0..=queue {
        sidecars.push(Arc::new(
            Sidecar::start(&etcd.endpoint, &format!("p{i}"), &[]).await,
        ));
    }
    sidecars[0].must_acquire("herd", json!({})).await;
    let mut pending = vec![];
    for (i, s) in sidecars[1..].iter().enumerate() {
        pending.push(acquire_later(s, "herd", &s.pod));
        waiters(&sidecars[0], "herd", i as u64 + 1).await;
    }
    let before = watch_events(&sidecars).await;
    // Release three times; each time the next holder is the oldest waiter.
    let mut holder = sidecars[0].clone();
    for i in 0..3 {
        assert_eq!(holder.post("herd", "release", json!({})).await.0, 200);
        pending.remove(0).await.unwrap();
        holder = sidecars[i + 1].clone();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    (watch_events(&sidecars).await - before) / 3.0
}

#[tokio::test]
async fn watch_events_per_release_stay_flat_as_the_queue_grows() {
    let short = events_per_release(3).await;
    let long = events_per_release(24).await;
    eprintln!("watch events per release: queue 3 → {short}, queue 24 → {long}");
    assert!(
        (1.0..=3.0).contains(&short),
        "{short} events per release with 3 waiters (a release must wake the next waiter)"
    );
    assert!(
        long <= short + 1.0,
        "a release woke the herd: {long} events with 24 waiters vs {short} with 3"
    );
}
