//! A pod that dies for good (at most all but two): its network cut for good (`Net::kill`), its
//! clients and the reader of its events stopped (what they were not yet told is never told),
//! its engine no longer reaching etcd. The operator's pod liveness sees the Pod deleted and
//! does what `operator/liveness/mod.rs` does for `PodDeleted`: ends the pod's keys together
//! (`Store::end_entries`, guarded by create revision) and revokes their leases
//! (`Store::revoke_lease_in`); the backstop's rounds (`backstop.rs`) do it again for keys of
//! the pod that show up later (a request it wrote before it died, a restore), as the operator
//! does on a new entry of a deleted pod. Checked: a few seconds after the revocation no key of
//! the dead pod is left; and a waiter of another pod, queued on a lock the dead pod had keys
//! on, whose key comes to hold is told it holds (within the engine's answer bound).

use super::check::{ANSWER_BOUND, QUEUE_PREFIX};
use super::shared::Shared;
use super::steps::PodHandle;
use super::{LOCKS, NAMESPACE, World, ends};
use crate::rng::Rng;
use podlock::lock::{Entry, QueueEntry, Store};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::time::sleep;

/// How long after the revocation no key of the dead pod may be left: less than a lease TTL,
/// so that the lease's expiry alone would not do.
const GONE: Duration = Duration::from_secs(1);

/// How long after the revocation a waiter whose key holds must have been told so: its
/// longest wait and the engine's answer bound.
const LET_IN: Duration = Duration::from_secs(4 + ANSWER_BOUND.as_secs());

/// Kills a pod picked at random, if more than two live, and ends its holds.
pub async fn kill(rng: &mut Rng, world: &World, store: &Store, pods: &[PodHandle]) {
    let alive: Vec<usize> = (0..pods.len())
        .filter(|p| world.with(|s| !s.ops.dead.contains(p)))
        .collect();
    if alive.len() <= 2 {
        return;
    }
    let p = *rng.pick(&alive);
    pods[p].net.kill();
    pods[p].tasks.iter().for_each(|t| t.abort());
    world.with(|s| s.ops.dead.insert(p));
    world.fault("kill", format!("pod-{p} died"));
    let restores = world.with(|s| ends::restores(s));
    let waiters = sweep(world, store).await;
    let later = world.clone();
    tokio::spawn(async move {
        sleep(GONE).await;
        gone(&later, p, restores);
    });
    let (world, store) = (world.clone(), store.clone());
    tokio::spawn(async move {
        sleep(LET_IN).await;
        let_in(&world, &store, &waiters, restores).await;
    });
}

/// Ends every key of the dead pods and revokes their leases; returns the keys of live pods'
/// clients on the locks they were on.
pub async fn sweep(world: &World, store: &Store) -> Vec<QueueEntry> {
    let dead = world.with(|s| s.ops.dead.clone());
    if dead.is_empty() {
        return vec![];
    }
    let entries = match store.entries(Some(NAMESPACE)).await {
        Ok((entries, _)) => entries,
        Err(e) => {
            world.log(format!("operator: pod liveness: {e}"));
            return vec![];
        }
    };
    let (theirs, others): (Vec<QueueEntry>, Vec<QueueEntry>) = entries
        .into_iter()
        .partition(|e| pod_of(e).is_some_and(|p| dead.contains(&p)));
    if theirs.is_empty() {
        return vec![];
    }
    end(world, store, &theirs).await;
    let locks: BTreeSet<&str> = theirs.iter().map(|e| e.lock.name.as_str()).collect();
    others
        .into_iter()
        .filter(|e| locks.contains(e.lock.name.as_str()))
        .collect()
}

/// Ends `keys` together and revokes their leases, as the operator does for a deleted pod.
async fn end(world: &World, store: &Store, keys: &[QueueEntry]) {
    let tickets: Vec<(&str, i64, i64)> = (keys.iter())
        .map(|e| (e.key.as_str(), e.revision, e.lease))
        .collect();
    let ended = store.end_entries(&tickets).await;
    let leases: BTreeSet<i64> = keys.iter().map(|e| e.lease).filter(|l| *l != 0).collect();
    let mut revoked = vec![];
    for lease in leases {
        revoked.push((lease, store.revoke_lease_in(lease, NAMESPACE).await));
    }
    world.log(format!(
        "operator: dead pods' keys ended {ended:?}, leases revoked {revoked:x?}"
    ));
}

/// The pod of an entry's writer, by its name `pod-N`.
fn pod_of(e: &QueueEntry) -> Option<usize> {
    e.entry.as_ref()?.pod.name.strip_prefix("pod-")?.parse().ok()
}

/// Checks that no key of dead pod `p` is left, unless etcd was restored (which brings keys
/// back) since it had been restored `restores` times.
fn gone(world: &World, p: usize, restores: u64) {
    let prefix = format!("{QUEUE_PREFIX}{NAMESPACE}/");
    let name = format!("pod-{p}");
    let left: Vec<String> = world.with(|s| {
        s.etcd.inspect(|e| {
            (e.keys_under(prefix.as_bytes()).iter())
                .filter(|kv| Entry::decode(&kv.value).is_some_and(|e| e.pod.name == name))
                .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
                .collect()
        })
    });
    let restored = world.with(|s| {
        s.check.checks += 1;
        ends::restores(s) != restores
    });
    if !left.is_empty() && !restored {
        world.fail(format!(
            "dead pod-{p}'s keys left {GONE:?} after it died: {left:?}"
        ));
    }
}

/// Checks that each of `waiters` whose key holds now (the same key, the same lease) was told
/// it holds, unless its own pod died, its lock was deleted, or etcd was restored since it had
/// been restored `restores` times.
async fn let_in(world: &World, store: &Store, waiters: &[QueueEntry], restores: u64) {
    for (lock, l) in LOCKS
        .iter()
        .enumerate()
        .map(|(i, l)| (super::operator::lock_id(l), i))
    {
        let mine: Vec<&QueueEntry> = waiters.iter().filter(|w| w.lock == lock).collect();
        let restored = |s: &mut Shared| ends::restores(s) != restores || s.ops.deleted[l];
        if mine.is_empty() || world.with(restored) {
            continue;
        }
        let Ok(held) = store.holding(&lock).await else {
            continue;
        };
        for w in mine {
            let holds = held
                .iter()
                .any(|h| (h.revision, h.lease) == (w.revision, w.lease));
            let holder = ends::holder(w);
            let told = world.with(|s| {
                s.check.checks += 1;
                s.ops.dead_holder(&holder) || s.check.was_granted(&lock.name, ends::token(w))
            });
            if holds && !told {
                world.fail(format!(
                    "{holder}'s key on {} (revision {}) holds {LET_IN:?} after a dead pod's keys ended, and its client was never told",
                    lock.name, w.revision
                ));
            }
        }
    }
}
