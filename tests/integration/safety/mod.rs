//! Safety under faults, the way Jepsen checks lock services. Three workers, each on its own
//! sidecar, on a 3-member etcd cluster, take the lock (TTL 2 s) over and over and increment a
//! fenced counter once per hold, as correct clients: each follows its sidecar's events stream
//! and stops counting a hold as its own once told it is lost. A fault loop injects, one at a
//! time and each only once the lock has made progress again: kill -9 of the holder's sidecar
//! (then a new sidecar for its pod); a pause of a holder past the TTL (the worker stalls between
//! grant and write while its sidecar is SIGSTOPped); kill -9 of an etcd follower, and of the
//! etcd leader (each restarted a second later); SIGSTOP of a follower, and of the leader, past
//! the TTL (a stalled member: connections open, nothing answered); the lock's settings
//! rewritten (queued waiters and enqueues in flight must follow); a holder's sidecar paused
//! just before its release (the release must be told the hold was lost); a holder stalled past
//! its heartbeat window, its sidecar running; the lock deleted and declared again.
//!
//! Afterwards ([`check`]): no hold was granted while another lasted, unless that one was lost
//! and its client told within 1 s (of the later grant, or of its sidecar running again);
//! accepted writes rose in token order and the counter equals them (no increment lost or
//! duplicated); the paused holders' stale writes were rejected by fencing; after every fault a
//! newly granted hold wrote within the TTL plus 1 s; and once the workers left (those still
//! waiting by disconnecting), no queue key remained in etcd.
//!
//! `cargo test --test integration safety -- --nocapture` runs the CI form: every fault kind
//! twice, about 20 s. `PODLOCK_SAFETY_SECONDS=300` goes on injecting faults for 300 s.

mod check;
mod faults;
mod worker;

use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

use crate::common::store::FencedStore;
use crate::common::{EtcdServer, Sidecar, declare, wait_until};
use check::{Analysis, LOST_NOTICE};
use faults::{Kind, Rig};
use worker::Slot;

/// The lock's TTL: short, to make every fault bite.
const TTL: Duration = Duration::from_secs(2);

/// Wall-clock seconds since the Unix epoch: the store logs its writes in the same clock.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_and_lost_notices_keep_the_counter_right_under_process_and_etcd_faults() {
    let seconds: f64 = std::env::var("PODLOCK_SAFETY_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0);
    let etcd = EtcdServer::cluster(3).await;
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
    let mut rig = Rig {
        etcd,
        endpoints,
        sidecars: vec![],
        slots: vec![],
    };
    for i in 0..3 {
        let pod = format!("w{i}");
        let s = Sidecar::start(&rig.endpoints, &pod, &[]).await;
        rig.slots.push(Slot::new(&pod, &s.addr));
        rig.sidecars.push(s);
    }
    let stop = CancellationToken::new();
    let workers: Vec<_> = (rig.slots.iter().enumerate())
        .map(|(i, s)| tokio::spawn(worker::run(i, s.clone(), store.url.clone(), stop.clone())))
        .collect();

    let start = now();
    let faults = faults::run(&mut rig, seconds).await;
    let elapsed = now() - start;
    stop.cancel();
    for w in workers {
        w.await.unwrap();
    }
    // Every client is gone: released, or disconnected while waiting. Keys of killed sidecars
    // go with their leases, within the TTL (plus etcd's expiry check).
    let drained = wait_until(TTL + Duration::from_secs(3), || async {
        rig.etcd[0].count("/podlock/v1/queue/").await == 0
    })
    .await;
    for s in &mut rig.sidecars {
        s.terminate();
    }

    let state = store.state().await;
    let holds: Vec<_> = (rig.slots.iter())
        .flat_map(|s| s.holds.lock().unwrap().clone())
        .collect();
    let a = check::analyze(&holds, &store.accepted(), &faults);
    eprintln!("{}", report(&a, start, elapsed, &state, &drained));

    assert!(a.violations.is_empty(), "{:#?}", a.violations);
    assert_eq!(
        (state["value"].as_u64(), state["accepted"].as_u64()),
        (Some(a.accepted as u64), Some(a.accepted as u64)),
        "counter and store's count against its log"
    );
    assert_eq!(state["rejected"].as_u64(), Some(a.rejected as u64));
    let paused = a.recoveries.iter().any(|(f, _)| f.kind == Kind::Pause);
    assert!(
        !paused || a.rejected_paused > 0,
        "pauses happened but fencing rejected no paused holder's write"
    );
    for (f, took) in &a.recoveries {
        let limit = f.kind.recovery_limit().as_secs_f64();
        assert!(
            took.is_some_and(|t| t <= limit),
            "after a {} at {:.3}, a new hold wrote only after {took:?} s (limit {limit} s)",
            f.kind.name(),
            f.at - start
        );
    }
    drained.expect("no queue key outlives its client");
}

/// The one-screen summary of a run.
fn report(
    a: &Analysis,
    start: f64,
    elapsed: f64,
    state: &serde_json::Value,
    drained: &Result<Duration, String>,
) -> String {
    let mut out = format!(
        "safety: {elapsed:.0} s, TTL {} s, 3 workers on 3 sidecars, 3-member etcd\n  faults:",
        TTL.as_secs()
    );
    let kinds = Kind::CYCLE;
    for (i, k) in kinds.iter().enumerate() {
        let n = a.recoveries.iter().filter(|(f, _)| f.kind == *k).count();
        out += &format!("{} {n} x {}", if i == 0 { "" } else { "," }, k.name());
    }
    let max_lag = a.notice_lags.iter().copied().fold(0.0, f64::max);
    out += &format!(
        "\n  holds: {} granted, {} lost; {} overlapped by a later grant after being lost, their \
         clients told within {max_lag:.2} s of it (limit {LOST_NOTICE} s)\n  violations: {}",
        a.grants,
        a.lost,
        a.notice_lags.len(),
        a.violations.len()
    );
    out += &format!(
        "\n  writes: {} accepted in token order, counter {} (store accepted {}); {} not made \
         (lost before writing)\n  stale writes: {} rejected by fencing ({} of paused holders), \
         {} accepted before the successor wrote",
        a.accepted,
        state["value"],
        state["accepted"],
        a.unwritten,
        a.rejected,
        a.rejected_paused,
        a.stale_accepted,
    );
    out += "\n  fault -> first accepted write of a later grant:";
    for k in kinds {
        let mut times: Vec<f64> = (a.recoveries.iter())
            .filter(|(f, _)| f.kind == k)
            .map(|(_, t)| t.unwrap_or(f64::INFINITY))
            .collect();
        times.sort_by(f64::total_cmp);
        let (Some(max), Some(median)) = (times.last(), times.get(times.len().saturating_sub(1) / 2)) else {
            continue;
        };
        out += &format!(
            "\n    {:<36} max {max:.2} s, median {median:.2} s over {} (limit {:.1} s)",
            k.name(),
            times.len(),
            k.recovery_limit().as_secs_f64()
        );
    }
    out += &format!(
        "\n  longest stall between accepted writes {:.2} s ({:.1} s in); queue empty after the \
         clients left: {}",
        a.longest_stall.0,
        a.longest_stall.1 - start,
        drained
            .as_ref()
            .map_or_else(|e| format!("no ({e})"), |d| format!("yes, in {d:.1?}"))
    );
    out
}
