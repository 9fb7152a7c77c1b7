//! The faults, one at a time, at seeded moments: a pod frozen long enough for its lease to
//! expire (its keepalives stop with everything else), a pod's connections broken (its watch
//! and keepalive streams end), a compaction at the current revision, a pod's connections
//! broken and a compaction at once (its watches come back from revisions compacted away), a
//! leader change.

use super::World;
use super::net::Net;
use podlock_sim::etcd::Etcd;
use podlock_sim::rng::Rng;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{Instant, sleep};

/// The kinds of fault, in the order they were added to the world.
pub const KINDS: [&str; 5] = ["pause", "break", "compact", "break+compact", "leader"];

/// Injects faults until `until`; leaves every pod running.
pub async fn run(mut rng: Rng, world: World, etcd: Arc<Etcd>, nets: Vec<Net>, until: Instant) {
    loop {
        sleep(Duration::from_millis(rng.between(1_000, 6_000))).await;
        if Instant::now() >= until {
            return;
        }
        let pod = rng.below(nets.len() as u64) as usize;
        match *rng.pick(&KINDS) {
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
            kind @ ("compact" | "break+compact") => {
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
}
