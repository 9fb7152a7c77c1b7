//! Scenes of an enqueue sent more than once: a copy etcd applies after the hold it was for has
//! ended.

use super::{LET_IN, MUTEX, declared, let_in, request};
use crate::etcd::Etcd;
use crate::world::seed::start_pod;
use crate::world::{NAMESPACE, World};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{sleep, timeout};

/// The model's "bug: late copy unguarded" (`life/late.rs`). `a`'s enqueue reaches etcd and is
/// held there, unapplied and unanswered; past the hedge the engine sends a copy, which is
/// applied: `a` holds the free mutex, and releases it. Then etcd applies the first copy, as a
/// member that received it before a fault commits it seconds later: its put-if-absent finds
/// `a`'s key gone and puts it again, on `a`'s pod's live lease, with no acquire behind it. The
/// key is first in the queue: unless the watch `a`'s enqueue set for late copies removes it at
/// once, `b`, asking on another pod, waits for the orphan sweep, seconds later.
pub(super) async fn late_copy(world: World, etcd: Arc<Etcd>) -> Result<(), String> {
    let (_, lock) = declared(&etcd, &MUTEX, 1).await?;
    let pods = [
        start_pod(0, &etcd, &world).await,
        start_pod(1, &etcd, &world).await,
    ];
    let queue = format!("/podlock/v1/queue/{NAMESPACE}/{}/", MUTEX.name); // protocol/keys.rs
    let mut first_copy = etcd.hold_next_txn(queue.as_bytes());
    let acquire = |p: usize, holder: &'static str| {
        let (engine, req) = (
            pods[p].engine.clone(),
            request(&lock, holder, Duration::from_secs(30)),
        );
        tokio::spawn(async move { engine.acquire(req).await })
    };
    let a = acquire(0, "a");
    if !timeout(LET_IN, first_copy.arrived()).await.unwrap_or(false) {
        return Err("a's enqueue never reached etcd: the scene did not happen".into());
    }
    let_in(&world, "a (by its enqueue's second copy)", a, LET_IN).await?;
    let released = pods[0].engine.release(&lock, "a").await;
    world.log(format!("pod-0 a released: {released:?}"));
    released.map_err(|e| format!("release a: {e}"))?;
    world.log("etcd applies a's first enqueue, held back until now".into());
    first_copy.release();
    sleep(Duration::from_millis(100)).await;
    let_in(&world, "b (a released)", acquire(1, "b"), LET_IN).await?;
    (pods[1].engine.release(&lock, "b").await).map_err(|e| format!("release b: {e}"))
}
