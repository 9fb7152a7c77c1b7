//! An administrator's requests on a DistributedLock, as the operator acts on them
//! (`operator/reconcile/release.rs`, `yielding.rs`): it reads who holds (`Store::holding`),
//! picks the holds the annotation names (`annotated::named`: one holder id, or `*`), and ends
//! each (`Store::release`, `Ending::Admin`) or writes a yield deadline into it
//! (`Store::ask_to_yield`). Either hold must then end within a bound (`ends.rs`): a force
//! release at once, a yield by its deadline (the client heeds it, `yields.rs`, or the
//! backstop ends it, `backstop.rs`).

use super::ends::{self, Due};
use super::operator::lock_id;
use super::{LOCKS, World};
use crate::rng::Rng;
use podlock::lock::{Ending, QueueEntry, Store, clock};
use podlock::operator::annotated;
use std::time::Duration;
use tokio::time::Instant;

/// How long after a force release its client may still hold: a pod's longest pause, then its
/// watch's way back.
const FORCED: Duration = Duration::from_secs(10);

/// `podlock.io/release=HOLDER` (now and then `=*`) on a lock picked at random.
pub async fn force_release(rng: &mut Rng, world: &World, store: &Store) {
    let Some((i, held, value)) = named(rng, world, store).await else {
        return;
    };
    for entry in annotated::named(&held, &value, "").0 {
        match store.release(entry, Ending::Admin).await {
            Ok(true) => {
                world.fault(
                    "force",
                    format!("{} released {}", LOCKS[i].name, annotated::describe(entry)),
                );
                ends::expect(world, due(entry, "force", Instant::now() + FORCED));
            }
            Ok(false) => world.log(format!("operator: force release: {} gone", entry.revision)),
            Err(e) => return world.log(format!("operator: force release failed: {e}")),
        }
    }
}

/// `podlock.io/yield=HOLDER` (now and then `=*`) with a grace of 1 to 4 s, on a lock picked
/// at random.
pub async fn ask_to_yield(rng: &mut Rng, world: &World, store: &Store) {
    let Some((i, held, value)) = named(rng, world, store).await else {
        return;
    };
    let grace = Duration::from_millis(rng.between(1_000, 4_000));
    let by = clock::now() + grace;
    for entry in annotated::named(&held, &value, "").0 {
        match store.ask_to_yield(entry, by).await {
            Ok(Some(deadline)) => {
                let what = format!(
                    "{} asked {} by {deadline}",
                    LOCKS[i].name,
                    annotated::describe(entry)
                );
                world.fault("yield", what);
                // An earlier request's deadline may be sooner; this one's is the latest.
                ends::expect(world, due(entry, "yield", Instant::now() + grace + ends::YIELDED));
            }
            Ok(None) => world.log(format!("operator: yield: {} gone", entry.revision)),
            Err(e) => return world.log(format!("operator: yield request failed: {e}")),
        }
    }
}

/// A lock picked at random, who holds it, and the annotation's value: one of its holder ids,
/// or (one time in four) `*`; `None` when the lock is deleted, etcd failed, or nobody holds.
async fn named(rng: &mut Rng, world: &World, store: &Store) -> Option<(usize, Vec<QueueEntry>, String)> {
    let i = rng.below(LOCKS.len() as u64) as usize;
    if world.with(|s| s.ops.deleted[i]) {
        return None;
    }
    let held = match store.holding(&lock_id(&LOCKS[i])).await {
        Ok(held) if !held.is_empty() => held,
        Ok(_) => return None,
        Err(e) => {
            world.log(format!("operator: holding {}: {e}", LOCKS[i].name));
            return None;
        }
    };
    let value = match rng.one_in(4) {
        true => annotated::ALL.to_string(),
        false => ends::holder(rng.pick(&held)),
    };
    Some((i, held, value))
}

/// The end `entry` owes by `by`.
fn due(entry: &QueueEntry, what: &'static str, by: Instant) -> Due {
    Due {
        what,
        lock: entry.lock.name.clone(),
        token: ends::token(entry),
        lease: entry.lease,
        holder: ends::holder(entry),
        by,
    }
}
