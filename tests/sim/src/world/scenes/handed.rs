//! Scenes of handed grants: a grant a release writes into the entry of the key behind it,
//! which that key's owner has not yet learnt or recorded.

use super::{LET_IN, let_in, request};
use crate::etcd::Etcd;
use crate::world::operator::declare;
use crate::world::seed::start_pod;
use crate::world::{LockSpec, NAMESPACE, World};
use podlock::lock::{LockId, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{sleep, timeout};

/// A semaphore of 2.
const SEMAPHORE: LockSpec = LockSpec {
    name: "s",
    max_holders: 2,
    heartbeat: 0,
    shared: false,
};

/// A semaphore of 2, and the model's "a handed grant counts as recorded": `x1` and `x2` hold,
/// `a` and `h` wait in that order. `x1` goes and `a` is let in, reading the key behind it (its
/// chain: `h`). `h`'s pod goes deaf; `a` releases and hands `h` its grant, which `h` cannot
/// hear, so cannot record; `x2` goes. Now `k` asks, on a third pod, and reads its place: one
/// slot is free, but the key ahead of it, `h`, holds by a handoff not yet recorded. A grant to
/// `k` now could be answered, and its token used, before `h` learns of its own lower one: `k`
/// waits until `h` records (the admission checker judges the record too).
pub(super) async fn handed_not_recorded(world: World, etcd: Arc<Etcd>) -> Result<(), String> {
    let store = Store::new(etcd.client().await);
    declare(&store, &SEMAPHORE, 2)
        .await
        .map_err(|e| format!("declare: {e}"))?;
    let lock = LockId::new(NAMESPACE, SEMAPHORE.name).expect("a valid name");
    let pods = [
        start_pod(0, &etcd, &world).await,
        start_pod(1, &etcd, &world).await,
        start_pod(2, &etcd, &world).await,
    ];
    let acquire = |p: usize, holder: &'static str| {
        let (engine, req) = (
            pods[p].engine.clone(),
            request(&lock, holder, Duration::from_secs(30)),
        );
        tokio::spawn(async move { engine.acquire(req).await })
    };
    let release = async |holder: &str| {
        let r = pods[0].engine.release(&lock, holder).await;
        world.log(format!("pod-0 {holder} released: {r:?}"));
        r.map_err(|e| format!("release {holder}: {e}"))
    };
    let_in(&world, "x1", acquire(0, "x1"), LET_IN).await?;
    let_in(&world, "x2", acquire(0, "x2"), LET_IN).await?;
    let a = acquire(0, "a");
    sleep(Duration::from_millis(100)).await;
    let h = acquire(1, "h");
    sleep(Duration::from_secs(1)).await;
    release("x1").await?;
    let_in(&world, "a (x1 released)", a, LET_IN).await?;
    world.log("pod-1 (h) goes deaf".into());
    pods[1].net.deafen(true);
    release("a").await?;
    release("x2").await?;
    let mut k = acquire(2, "k");
    if let Ok(answer) = timeout(Duration::from_millis(500), &mut k).await {
        let told = answer.map_err(|e| e.to_string())?.map(|g| g.fencing_token);
        return Err(format!(
            "k was answered {told:?} while h, ahead of it, held by a handoff not yet recorded"
        ));
    }
    world.log("pod-1 hears again".into());
    pods[1].net.deafen(false);
    let_in(&world, "h (handed a's slot)", h, LET_IN).await?;
    let_in(&world, "k (h recorded)", k, LET_IN).await?;
    Ok(())
}

/// #54 F10, the model's "bug: semaphore, a read ignores a handed grant". A semaphore of 2:
/// `x1` and `x2` hold, `a` and `h` wait. `x1` goes and `a` is let in by its read, learning `h`
/// behind it. `h`'s pod goes deaf; `a` releases and hands `h` its grant, which `h` does not
/// hear; the operator lowers `maxHolders` to 1, and etcd compacts past both writes. `h`'s pod
/// is cut off and hears again: its watches come back from revisions compacted away, so it
/// learns of the grant by its read alone. Handed under 2, `h` holds beside `x2`, as every view
/// of the holders says; a read that judged it by the keys ahead under 1 would have it wait
/// for `x2`, a holder in every view but its own.
pub(super) async fn handed_then_lowered(world: World, etcd: Arc<Etcd>) -> Result<(), String> {
    let store = Store::new(etcd.client().await);
    declare(&store, &SEMAPHORE, 2)
        .await
        .map_err(|e| format!("declare: {e}"))?;
    let lock = LockId::new(NAMESPACE, SEMAPHORE.name).expect("a valid name");
    let pods = [
        start_pod(0, &etcd, &world).await,
        start_pod(1, &etcd, &world).await,
    ];
    let acquire = |p: usize, holder: &'static str| {
        let (engine, req) = (
            pods[p].engine.clone(),
            request(&lock, holder, Duration::from_secs(30)),
        );
        tokio::spawn(async move { engine.acquire(req).await })
    };
    let release = async |p: usize, holder: &str| {
        let r = pods[p].engine.release(&lock, holder).await;
        world.log(format!("pod-{p} {holder} released: {r:?}"));
        r.map_err(|e| format!("release {holder}: {e}"))
    };
    let_in(&world, "x1", acquire(0, "x1"), LET_IN).await?;
    let_in(&world, "x2", acquire(0, "x2"), LET_IN).await?;
    let a = acquire(0, "a");
    sleep(Duration::from_millis(100)).await;
    let h = acquire(1, "h");
    sleep(Duration::from_secs(1)).await;
    release(0, "x1").await?;
    let_in(&world, "a (x1 released)", a, LET_IN).await?;
    world.log("pod-1 (h) goes deaf".into());
    pods[1].net.deafen(true);
    release(0, "a").await?;
    declare(&store, &SEMAPHORE, 1)
        .await
        .map_err(|e| format!("declare: {e}"))?;
    let now = etcd.inspect(|s| s.store.revision());
    etcd.compact(now).map_err(|e| format!("compact: {e}"))?;
    world.log(format!(
        "operator: s maxHolders 1; etcd compacted at {now}; pod-1 cut off, then hears again"
    ));
    pods[1].net.break_all();
    pods[1].net.deafen(false);
    let_in(&world, "h (handed a's slot under 2)", h, LET_IN).await?;
    release(1, "h").await?;
    release(0, "x2").await?;
    Ok(())
}
