//! The orphan sweep: removes queue keys under this sidecar's own leases that no acquire and no
//! hold of its registry tracks.
//!
//! Such a key can only come from a copy of an enqueue that etcd applied after its acquire had
//! ended (a hedged request, or one delayed in the network): it sits on a live lease, nobody will
//! release it, and once first in the queue it would hold the lock for as long as the pod lives.
//! A key is removed when two sweeps in a row find it unknown with the same create revision, so
//! that a release or removal already under way is not raced; the removal is guarded by that
//! revision, so a newer key of the same holder is never touched.

use std::collections::HashSet;
use std::sync::Weak;
use std::time::Duration;
use tokio::time::sleep;
use tracing::{info, warn};

use super::protocol::keys::parse_entry_key;
use super::txn::queue::{self, Ticket};
use super::{Engine, Inner};

/// How often the sweep runs: one lease read per session each time.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Sweeps until the engine is gone.
pub(crate) async fn run(engine: Weak<Inner>) {
    let mut suspects = HashSet::new();
    loop {
        sleep(SWEEP_EVERY).await;
        let Some(inner) = engine.upgrade() else {
            return;
        };
        suspects = Engine(inner).sweep(&suspects).await;
    }
}

impl Engine {
    /// One sweep: removes the keys that were suspects before and still are; returns the new
    /// suspects, as (key, create revision).
    async fn sweep(&self, before: &HashSet<(String, i64)>) -> HashSet<(String, i64)> {
        let mut suspects = HashSet::new();
        for session in self.0.sessions.live().await {
            let keys = match self.0.etcd.lease_keys(session.id).await {
                Ok(Some(keys)) => keys,
                Ok(None) => continue, // the keepalive loop ends the session
                Err(e) => {
                    warn!(error = %e, "orphan sweep could not read a lease's keys");
                    continue;
                }
            };
            for key in keys.into_iter().filter_map(|k| String::from_utf8(k).ok()) {
                let Some(slot) = parse_entry_key(&key) else {
                    continue;
                };
                if self.0.registry.knows(&slot, &key) {
                    continue;
                }
                let Ok(resp) = self.0.etcd.get(key.as_str(), None).await else {
                    continue;
                };
                let Some(revision) = resp.kvs().first().map(|kv| kv.create_revision()) else {
                    continue;
                };
                if !before.contains(&(key.clone(), revision)) {
                    suspects.insert((key, revision));
                    continue;
                }
                let lease = session.id;
                let ticket = Ticket { key, revision, lease };
                if let Ok(true) = queue::remove(&self.0.etcd, &ticket).await {
                    info!(lock = %slot.0, holder = %slot.1, key = ticket.key, revision, "removed a queue key no acquire tracks");
                }
            }
        }
        suspects
    }
}
