//! Scenes of handed grants: a grant a release writes into the entry of the key behind it,
//! which that key's owner has not yet learnt or recorded.

use super::{LET_IN, declared, let_in, request};
use crate::etcd::Etcd;
use crate::world::operator::declare;
use crate::world::seed::{Pod, start_pod};
use crate::world::{LockSpec, World};
use podlock::lock::{Grant, LockError, LockId, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};

/// A semaphore of 2.
const SEMAPHORE: LockSpec = LockSpec {
    name: "s",
    max_holders: 2,
    heartbeat: 0,
    shared: false,
};

/// An acquire under way.
type Asked = JoinHandle<Result<Grant, LockError>>;

/// Where both scenes start: a grant handed to `h`, whose pod (pod-1) is deaf.
struct Handed {
    store: Store,
    lock: LockId,
    /// pod-0 (`x1`, `x2`, `a`), pod-1 (`h`), and pod-2 if asked for.
    pods: Vec<Pod>,
}

impl Handed {
    /// A semaphore of 2 on `pods` pods (2 or 3): `x1` and `x2` of pod-0 hold, `a` of pod-0 and
    /// `h` of pod-1 wait in that order. `x1` goes and `a` is let in by its read, which finds
    /// `h` behind it (its chain); pod-1 goes deaf; `a` releases and hands `h` its grant, which
    /// `h` cannot hear. Returns the stage and `h`'s acquire, not yet answered.
    async fn stage(world: &World, etcd: &Arc<Etcd>, pods: u64) -> Result<(Handed, Asked), String> {
        let (store, lock) = declared(etcd, &SEMAPHORE, 2).await?;
        let mut started = Vec::new();
        for p in 0..pods {
            started.push(start_pod(p, etcd, world).await);
        }
        let stage = Handed {
            store,
            lock,
            pods: started,
        };
        let_in(world, "x1", stage.acquire(0, "x1"), LET_IN).await?;
        let_in(world, "x2", stage.acquire(0, "x2"), LET_IN).await?;
        let a = stage.acquire(0, "a");
        sleep(Duration::from_millis(100)).await;
        let h = stage.acquire(1, "h");
        sleep(Duration::from_secs(1)).await;
        stage.release(world, 0, "x1").await?;
        let_in(world, "a (x1 released)", a, LET_IN).await?;
        world.log("pod-1 (h) goes deaf".into());
        stage.pods[1].net.deafen(true);
        stage.release(world, 0, "a").await?;
        Ok((stage, h))
    }

    /// `holder` asks on pod `p`, waiting up to 30 s.
    fn acquire(&self, p: usize, holder: &'static str) -> Asked {
        let engine = self.pods[p].engine.clone();
        let req = request(&self.lock, holder, Duration::from_secs(30));
        tokio::spawn(async move { engine.acquire(req).await })
    }

    /// `holder` of pod `p` releases.
    async fn release(&self, world: &World, p: usize, holder: &str) -> Result<(), String> {
        let r = self.pods[p].engine.release(&self.lock, holder).await;
        world.log(format!("pod-{p} {holder} released: {r:?}"));
        r.map_err(|e| format!("release {holder}: {e}"))
    }
}

/// The model's "a handed grant counts as recorded": from [`Handed::stage`], `x2` goes. Now
/// `k` asks, on a third pod, and reads its place: one slot is free, but the key ahead of it,
/// `h`, holds by a handoff not yet recorded. A grant to `k` now could be answered, and its
/// token used, before `h` learns of its own lower one: `k` waits until `h` records (the
/// admission checker judges the record too).
pub(super) async fn handed_not_recorded(world: World, etcd: Arc<Etcd>) -> Result<(), String> {
    let (stage, h) = Handed::stage(&world, &etcd, 3).await?;
    stage.release(&world, 0, "x2").await?;
    let mut k = stage.acquire(2, "k");
    if let Ok(answer) = timeout(Duration::from_millis(500), &mut k).await {
        let told = answer.map_err(|e| e.to_string())?.map(|g| g.fencing_token);
        return Err(format!(
            "k was answered {told:?} while h, ahead of it, held by a handoff not yet recorded"
        ));
    }
    world.log("pod-1 hears again".into());
    stage.pods[1].net.deafen(false);
    let_in(&world, "h (handed a's slot)", h, LET_IN).await?;
    let_in(&world, "k (h recorded)", k, LET_IN).await?;
    Ok(())
}

/// #54 F10, the model's "bug: semaphore, a read ignores a handed grant": from
/// [`Handed::stage`], the operator lowers `maxHolders` to 1, and etcd compacts past the
/// handoff and the lowering. `h`'s pod is cut off and hears again: its watches come back from
/// revisions compacted away, so it learns of the grant by its read alone. Handed under 2, `h`
/// holds beside `x2`, as every view of the holders says; a read that judged it by the keys
/// ahead under 1 would have it wait for `x2`, a holder in every view but its own.
pub(super) async fn handed_then_lowered(world: World, etcd: Arc<Etcd>) -> Result<(), String> {
    let (stage, h) = Handed::stage(&world, &etcd, 2).await?;
    declare(&stage.store, &SEMAPHORE, 1)
        .await
        .map_err(|e| format!("declare: {e}"))?;
    let now = etcd.inspect(|s| s.store.revision());
    etcd.compact(now).map_err(|e| format!("compact: {e}"))?;
    world.log(format!(
        "operator: s maxHolders 1; etcd compacted at {now}; pod-1 cut off, then hears again"
    ));
    stage.pods[1].net.break_all();
    stage.pods[1].net.deafen(false);
    let_in(&world, "h (handed a's slot under 2)", h, LET_IN).await?;
    stage.release(&world, 1, "h").await?;
    stage.release(&world, 0, "x2").await
}
