//! Late copies of an enqueue, removed as soon as they land.
//!
//! An enqueue sent more than once (its first copy unanswered within the hedge, or failed
//! during a leader change: see `etcd::HEDGE`) may be applied by etcd once more after its answer:
//! a member that received a copy before a fault can commit it seconds later. If the key has
//! left the queue by then (the hold was released, or the acquire gave up), the copy's
//! put-if-absent finds it absent and puts it again, on the sidecar's live lease, with no acquire
//! behind it. Once first, such a key holds the lock until the orphan sweep removes it 5 to 10 s
//! later (`sweep`), and everyone queued behind it waits that long. The safety run met this
//! after etcd leader kills: a queue stalled for 5 s with no holder.
//!
//! So the keys of an enqueue sent more than once are watched for [`WINDOW`], and any key put
//! there that no acquire or hold of this sidecar tracks is removed at once, guarded by its
//! create revision (as the sweep removes it). An enqueue sent once is never watched: etcd
//! applies one request at most once, so nothing is paid on the path without faults.

use etcd_client::EventType;
use std::convert::Infallible;
use std::time::Duration;
use tokio::time::{Instant, timeout_at};
use tracing::{info, warn};

use crate::lock::bugs::{self, Bug};
use crate::lock::engine::Engine;
use crate::lock::error::LockError;
use crate::lock::etcd::watch::Target;
use crate::lock::protocol::keys::parse_entry_key;
use crate::lock::txn::multi_lock;
use crate::lock::txn::queue::Ticket;

/// How long a key is watched for late copies of its enqueue: well past the longest a copy can
/// be pending in etcd (its request timeout, 5 s plus two election timeouts: 7 s with the
/// defaults) after the last copy was sent, which is within the 5 s budget of the request.
const WINDOW: Duration = Duration::from_secs(15);

/// Watches `keys` (one enqueue's, bound to `lease`) for [`WINDOW`] and removes every key put
/// there that this sidecar does not track: see the module's doc.
pub(in crate::lock) fn guard(engine: Engine, keys: Vec<String>, lease: i64) {
    if bugs::on(Bug::LateCopyUnguarded) {
        return;
    }
    tokio::spawn(async move {
        let until = Instant::now() + WINDOW;
        let mut from = None;
        while Instant::now() < until {
            match timeout_at(until, engine.remove_late_copies(&keys, lease, &mut from)).await {
                Err(_elapsed) => return,
                Ok(Err(e)) => {
                    warn!(key = keys[0], error = %e, "could not watch for late copies of an enqueue; again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(Ok(never)) => match never {},
            }
        }
    });
}

impl Engine {
    /// Watches `keys` from revision `from` on (`None`: from now, after a read that removes an
    /// untracked key already there), removing the untracked keys each change puts, until the
    /// watch fails; `from` then says where the next watch starts.
    async fn remove_late_copies(
        &self,
        keys: &[String],
        lease: i64,
        from: &mut Option<i64>,
    ) -> Result<Infallible, LockError> {
        if from.is_none() {
            let (found, read_at) = self.read_keys(keys).await?;
            self.remove_untracked(found, lease).await?;
            *from = Some(read_at + 1);
        }
        let targets: Vec<Target> = keys
            .iter()
            .map(|k| Target::any_change(k.as_bytes()).from(*from))
            .collect();
        let mut watch = self.etcd().watch_keys(&targets).await?;
        loop {
            watch.changed().await?;
            let mut created = vec![];
            for e in watch.take_events() {
                let Some(kv) = e.kv() else { continue };
                *from = Some(kv.mod_revision() + 1);
                if e.event_type() == EventType::Put && kv.version() == 1 {
                    created.push((kv.key_str()?.to_string(), kv.create_revision()));
                }
            }
            self.remove_untracked(created, lease).await?;
        }
    }

    /// The keys of `keys` that exist, with their create revisions, and the revision read at.
    async fn read_keys(&self, keys: &[String]) -> Result<(Vec<(String, i64)>, i64), LockError> {
        let ops = keys.iter().map(|k| etcd_client::TxnOp::get(k.as_str(), None));
        let resp = self
            .etcd()
            .txn(etcd_client::Txn::new().and_then(ops.collect::<Vec<_>>()))
            .await?;
        let at = resp.header().map_or(0, |h| h.revision());
        let found = crate::lock::etcd::gets(resp.op_responses())
            .filter_map(|g| {
                let kv = g.kvs().first()?;
                Some((kv.key_str().ok()?.to_string(), kv.create_revision()))
            })
            .collect();
        Ok((found, at))
    }

    /// Removes, together, those of `found` (keys with their create revisions) that no acquire
    /// or hold of this sidecar tracks.
    async fn remove_untracked(&self, found: Vec<(String, i64)>, lease: i64) -> Result<(), LockError> {
        let untracked: Vec<Ticket> = found
            .into_iter()
            .filter(|(key, _)| parse_entry_key(key).is_some_and(|slot| !self.registry().knows(&slot, key)))
            .map(|(key, revision)| Ticket { key, revision, lease })
            .collect();
        if untracked.is_empty() {
            return Ok(());
        }
        let removed = multi_lock::end_together(self.etcd(), &untracked).await?;
        for (t, _) in untracked.iter().zip(removed).filter(|(_, r)| *r) {
            info!(
                key = t.key,
                revision = t.revision,
                "removed a late copy of an enqueue that no acquire tracks"
            );
        }
        Ok(())
    }
}
