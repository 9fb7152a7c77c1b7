//! What each sidecar's engine may keep once all is quiet (#54, item 4), from what it says it
//! keeps (`Engine::footprint`): no hold or wait, no release in flight (a receipt's slot), no
//! feed a wait or hold follows, no watch stream of its own (a wait's, an observer's), no
//! settings but of the world's locks; and once it stopped, no session. Queue keys and leases
//! are `seed.rs`'s to check; release receipts live on their leases, so once no lease is left
//! no key under the queues is either.

use super::check::QUEUE_PREFIX;
use super::operator::TTL;
use super::seed::Pod;
use super::{LOCKS, NAMESPACE, World};
use crate::etcd::Etcd;
use podlock::lock::Footprint;

/// Checks what each pod's engine keeps once all was quiet, before it stops.
pub async fn quiet(world: &World, pods: &[Pod]) {
    for (p, pod) in alive(world, pods) {
        let f = pod.engine.footprint().await;
        let kept = f.holds_and_waits + f.receipt_slots + f.followed_feeds + f.watch_streams as usize;
        judge(world, p, &f, kept > 0 || f.cached_settings > LOCKS.len());
    }
}

/// Checks, once every pod's engine stopped and a lease TTL passed, that none keeps a session
/// and that no key is left under the queues, receipts included.
pub async fn stopped(world: &World, etcd: &Etcd, pods: &[Pod]) {
    for (p, pod) in alive(world, pods) {
        let f = pod.engine.footprint().await;
        judge(world, p, &f, f.sessions > 0);
    }
    let prefix = format!("{QUEUE_PREFIX}{NAMESPACE}/");
    // A forced end's release note lives on a lease of its own, longer than a TTL.
    let noted =
        |s: &crate::etcd::State, lease: i64| s.leases.get(lease).is_some_and(|l| l.ttl > i64::from(TTL));
    let left = etcd.inspect(|s| {
        (s.keys_under(prefix.as_bytes()).iter())
            .filter(|kv| !noted(s, kv.lease))
            .count()
    });
    world.with(|s| s.check.checks += 1);
    if left > 0 {
        world.fail(format!(
            "{left} keys left under the queues after every lease ended"
        ));
    }
}

/// The pods that did not die (a dead pod's engine reaches nothing: the operator revoked its
/// leases), with their indexes.
fn alive<'a>(world: &World, pods: &'a [Pod]) -> impl Iterator<Item = (usize, &'a Pod)> {
    let dead = world.with(|s| s.ops.dead.clone());
    pods.iter().enumerate().filter(move |(i, _)| !dead.contains(i))
}

/// Counts a check of pod `p`'s footprint `f`, failing it if it kept what it should not.
fn judge(world: &World, p: usize, f: &Footprint, kept: bool) {
    world.with(|s| s.check.checks += 1);
    if kept {
        world.fail(format!("pod-{p}'s engine keeps, all quiet: {f:?}"));
    }
}
