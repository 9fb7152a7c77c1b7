//! The operator's deadline backstop (`operator/reconcile/deadline.rs`, `enforce`), on every
//! reconciliation: it reads each lock (`Store::lock_state`, whose `timed` are the holds with a
//! deadline), reckons when each began by the operator's own clock (`Clocks::started`, F8),
//! decides when each is due (`deadline::due`: its maximum hold time plus the grace, or its
//! yield request's deadline) and ends those past it (`Store::release`, `Ending::Deadline` or
//! `Ending::Yield`), counted as the steps `deadline` and `deadline-yield`. It comes back every
//! 0.2 to 2 s, or when the next deadline is due, as the reconciler requeues; each round also
//! sweeps the dead pods' keys (`dead.rs`), as the operator's pod liveness acts on every new
//! entry of a deleted pod.

use super::operator::lock_id;
use super::{LOCKS, World, dead};
use crate::rng::Rng;
use podlock::lock::{Ending, LockError, Store, clock};
use podlock::operator::clocks::Clocks;
use podlock::operator::{annotated, deadline};
use std::time::Duration;
use tokio::time::{Instant, sleep};

/// Ends holds past their deadline until `stop`.
pub async fn run(mut rng: Rng, world: World, store: Store, stop: Instant) {
    let clocks = Clocks::default();
    while Instant::now() < stop {
        let mut next = Duration::from_millis(rng.between(200, 2_000));
        for (i, l) in LOCKS.iter().enumerate() {
            if world.with(|s| s.ops.deleted[i]) {
                continue;
            }
            match enforce(&world, &store, &clocks, i).await {
                Ok(due) => next = due.map_or(next, |due| next.min(due)),
                Err(e) => world.log(format!("operator: deadlines of {}: {e}", l.name)),
            }
        }
        dead::sweep(&world, &store).await;
        sleep(next).await;
    }
}

/// Ends lock `i`'s holds past their deadline; returns how long until the next one is due.
async fn enforce(
    world: &World,
    store: &Store,
    clocks: &Clocks,
    i: usize,
) -> Result<Option<Duration>, LockError> {
    let id = lock_id(&LOCKS[i]);
    let state = store.lock_state(&id, LOCKS[i].max_holders).await?;
    let now = clock::now();
    let begun = clocks.started(&id, &state.timed, now);
    let mut next: Option<Duration> = None;
    for (held, begun) in state.timed.iter().zip(begun) {
        let Some((due, why)) = held.entry.as_ref().and_then(|e| deadline::due(e, begun)) else {
            continue;
        };
        // Due at this very moment counts as past: paused time would not move to it.
        match due.duration_since(now).ok().filter(|left| !left.is_zero()) {
            Some(left) => next = Some(next.map_or(left, |n| n.min(left))),
            None if store.release(held, why).await? => {
                let kind = match why {
                    Ending::Yield => "deadline-yield",
                    _ => "deadline",
                };
                world.fault(kind, format!("{} ended {}", id.name, annotated::describe(held)));
            }
            None => {} // gone meanwhile: its sidecar ended it, or it was released
        }
    }
    Ok(next)
}
