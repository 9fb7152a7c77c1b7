//! An acquire in progress, single or multi-lock: the registry slots it claimed and the queue
//! keys it placed, cleaned up whichever way it ends. A client that disconnects drops it, and
//! must leave no key behind that would, once first in a queue, hold the lock.

use std::sync::Arc;
use tracing::warn;

use crate::lock::engine::Engine;
use crate::lock::engine::registry::SlotKey;
use crate::lock::etcd::session::Session;
use crate::lock::life::detached;
use crate::lock::txn::multi_lock;
use crate::lock::txn::queue::Ticket;

/// An acquire in progress: on drop (finished, failed or cancelled) it clears its `Waiting`
/// slots and removes the queue keys that did not become a hold.
pub(in crate::lock) struct Pending<'a> {
    engine: &'a Engine,
    /// The slots it claimed, one per lock, in the request's order.
    pub slots: Vec<SlotKey>,
    /// Its keys in the queues (one per slot) and the session they are bound to, once placed;
    /// `None` again once they became a hold.
    pub keys: Option<(Vec<Ticket>, Arc<Session>)>,
}

impl<'a> Pending<'a> {
    /// An acquire that claimed `slots`.
    pub fn new(engine: &'a Engine, slots: Vec<SlotKey>) -> Self {
        Pending {
            engine,
            slots,
            keys: None,
        }
    }

    /// Leaves the queues now: removes its keys in one transaction, or in the background if
    /// etcd does not answer.
    pub async fn leave(&mut self) {
        let Some((tickets, session)) = self.keys.take() else {
            return;
        };
        if let Err(e) = multi_lock::remove(self.engine.etcd(), &tickets).await {
            warn!(key = tickets[0].key, error = %e, "could not leave the queue; retrying in the background");
            detached::spawn_removal(self.engine.clone(), tickets, session);
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        for slot in &self.slots {
            self.engine.registry().unclaim(slot);
        }
        if let Some((tickets, session)) = self.keys.take() {
            detached::spawn_removal(self.engine.clone(), tickets, session);
        }
    }
}
