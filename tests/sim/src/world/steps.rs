//! The operator's other steps (#54, item 3), each through the functions the operator calls:
//! now and then it asks a holder to yield (`admin.rs`), force-releases a holder (`admin.rs`),
//! deletes a lock and declares it again (`relock.rs`), or a pod dies for good and the
//! operator's pod liveness ends its holds (`dead.rs`); all along it ends the holds past their
//! deadline (`backstop.rs`). Each step is counted by kind beside the faults.

use super::net::Net;
use super::{World, admin, backstop, dead, relock};
use crate::rng::Rng;
use podlock::lock::Store;
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::task::AbortHandle;
use tokio::time::{Instant, sleep};

/// The kinds of step, counted beside the faults; `deadline` and `deadline-yield` count the
/// holds the backstop ended.
pub const KINDS: [&str; 4] = ["yield", "force", "delete", "kill"];

/// What the operator's steps share with the other actors (in [`World`]).
pub struct Ops {
    /// Whether the steps run (not in the scenes).
    pub on: bool,
    /// Per lock: deleted (see `relock.rs`).
    pub deleted: Vec<bool>,
    /// Per lock declared again: its status starts afresh at the next reconciliation.
    pub fresh: Vec<bool>,
    /// Per lock: deleted, or declared again and not yet published.
    pub unpublished: Vec<bool>,
    /// The pods that died.
    pub dead: BTreeSet<usize>,
    /// The clients' choices on a `yield` event (heed it or not, when).
    pub rng: Rng,
}

impl Ops {
    /// No step run yet, on `locks` locks.
    pub fn new(locks: usize) -> Self {
        Ops {
            on: false,
            deleted: vec![false; locks],
            fresh: vec![false; locks],
            unpublished: vec![false; locks],
            dead: BTreeSet::new(),
            rng: Rng::new(0),
        }
    }

    /// Whether a client of `holder` (`p{pod}c{n}`) lives in a pod that died.
    pub fn dead_holder(&self, holder: &str) -> bool {
        self.dead.iter().any(|p| holder.starts_with(&format!("p{p}c")))
    }
}

/// A pod as the steps reach it: its network, and its tasks (the reader of its events, its
/// clients), which stop when it dies.
pub struct PodHandle {
    /// Its network.
    pub net: Net,
    /// Its event reader and its clients.
    pub tasks: Vec<AbortHandle>,
}

/// Starts the operator's steps, until `until`, and its backstop, until `stop`.
pub fn start(
    rng: &mut Rng,
    world: &World,
    store: Store,
    pods: Vec<PodHandle>,
    (until, stop): (Instant, Instant),
) {
    world.with(|s| {
        s.ops.on = true;
        s.ops.rng = rng.fork();
    });
    tokio::spawn(backstop::run(rng.fork(), world.clone(), store.clone(), stop));
    tokio::spawn(run(rng.fork(), world.clone(), store, pods, until));
}

/// The operator's steps until `until`, one every 1 to 5 s.
async fn run(mut rng: Rng, world: World, store: Store, pods: Vec<PodHandle>, until: Instant) {
    loop {
        sleep(Duration::from_millis(rng.between(1_000, 5_000))).await;
        if Instant::now() >= until {
            return;
        }
        match *rng.pick(&KINDS) {
            "yield" => admin::ask_to_yield(&mut rng, &world, &store).await,
            "force" => admin::force_release(&mut rng, &world, &store).await,
            "delete" => relock::delete(&mut rng, &world, &store).await,
            _ => dead::kill(&mut rng, &world, &store, &pods).await,
        }
    }
}
