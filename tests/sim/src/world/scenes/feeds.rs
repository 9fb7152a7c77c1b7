//! Scenes of a waiter's feed: what changes between its read and its watches' start, and a
//! quiet lock on which etcd says nothing.

use super::{LET_IN, MUTEX, declared, let_in, request};
use crate::etcd::Etcd;
use crate::world::operator::declare;
use crate::world::seed::start_pod;
use crate::world::{NAMESPACE, World};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{sleep, timeout};

/// #54 F1. A waiter whose process makes the lock's feed for it reads its position again once
/// the feed's watches start, to cover what changed since its first read. Here `maxHolders` goes
/// from 1 to 2 in that gap, and the waiter, the third of four keys, stands where it stood:
/// behind the key ahead of it. Under 1 it watches that key for deletion only; under 2 also for
/// the grant record that moves it up (`protocol::wakes`). A waiter that kept the plan of its
/// first read sleeps through that record and through the release after it, and is answered
/// `lock_held` at its deadline with a slot free.
pub(super) async fn limit_raised_before_a_new_feed(world: World, etcd: Arc<Etcd>) -> Result<(), String> {
    let (store, lock) = declared(&etcd, &MUTEX, 1).await?;
    let mut pods = Vec::new();
    for p in 0..3 {
        pods.push(start_pod(p, &etcd, &world).await);
    }
    let acquire = |p: usize, holder: &str, wait: Duration| {
        let (engine, world, who) = (pods[p].engine.clone(), world.clone(), holder.to_string());
        world.log(format!("pod-{p} {holder} acquire wait {wait:?}"));
        let req = request(&lock, holder, wait);
        tokio::spawn(async move {
            let answer = engine.acquire(req).await;
            world.log(format!("{who} answered {answer:?}"));
            answer
        })
    };
    let release = async |p: usize, holder: &str| {
        let r = pods[p].engine.release(&lock, holder).await;
        world.log(format!("pod-{p} {holder} released: {r:?}"));
        r.map_err(|e| format!("release {holder}: {e}"))
    };
    let a = acquire(0, "a", Duration::ZERO);
    let_in(&world, "a", a, LET_IN).await?;
    let b = acquire(1, "b", Duration::from_secs(30));
    sleep(Duration::from_millis(100)).await;
    let x = acquire(1, "x", Duration::from_secs(30));
    sleep(Duration::from_secs(1)).await;
    // pod-2 has no feed on the lock yet: its first wait makes one, and a watch of its settings.
    let config = format!("/podlock/v1/config/{NAMESPACE}/{}", MUTEX.name); // protocol/keys.rs
    let mut gap = etcd.hold_next_watch(config.as_bytes());
    let c = acquire(2, "c", Duration::from_secs(10));
    if !timeout(LET_IN, gap.arrived()).await.unwrap_or(false) {
        return Err("pod-2's wait made no feed: the scene did not happen".into());
    }
    declare(&store, &MUTEX, 2)
        .await
        .map_err(|e| format!("declare: {e}"))?;
    world.log("operator: m maxHolders 2, while pod-2's feed is held back".into());
    gap.release();
    let_in(&world, "b (by the raise)", b, LET_IN).await?;
    // Paused time moves on once every task waits: c has read again and watches by then.
    sleep(Duration::from_millis(100)).await;
    release(0, "a").await?;
    let_in(&world, "x (a released)", x, LET_IN).await?;
    release(1, "b").await?;
    // x holds one slot of 2, and c is next in the queue.
    let_in(&world, "c (b released, one slot free)", c, LET_IN).await?;
    Ok(())
}

/// #55 F15. etcd 3.6 answers no progress request on a stream while one of its watches starts
/// past the current revision (`progressIfSync`, since 3.6.0), and a mutex waiter behind another
/// waiter, in a process that follows the lock already, watches from the revision after its
/// read: on a lock where nothing is written, etcd stays silent, and a waiter that takes that
/// silence for a stalled member remakes its watches every second, accusing a healthy member
/// each time. Here a holder and two waiters of one process sit on a quiet lock for `QUIET`.
pub(super) async fn quiet_waiter_keeps_its_watches(world: World, etcd: Arc<Etcd>) -> Result<(), String> {
    const QUIET: Duration = Duration::from_secs(10);
    let (_, lock) = declared(&etcd, &MUTEX, 1).await?;
    let (holder, waiter) = (
        start_pod(0, &etcd, &world).await,
        start_pod(1, &etcd, &world).await,
    );
    let a = holder.engine.acquire(request(&lock, "a", Duration::ZERO));
    a.await.map_err(|e| format!("a: {e}"))?;
    world.log("a holds m".into());
    let wait = |holder: &'static str| {
        let (engine, req) = (waiter.engine.clone(), request(&lock, holder, QUIET * 2));
        tokio::spawn(async move { engine.acquire(req).await })
    };
    let b = wait("b");
    sleep(Duration::from_secs(1)).await;
    let c = wait("c");
    sleep(Duration::from_secs(1)).await;
    let watches = || {
        waiter
            .engine
            .stats()
            .watches
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = watches();
    sleep(QUIET).await;
    let made = watches() - before;
    world.log(format!(
        "b and c waited {QUIET:?} on a quiet etcd; their process made {made} watches"
    ));
    b.abort();
    c.abort();
    match made {
        0 => Ok(()),
        n => Err(format!(
            "the waiter's process made {n} watches in {QUIET:?} on a lock where nothing was written"
        )),
    }
}
