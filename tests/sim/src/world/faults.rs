//! The faults, one at a time, at seeded moments: a pod frozen long enough for its lease to
//! expire (its keepalives stop with everything else), a pod's connections broken (its watch
//! and keepalive streams end), a compaction at the current revision, a pod's connections
//! broken and a compaction at once (its watches come back from revisions compacted away), a
//! leader change; a pod deaf for a while (its requests are applied, their answers wait: the
//! engine sends copies), then hearing again (the answers come late) or broken (they are lost);
//! etcd restored from the snapshot of the step before (`etcdutl snapshot restore
//! --bump-revision --mark-compacted`), or wiped.

use super::World;
use super::net::Net;
use crate::etcd::{Etcd, Snapshot};
use crate::rng::Rng;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{Instant, sleep};

/// The kinds of fault, in the order they were added to the world.
pub const KINDS: [&str; 9] = [
    "pause",
    "break",
    "compact",
    "break+compact",
    "leader",
    "deaf",
    "deaf+break",
    "restore",
    "wipe",
];

/// How far a restore's revisions jump (`--bump-revision`).
const BUMP: i64 = 1_000_000;

/// Injects faults until `until`; leaves every pod running.
pub async fn run(mut rng: Rng, world: World, etcd: Arc<Etcd>, nets: Vec<Net>, until: Instant) {
    let mut snapshot = etcd.snapshot();
    loop {
        sleep(Duration::from_millis(rng.between(1_000, 6_000))).await;
        if Instant::now() >= until {
            return;
        }
        let (pod, kind) = (rng.below(nets.len() as u64) as usize, *rng.pick(&KINDS));
        world.disturbed(kind, pod);
        match kind {
            kind @ ("pause" | "break" | "compact" | "break+compact" | "leader") => {
                wire_or_etcd(kind, &mut rng, &world, &etcd, (&nets, pod)).await
            }
            kind @ ("deaf" | "deaf+break") => {
                let deaf = Duration::from_millis(rng.between(200, 3_000));
                world.fault(kind, format!("pod-{pod} hears no answer for {deaf:?}"));
                nets[pod].deafen(true);
                sleep(deaf).await;
                if kind == "deaf+break" {
                    nets[pod].break_all();
                }
                nets[pod].deafen(false);
            }
            kind if world.with(|s| s.ops.unpublished.contains(&true)) => {
                // Nothing would remember the lock's tokens (see `relock.rs`): etcd loses the
                // epoch its removal kept, and no status has it.
                world.log(format!(
                    "{kind} left out: a lock is deleted, or not yet published again"
                ));
            }
            "restore" => restore(&world, &etcd, &snapshot),
            _ => {
                world.fault("wipe", "etcd wiped".into());
                etcd.wipe();
                world.with(|s| {
                    s.check.wiped();
                    s.rebuilds += 1;
                });
            }
        }
        snapshot = etcd.snapshot();
    }
}

/// Restores `etcd` from `snapshot`, which may predate a lock's latest epoch (F11).
fn restore(world: &World, etcd: &Etcd, snapshot: &Snapshot) {
    let r = etcd.inspect(|s| s.store.revision());
    etcd.restore(snapshot, BUMP, true);
    world.with(|s| {
        s.returned.fill(true);
        s.rebuilds += 1;
        s.check.restored();
    });
    world.fault("restore", format!("from the snapshot before, at revision {r}"));
}

/// A fault of the first five kinds.
async fn wire_or_etcd(
    kind: &'static str,
    rng: &mut Rng,
    world: &World,
    etcd: &Etcd,
    (nets, pod): (&[Net], usize),
) {
    match kind {
        "pause" => {
            let pause = Duration::from_millis(rng.between(500, 6_000));
            world.fault("pause", format!("pod-{pod} frozen for {pause:?}"));
            nets[pod].pause(true);
            sleep(pause).await;
            nets[pod].pause(false);
            world.log(format!("pod-{pod} thawed"));
        }
        "break" => {
            world.fault("break", format!("pod-{pod}'s connections reset"));
            nets[pod].break_all();
        }
        "compact" | "break+compact" => {
            let broken = kind == "break+compact";
            if broken {
                nets[pod].break_all();
            }
            let revision = etcd.inspect(|s| s.store.revision());
            let r = etcd.compact(revision);
            let which = if broken {
                format!(" after pod-{pod}'s connections reset")
            } else {
                String::new()
            };
            world.fault(kind, format!("at {revision}{which}: {r:?}"));
        }
        _ => {
            world.fault("leader", "a new leader; every lease's TTL starts again".into());
            etcd.change_leader();
        }
    }
}
