//! Scenes of releases: two of one hold at once while its pod hears nothing.

use super::{MUTEX, declared, request};
use crate::etcd::Etcd;
use crate::world::World;
use crate::world::seed::start_pod;
use podlock::lock::LockError;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::sleep;

/// #54 F14 (seed 575 of the world). A client releases its hold twice at once, as one that
/// releases on `yield` and again at its own end does, while its pod hears no answers: etcd
/// applies the first release (the key deleted, its receipt put), and the second finds the key
/// gone with no receipt of its own. The hold was released, not lost: the release whose copy
/// deleted the key is answered so, and the other finds nothing left to release (409), as
/// after any release. Answering both `lost` tells the client a rival may have written. Which
/// release is answered first once the pod is cut off and hears again depends on when each
/// sends its next copy: the sooner of its next hedge and the retry pause after the break. With
/// the second 480 ms after the first and the cut 1.44 s after the first, the second's next
/// copy falls due 30 ms before the first's, as in the seed; the other gaps let the first go
/// first.
pub(super) async fn two_releases_of_one_hold(world: World, etcd: Arc<Etcd>) -> Result<(), String> {
    let (_, lock) = declared(&etcd, &MUTEX, 1).await?;
    let pod = start_pod(0, &etcd, &world).await;
    for gap in [0, 100, 250, 480].map(Duration::from_millis) {
        let holder: &'static str = Box::leak(format!("a{}", gap.as_millis()).into_boxed_str());
        let a = pod
            .engine
            .acquire(request(&lock, holder, Duration::from_secs(10)));
        a.await.map_err(|e| format!("{holder}: {e}"))?;
        world.log(format!("{holder} holds m; pod-0 goes deaf"));
        pod.net.deafen(true);
        let release = |which: &'static str| {
            let (engine, lock, world) = (pod.engine.clone(), lock.clone(), world.clone());
            tokio::spawn(async move {
                let answer = engine.release(&lock, holder).await;
                world.log(format!("{which} release of {holder} answered {answer:?}"));
                answer
            })
        };
        let first = release("first");
        sleep(gap).await;
        let second = release("second");
        sleep(Duration::from_millis(1_440) - gap).await;
        world.log("pod-0 cut off, then hears again".into());
        pod.net.break_all();
        pod.net.deafen(false);
        let answers = [first.await, second.await].map(|a| a.map_err(|e| e.to_string()));
        let released = answers.iter().filter(|a| matches!(a, Ok(Ok(())))).count();
        let lost = (answers.iter()).any(|a| matches!(a, Ok(Err(LockError::Lost { .. }))));
        if (released, lost) != (1, false) {
            return Err(format!(
                "two releases of one hold, the second {gap:?} after the first, were answered \
                 {answers:?}: one released it, and none lost it"
            ));
        }
        sleep(Duration::from_secs(5)).await; // the keepalives catch up
    }
    Ok(())
}
