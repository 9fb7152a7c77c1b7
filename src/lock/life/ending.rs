//! Ending holds: release, heartbeat, loss and shutdown. Whichever comes first wins under the
//! registry's lock, and exactly one event (`released` or `lost`) is published.

use std::sync::Arc;
use std::time::SystemTime;
use tracing::{debug, info, warn};

use super::detached::spawn_removal;
use super::monitor::{KEY_DELETED, SESSION_LOST, SHUTDOWN};
use crate::lock::engine::Engine;
use crate::lock::engine::hold::Hold;
use crate::lock::engine::receipts::ReceiptSlot;
use crate::lock::error::LockError;
use crate::lock::etcd::session::Session;
use crate::lock::messages::EventKind;
use crate::lock::protocol::names::LockId;
use crate::lock::txn::handoff;
use crate::lock::txn::multi_lock;
use crate::lock::txn::queue;
use crate::lock::txn::queue::Ticket;
use crate::lock::txn::release_note::{self, DEADLINE, NOTE_READ};

impl Engine {
    /// Releases a hold: deletes its key (guarded by its create revision) and ends it. A key
    /// found already gone, or a session already lost, means the hold had ended without this
    /// sidecar knowing yet: that is a loss (410 and a `lost` event), never a success. A key that
    /// this release's own first copy deleted is told apart by its receipt (see `receipt`).
    pub async fn release(&self, lock: &LockId, holder: &str) -> Result<(), LockError> {
        let hold = self.registry().get_held(lock, holder)?;
        self.end_released(hold).await
    }

    /// Releases `holder`'s hold of `lock` if it is still the one with fencing `token` (a hold
    /// bound to a connection that closed); a later hold of the same holder is left alone.
    pub async fn release_token(&self, lock: &LockId, holder: &str, token: i64) -> Result<(), LockError> {
        match self.registry().get_held(lock, holder) {
            Ok(hold) if hold.token() == token => self.end_released(hold).await,
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Ends `hold` by release (see [`Engine::release`]), with the rest of its set. Releases of
    /// one hold run one at a time (#54 F14, a client that releases on `yield` and again at its
    /// own end): the second would find the key the first's copy deleted gone, with no receipt
    /// of its own, and end the hold as lost before the first's answer came back; waiting, it
    /// finds the hold released and says so (409), and the first is answered `released`.
    async fn end_released(&self, hold: Arc<Hold>) -> Result<(), LockError> {
        let first = self.first_of_set(&hold);
        let _one = first.releasing.lock().await;
        if !self.registry().holds(&hold) {
            return Err(self.registry().ended(&hold));
        }
        let (lock, holder) = (&hold.lock, hold.holder_id.as_str());
        let Some(members) = self.members(&hold) else {
            return Err(self.lose(&hold, SET_LOST).await);
        };
        for m in &members {
            m.ended.cancel(); // the monitors stop before our own deletions reach them
        }
        let removed = match self.delete_keys(&hold, &members).await {
            Ok(removed) => removed,
            Err(e) => {
                warn!(lock = %lock, holder, error = %e, "release could not reach etcd; retrying in the background");
                spawn_removal(self.clone(), tickets(&members), hold.session.clone());
                true
            }
        };
        if hold.session.is_lost() {
            return Err(self.lose(&hold, SESSION_LOST).await);
        }
        if !removed {
            self.check_session(&hold.session).await;
            return Err(self.lose(&hold, self.why_key_deleted(&hold).await).await);
        }
        if !self.registry().end_released(&hold) {
            // Its monitor ended it meanwhile (lost, and reported), or a release of the same
            // holder id did (two requests of one holder): say which, and report nothing again.
            return Err(self.registry().ended(&hold));
        }
        for m in members.iter().filter(|m| !Arc::ptr_eq(m, &hold)) {
            if self.registry().end_released(m) {
                self.publish(m, EventKind::Released, None);
            }
        }
        debug!(lock = %lock, holder, token = hold.token(), "released");
        self.publish(&hold, EventKind::Released, None);
        Ok(())
    }

    /// Deletes the keys of `members` (`hold` first), handing the lock on where `hold` may;
    /// returns whether this release deleted them. Each key's receipt lies at a slot no other
    /// release of this sidecar in flight uses.
    async fn delete_keys(&self, hold: &Hold, members: &[Arc<Hold>]) -> Result<bool, LockError> {
        let mut slots: Vec<ReceiptSlot> = (members.iter())
            .map(|m| self.receipt_slots().take(&m.lock, m.ticket.lease))
            .collect();
        let release = match members.len() {
            1 => {
                let chain = hold.terms.chain.get().await;
                let ticket = (&hold.ticket, slots[0].get());
                handoff::release(self.etcd(), &hold.lock, ticket, chain.as_ref()).await
            }
            _ => {
                let numbers: Vec<u32> = slots.iter().map(ReceiptSlot::get).collect();
                multi_lock::release(self.etcd(), &tickets(members), &numbers).await
            }
        };
        if release.is_ok() {
            slots.iter_mut().for_each(ReceiptSlot::answered);
        }
        release
    }

    /// The hold of the first lock of `hold`'s set, whose `releasing` stands for the set's
    /// (a set may be released through any of its locks); `hold` itself for a single lock, or
    /// if that hold has ended (then the set is lost, and its release says so).
    fn first_of_set(&self, hold: &Arc<Hold>) -> Arc<Hold> {
        let first = hold.terms.set.first().and_then(|(lock, token)| {
            let slot = (lock.clone(), hold.holder_id.clone());
            self.registry().held(&slot).filter(|m| m.fencing == *token)
        });
        first.unwrap_or_else(|| hold.clone())
    }

    /// The holds of `hold`'s set that this sidecar still holds, `hold` first (just `hold` for
    /// a single lock); `None` if one of them has ended (lost): then the set is lost.
    fn members(&self, hold: &Arc<Hold>) -> Option<Vec<Arc<Hold>>> {
        let mut members = vec![hold.clone()];
        for (lock, token) in hold.terms.set.iter().filter(|(l, _)| *l != hold.lock) {
            let slot = (lock.clone(), hold.holder_id.clone());
            members.push(self.registry().held(&slot).filter(|m| m.fencing == *token)?);
        }
        Some(members)
    }

    /// Restarts a hold's heartbeat window; returns when it will expire. The hold's key is read:
    /// a key found gone is a loss (410). If etcd does not answer, the window is restarted all
    /// the same (the app is alive; the lease is watched over separately).
    pub async fn heartbeat(&self, lock: &LockId, holder: &str) -> Result<SystemTime, LockError> {
        let hold = self.registry().get_held(lock, holder)?;
        let expires = hold.heartbeat();
        for m in self.members(&hold).unwrap_or_default().iter().skip(1) {
            m.heartbeat();
        }
        match queue::is_ours(self.etcd(), &hold.ticket).await {
            Ok(_) if hold.session.is_lost() => Err(self.lose(&hold, SESSION_LOST).await),
            Ok(true) => Ok(expires),
            Ok(false) => Err(self.lose(&hold, self.why_key_deleted(&hold).await).await),
            Err(e) => {
                warn!(lock = %lock, holder, error = %e, "heartbeat could not read the hold's key");
                Ok(expires)
            }
        }
    }

    /// Why `hold`'s key, found deleted, is gone: the operator's reason (an administrator's
    /// release, a deadline) if it left a note for exactly this hold (read within
    /// [`NOTE_READ`]), else [`KEY_DELETED`].
    pub(crate) async fn why_key_deleted(&self, hold: &Hold) -> &'static str {
        let note = release_note::noted(self.etcd(), &hold.lock, &hold.holder_id, &hold.ticket);
        match tokio::time::timeout(NOTE_READ, note).await {
            Ok(Ok(Some(ending))) => ending.reason(),
            _ => KEY_DELETED,
        }
    }

    /// Ends `hold` as lost for `reason` and returns the error that tells its holder so; if it
    /// had already ended, says how: lost (410), or released by another request of the same
    /// holder id (409), even when that holder id holds again since.
    async fn lose(&self, hold: &Arc<Hold>, reason: &str) -> LockError {
        if !self.end_lost(hold, reason).await {
            return self.registry().ended(hold);
        }
        LockError::Lost {
            lock: hold.lock.clone(),
            holder: hold.holder_id.clone(),
            reason: reason.into(),
        }
    }

    /// Ends `hold` as lost (called by its monitor), with the rest of its set, unless it
    /// already ended; returns whether it ended it.
    pub(crate) async fn end_lost(&self, hold: &Arc<Hold>, reason: &str) -> bool {
        if !self.end_lost_one(hold, reason) {
            return false;
        }
        // Every hold of a set shares its deadline: each reached it, not lost it by another's.
        let theirs = match reason {
            DEADLINE => reason.to_string(),
            _ => format!("{SET_LOST} ({}: {reason})", hold.lock.name),
        };
        for (lock, token) in hold.terms.set.iter().filter(|(l, _)| *l != hold.lock) {
            let slot = (lock.clone(), hold.holder_id.clone());
            if let Some(m) = self.registry().held(&slot).filter(|m| m.fencing == *token) {
                self.end_lost_one(&m, &theirs);
            }
        }
        true
    }

    /// Ends `hold` alone as lost, unless it already ended; returns whether it ended it.
    fn end_lost_one(&self, hold: &Arc<Hold>, reason: &str) -> bool {
        if !self.registry().mark_lost(hold, reason) {
            return false;
        }
        hold.ended.cancel();
        warn!(lock = %hold.lock, holder = %hold.holder_id, token = hold.token(), reason, "hold lost");
        self.publish(hold, EventKind::Lost, Some(reason.into()));
        spawn_removal(self.clone(), vec![hold.ticket.clone()], hold.session.clone());
        true
    }

    /// Ends `session` at once if etcd no longer has its lease: a key of it that vanished may
    /// mean the lease was revoked, and then every hold on it is lost.
    pub(crate) async fn check_session(&self, session: &Session) {
        if let Ok(None) = self.etcd().lease_keys(session.id).await {
            session.end("etcd no longer has the lease (revoked or expired)");
        }
    }

    /// Ends every hold and wait at once by revoking this sidecar's leases (on SIGTERM). The
    /// holds end by something other than their release, so each is reported `lost`.
    pub async fn shutdown(&self) {
        let holds = self.registry().drain_held();
        for h in &holds {
            h.ended.cancel();
        }
        self.sessions().close().await;
        for h in &holds {
            self.publish(h, EventKind::Lost, Some(SHUTDOWN.into()));
        }
        self.subscribers().close();
        info!(ended = holds.len(), "ended every hold");
    }
}

/// Why a hold of a multi-lock set was lost when another lock of the set was.
const SET_LOST: &str = "another lock of its set was lost";

/// The keys of `holds`.
fn tickets(holds: &[Arc<Hold>]) -> Vec<Ticket> {
    holds.iter().map(|h| h.ticket.clone()).collect()
}
