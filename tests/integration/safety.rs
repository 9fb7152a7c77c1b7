//! Safety under faults, the way Jepsen checks lock services: workers on several sidecars, on a
//! 3-member etcd cluster, increment a fenced counter while a fault loop kills sidecars (kill -9,
//! then restarts them), pauses a holder's sidecar past its TTL (SIGSTOP, then SIGCONT) while its
//! worker stalls too, and kills and restarts an etcd follower and the etcd leader. Afterwards: accepted writes never come from overlapping holds, none is lost or
//! duplicated, the paused holder's stale writes were rejected by fencing, progress resumed
//! after every fault, and no queue key outlives its client.
//!
//! Short form in CI; `PODLOCK_SAFETY_SECONDS=300 cargo test --test integration safety --
//! --nocapture` runs longer.

use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{EtcdServer, FencedStore, Sidecar, declare, wait_until};

const TTL: Duration = Duration::from_secs(2);

/// One worker's grant and what became of its write.
#[derive(Debug, Clone)]
struct Write {
    token: i64,
    granted: Instant,
    released: Instant,
    accepted: bool,
}

/// A worker slot: the sidecar address it uses now, whether it must stall at its next grant,
/// and whether it is stalling now (holding, not yet written).
struct Slot {
    addr: Mutex<String>,
    stall: AtomicBool,
    stalling: AtomicBool,
    writes: Mutex<Vec<Write>>,
}

async fn worker(slot: Arc<Slot>, store: String, stop: Arc<AtomicBool>) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    while !stop.load(Ordering::Relaxed) {
        let addr = slot.addr.lock().unwrap().clone();
        let Ok(resp) = http
            .post(format!("{addr}/v1/locks/counter/acquire"))
            .json(&json!({"waitSeconds": 5}))
            .send()
            .await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok(grant) = resp.json::<serde_json::Value>().await else {
            continue;
        };
        let Some(token) = grant["fencingToken"].as_i64() else {
            continue;
        };
        let granted = Instant::now();
        if slot.stall.swap(false, Ordering::Relaxed) {
            slot.stalling.store(true, Ordering::Relaxed);
            tokio::time::sleep(TTL + Duration::from_millis(1500)).await; // a GC pause, say
            slot.stalling.store(false, Ordering::Relaxed);
        }
        let url = format!("{store}/increment?token={token}&writer={addr}");
        let accepted = matches!(http.post(url).send().await, Ok(r) if r.status().is_success());
        tokio::time::sleep(Duration::from_millis(10)).await;
        let released = Instant::now();
        let _ = http
            .post(format!("{addr}/v1/locks/counter/release"))
            .json(&json!({}))
            .send()
            .await;
        slot.writes.lock().unwrap().push(Write {
            token,
            granted,
            released,
            accepted,
        });
    }
}

#[tokio::test]
async fn fencing_keeps_the_counter_right_under_crashes_and_pauses() {
    let seconds: u64 = std::env::var("PODLOCK_SAFETY_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    let mut etcd = EtcdServer::cluster(3).await;
    let endpoints = etcd
        .iter()
        .map(|m| m.endpoint.clone())
        .collect::<Vec<_>>()
        .join(",");
    declare(
        &endpoints,
        &["counter", "--ttl-seconds", &TTL.as_secs().to_string()],
    );
    let store = FencedStore::start().await;

    let mut sidecars = vec![];
    let mut slots = vec![];
    for i in 0..3 {
        let s = Sidecar::start(&endpoints, &format!("w{i}"), &[]).await;
        slots.push(Arc::new(Slot {
            addr: Mutex::new(s.addr.clone()),
            stall: AtomicBool::new(false),
            stalling: AtomicBool::new(false),
            writes: Mutex::default(),
        }));
        sidecars.push(s);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = slots
        .iter()
        .map(|s| tokio::spawn(worker(s.clone(), store.url.clone(), stop.clone())))
        .collect();

    let (mut kills, mut pauses, mut members, mut leaders) = (0, 0, 0, 0);
    let start = Instant::now();
    let mut round = 0;
    while start.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        round += 1;
        if round % 4 == 0 {
            // kill -9 an etcd member (the leader every other time), restart it a second later.
            let mut leader = None;
            for (i, m) in etcd.iter().enumerate() {
                if m.is_leader().await {
                    leader = Some(i);
                }
            }
            let Some(leader) = leader else { continue };
            let victim = if round % 8 == 0 {
                leader
            } else {
                (leader + 1) % etcd.len()
            };
            etcd[victim].stop();
            tokio::time::sleep(Duration::from_secs(1)).await;
            etcd[victim].resume().await;
            if victim == leader {
                leaders += 1
            } else {
                members += 1
            }
        } else if round % 2 == 1 {
            // kill -9 one sidecar (whatever it was doing), then start a new one for its pod.
            let i = (round / 2) % sidecars.len();
            sidecars[i].kill9();
            sidecars[i] = Sidecar::start(&endpoints, &format!("w{i}"), &[]).await;
            *slots[i].addr.lock().unwrap() = sidecars[i].addr.clone();
            kills += 1;
        } else {
            // Pause a holder: its worker stalls right after its next grant, and then its sidecar
            // stops too (keepalives included), past the TTL.
            let i = (round / 2) % slots.len();
            slots[i].stall.store(true, Ordering::Relaxed);
            let holding = wait_until(Duration::from_secs(10), || async {
                slots[i].stalling.load(Ordering::Relaxed)
            })
            .await;
            if holding.is_err() {
                slots[i].stall.store(false, Ordering::Relaxed);
                continue;
            }
            sidecars[i].signal(libc::SIGSTOP);
            tokio::time::sleep(TTL + Duration::from_millis(1000)).await;
            sidecars[i].signal(libc::SIGCONT);
            pauses += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    for s in &mut sidecars {
        s.terminate();
    }

    let state = store.state().await;
    let mut writes: Vec<Write> = slots
        .iter()
        .flat_map(|s| s.writes.lock().unwrap().clone())
        .collect();
    let accepted: Vec<&Write> = {
        writes.sort_by_key(|w| w.token);
        writes.iter().filter(|w| w.accepted).collect()
    };
    let rejected = writes.len() - accepted.len();
    let overlaps = accepted
        .windows(2)
        .filter(|w| w[1].granted < w[0].released)
        .count();
    let mut gaps: Vec<Duration> = accepted
        .windows(2)
        .map(|w| w[1].granted.saturating_duration_since(w[0].released))
        .collect();
    gaps.sort();
    let max_gap = gaps.last().copied().unwrap_or_default();
    let leftover = wait_until(Duration::from_secs(5), || async {
        etcd[0].count("/podlock/v1/queue/").await == 0
    })
    .await;
    eprintln!(
        "safety: {seconds} s, {kills} sidecar kill -9 + restart, {pauses} pauses past the TTL, {members} etcd \
         follower and {leaders} etcd leader kill -9 + restart; {} grants, {} writes accepted, \
         {rejected} stale writes rejected by fencing, {overlaps} overlapping accepted holds, counter {} (store accepted {}), \
         longest stall between accepted writes {max_gap:?}, queue empty after clients left: {}",
        writes.len(),
        accepted.len(),
        state["value"],
        state["accepted"],
        leftover.is_ok()
    );
    assert_eq!(overlaps, 0, "accepted writes from overlapping holds");
    assert_eq!(
        state["value"].as_u64(),
        Some(accepted.len() as u64),
        "lost or duplicated increments"
    );
    assert_eq!(state["rejected"].as_u64(), Some(rejected as u64));
    assert!(
        pauses == 0 || rejected > 0,
        "pauses happened but fencing rejected nothing"
    );
    assert!(
        max_gap <= TTL + Duration::from_secs(4),
        "progress stalled {max_gap:?} (TTL {TTL:?})"
    );
    leftover.expect("no queue key outlives its client");
}
