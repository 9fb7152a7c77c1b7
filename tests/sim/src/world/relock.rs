//! A lock deleted and declared again: the DistributedLock's deletion runs the finalizer's
//! withdrawal (`Store::withdraw`, as `operator/reconcile/mod.rs`'s `cleanup` does: every key
//! ended, the settings removed, the token epoch kept in etcd), and 0.5 to 3 s later a new
//! DistributedLock of the same name is created, with a status of its own: the operator
//! (`operator.rs`) publishes it again from what etcd kept. Clients in between are refused
//! (the lock is not declared), which the trace logs. The fencing checker keeps each lock's
//! history by name across the re-creation, so its tokens must go on rising.
//!
//! Nothing remembers a lock's tokens when etcd is wiped while its DistributedLock is deleted,
//! or after it lost the lock and before the new object's first publish (docs/design.md,
//! "Nothing helps when both memories go"): the world wipes nothing from a deletion until the
//! lock is published again (`faults.rs`), and a lock etcd had lost when it was deleted keeps
//! its old status, as an administrator carries the tokens over by hand (`podlock declare
//! --min-token`).

use super::operator::lock_id;
use super::{LOCKS, World};
use crate::rng::Rng;
use podlock::lock::Store;
use podlock::lock::protocol::epoch::Known;
use std::time::Duration;
use tokio::time::sleep;

/// Deletes a lock picked at random, then declares it again.
pub async fn delete(rng: &mut Rng, world: &World, store: &Store) {
    let i = rng.below(LOCKS.len() as u64) as usize;
    let id = lock_id(&LOCKS[i]);
    world.with(|s| {
        s.ops.deleted[i] = true;
        s.ops.unpublished[i] = true;
        s.check.deleted(LOCKS[i].name);
        s.rebuilds += 1; // its release receipts go with it (F9)
    });
    // etcd lost the lock (wiped, not yet published again): its removal keeps no epoch.
    let lost = (store.lock_state(&id, LOCKS[i].max_holders).await).is_ok_and(|s| s.settings.is_none());
    match store.withdraw(&id, "").await {
        Ok(w) => world.fault("delete", format!("{} deleted: {w:?}", id.name)),
        Err(e) => world.fault(
            "delete",
            format!("{} deleted; its withdrawal failed: {e}", id.name),
        ),
    }
    sleep(Duration::from_millis(rng.between(500, 3_000))).await;
    world.with(|s| {
        s.ops.deleted[i] = false;
        s.ops.fresh[i] = !lost;
    });
    world.log(format!("operator: {} created again", id.name));
}

/// Whether the operator reconciles lock `i` now (not while it is deleted); a lock created
/// again starts with a status of its own (`status` emptied), unless etcd had lost it (see the
/// module's doc).
pub fn declared(world: &World, i: usize, status: &mut Known) -> bool {
    world.with(|s| {
        if std::mem::take(&mut s.ops.fresh[i]) {
            *status = Known::default();
        }
        !s.ops.deleted[i]
    })
}

/// The operator reconciled lock `i`: etcd has its epoch again.
pub fn published(world: &World, i: usize) {
    world.with(|s| s.ops.unpublished[i] = false);
}
