//! Observing a lock without holding it: its holders now, then each change of them, until the
//! lock is deleted. etcd's `Election.Observe` does this for an election; here it serves any lock.
//!
//! Every view is the fence check's read ([`Engine::read_holders`]), so the holders reported are
//! those of the one rule of who holds, as `GET /v1/locks/{name}`, the fence check and the status
//! name them. One etcd watch over the lock's settings key and its queue, from just after the
//! last read, says when to read again; a read whose holders differ from the last reported (by
//! holder id, token or mode) is news. Changes between two reads are coalesced: a grant and its
//! release inside one read's round trip are never reported, but the holders reported are always
//! the holders at some revision, and the last change is never missed. A watch that breaks
//! (etcd failing over, a member stalled, a compaction past its start) is given up: the observer
//! reads again and watches anew from that read, so whatever changed meanwhile is reported.

use etcd_client::EventType;
use tracing::warn;

use super::engine::Engine;
use super::error::LockError;
use super::etcd::watch::{KeyWatch, Target};
use super::fence::Holding;
use super::messages::{HolderSet, LockDeleted, Observed};
use super::protocol::entry::HolderInfo;
use super::protocol::names::LockId;
use crate::retry::{self, Pauses};

/// A lock's holders followed through etcd (made by [`Engine::observe`]).
pub struct Observer {
    engine: Engine,
    lock: LockId,
    /// The holders last reported.
    reported: Vec<HolderInfo>,
    /// The create revision of the lock's settings key at the last read (0: not declared). A
    /// read that finds another one says the lock was deleted and declared again meanwhile.
    created: i64,
    /// A watch event removed the settings: the lock was deleted, whatever the next read finds
    /// (it may already be declared again).
    deleted: bool,
    /// The watch from just after the last read; `None` once it broke (read, then watch anew).
    watch: Option<KeyWatch>,
    /// The pauses between tries while etcd fails.
    pauses: Pauses,
}

impl Engine {
    /// Starts observing `lock`: its holders now, and an [`Observer`] of their changes. Fails as
    /// `GET /v1/locks/{name}` does: [`LockError::NotFound`] for a lock that is not declared
    /// (unless this sidecar serves undeclared locks), an etcd error when etcd does not answer.
    pub async fn observe(&self, lock: &LockId) -> Result<(HolderSet, Observer), LockError> {
        let holding = self.read_holders(lock).await?;
        self.remember(lock, holding.declared.clone())?;
        let watch = watch_from(self, lock, holding.revision).await?;
        let now = HolderSet {
            lock: lock.clone(),
            holders: holding.holders,
            revision: holding.revision,
        };
        let observer = Observer {
            engine: self.clone(),
            lock: lock.clone(),
            reported: now.holders.clone(),
            created: holding.created,
            deleted: false,
            watch: Some(watch),
            pauses: Pauses::new(retry::rewatch()),
        };
        Ok((now, observer))
    }
}

impl Observer {
    /// The next change: new holders, or the lock's deletion (then there is nothing more to
    /// observe). etcd's failures are waited out, under the retry policy of a broken watch.
    pub async fn next(&mut self) -> Observed {
        loop {
            match self.step().await {
                Ok(news) => {
                    // etcd served: a later failure waits the first pause again.
                    self.pauses = Pauses::new(retry::rewatch());
                    if let Some(news) = news {
                        return news;
                    }
                }
                Err(e) => {
                    self.watch = None;
                    let pause = self.pauses.next_pause();
                    warn!(lock = %self.lock, error = %e, retry_in = ?pause,
                        "observing a lock: etcd failed; reading again and watching anew");
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// Waits for a change and reads again; without a watch (it broke), reads and watches anew
    /// from that read. The news of the read, if any.
    async fn step(&mut self) -> Result<Option<Observed>, LockError> {
        let Some(watch) = &mut self.watch else {
            let holding = self.engine.read_holders(&self.lock).await?;
            self.watch = Some(watch_from(&self.engine, &self.lock, holding.revision).await?);
            return Ok(self.news(holding));
        };
        watch.changed().await?;
        self.deleted |= removes_settings(&watch.take_events(), &self.lock);
        let holding = self.engine.read_holders(&self.lock).await?;
        Ok(self.news(holding))
    }

    /// What a read says that was not reported yet: the lock's deletion (its settings gone since
    /// the last read, or removed by a watched change, or put anew: deleted and declared again
    /// while no watch saw it, issue #54's F10), or holders that differ.
    fn news(&mut self, holding: Holding) -> Option<Observed> {
        let revision = holding.revision;
        let recreated = self.created != 0 && holding.created != self.created;
        if self.deleted || recreated {
            let lock = self.lock.clone();
            return Some(Observed::Deleted(LockDeleted { lock, revision }));
        }
        self.created = holding.created;
        if same_holders(&self.reported, &holding.holders) {
            return None;
        }
        self.reported = holding.holders;
        Some(Observed::Holders(HolderSet {
            lock: self.lock.clone(),
            holders: self.reported.clone(),
            revision,
        }))
    }
}

/// Whether two views name the same holders: the same holder ids with the same tokens and
/// modes, in the same order (queue order, so the same holders always stand in the same order).
/// Nothing else of a holder changes while it holds but its `acquiredAt`, when its grant is
/// recorded: that is no news.
fn same_holders(a: &[HolderInfo], b: &[HolderInfo]) -> bool {
    let same = |x: &HolderInfo, y: &HolderInfo| {
        (x.holder_id == y.holder_id) && (x.fencing_token, x.mode) == (y.fencing_token, y.mode)
    };
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
}

/// Whether `events` remove `lock`'s settings key: the lock's deletion.
fn removes_settings(events: &[etcd_client::Event], lock: &LockId) -> bool {
    let config = lock.config_key();
    events.iter().any(|ev| {
        ev.event_type() == EventType::Delete && ev.kv().is_some_and(|kv| kv.key() == config.as_bytes())
    })
}

/// Watches `lock`'s settings key and every key of its queue from just after revision `read`,
/// so that no change after that read goes unseen.
async fn watch_from(engine: &Engine, lock: &LockId, read: i64) -> Result<KeyWatch, LockError> {
    let from = Some(read + 1);
    let targets = [
        Target::any_change(lock.config_key().as_bytes()).from(from),
        Target::any_change_under(lock.queue_prefix().as_bytes()).from(from),
    ];
    engine.etcd().watch_keys(&targets).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::protocol::entry::Mode;

    fn holder(id: &str, token: i64, mode: Mode, acquired_at: &str) -> HolderInfo {
        HolderInfo {
            holder_id: id.into(),
            pod: "p".into(),
            cluster: None,
            fencing_token: token,
            acquired_at: acquired_at.into(),
            mode,
            permits: 1,
            with: vec![],
            yield_deadline: None,
        }
    }

    #[test]
    fn holders_differ_by_id_token_mode_or_number_and_not_by_their_record() {
        let x = Mode::Exclusive;
        let a = [holder("a", 3, x, "requested")];
        assert!(
            same_holders(&a, &[holder("a", 3, x, "recorded")]),
            "a grant recorded"
        );
        assert!(same_holders(&[], &[]));
        assert!(
            !same_holders(&a, &[holder("a", 5, x, "requested")]),
            "acquired again"
        );
        assert!(!same_holders(&a, &[holder("b", 3, x, "requested")]));
        assert!(!same_holders(&a, &[holder("a", 3, Mode::Shared, "requested")]));
        assert!(!same_holders(&a, &[]), "released");
        let both = [holder("a", 3, x, ""), holder("b", 4, x, "")];
        assert!(!same_holders(&a, &both), "a second holder");
    }
}
