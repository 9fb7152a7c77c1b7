//! Nobody's key (#54 item 4): a queue key that holds by the queue's rule (`protocol::holders`)
//! is some client's: a hold it was told it has, or the key of an acquire still waiting for its
//! answer. A key that holds for [`BOUND`](super::liveness::BOUND) while it is neither, counted
//! past the settling of any fault that touched its pod or etcd meanwhile (`liveness.rs`),
//! breaks the rule: it keeps the lock from every waiter behind it, with nobody to release it,
//! until the orphan sweep finds it (5 to 10 s), as a copy of an enqueue that etcd applied
//! after its acquire had ended would.

use super::check::Checker;
use super::liveness::{Waits, pod_of, read};
use super::{LOCKS, steps::Ops};
use crate::etcd::Etcd;
use podlock::lock::protocol::{self, Queued};
use std::collections::BTreeMap;
use tokio::time::Instant;

/// The holding keys nobody holds or waits for, by lock and create revision: whose, and since
/// when.
#[derive(Default)]
pub struct Nobodys(BTreeMap<(usize, i64), (String, Instant)>);

impl Nobodys {
    /// Follows the holding keys of `etcd` that no client holds or waits for (`dead` pods'
    /// excepted); the first held so for the bound (see [`Waits::overdue_since`])
    /// breaks the rule.
    pub fn sample(
        &mut self,
        etcd: &Etcd,
        (check, live, ops): (&Checker, &Waits, &Ops),
    ) -> Result<(), String> {
        let now = Instant::now();
        let mut still = BTreeMap::new();
        for (lock, spec) in LOCKS.iter().enumerate() {
            let (max_holders, queue) = read(etcd, lock);
            let queued: Vec<Queued> = queue.iter().map(|(_, e)| Queued::of(e.as_ref())).collect();
            let holders = protocol::holders(&queued, max_holders);
            for (revision, entry) in queue.into_iter().take(holders) {
                let Some(e) = entry else { continue };
                let theirs = check.holds_key(spec.name, revision) || live.waits_for(&e);
                if theirs || ops.dead_holder(&e.holder_id) {
                    continue;
                }
                let since = self.0.get(&(lock, revision)).map_or(now, |(_, t)| *t);
                still.insert((lock, revision), (e.holder_id, since));
            }
        }
        self.0 = still;
        let overdue = |(_, (holder, since)): &(&(usize, i64), &(String, Instant))| {
            live.overdue_since(pod_of(holder), *since)
        };
        match self.0.iter().find(overdue) {
            Some(((lock, revision), (holder, since))) => Err(format!(
                "nobody's key: {holder}'s key of {} (revision {revision}) has held for {:?} with no \
                 client holding or waiting for it (past any fault's settling)",
                LOCKS[*lock].name,
                now - *since
            )),
            None => Ok(()),
        }
    }
}
