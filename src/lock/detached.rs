//! Writes that must outlive the request that asked for them: an enqueue run to its end even if
//! its acquire is dropped, and a queue key removed until it is gone. A client that disconnects
//! must never leave a key behind that would, once first in the queue, hold the lock.

use backon::Retryable;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::oneshot;
use tracing::{info, warn};

use super::Engine;
use super::error::{LockError, Unavailable};
use super::queue::{self, Enqueued, Ticket};
use super::session::Session;
use crate::retry;

/// Runs `enqueue` to its end in a task of its own, even if the acquire awaiting it is dropped
/// (its client went away): etcd may apply the transaction all the same, and a key that nobody
/// tracks would stay as long as the session and, once first in the queue, hold the lock. A key
/// placed for an acquire that is gone is removed as soon as the transaction answers.
pub async fn enqueue_to_completion(
    engine: &Engine,
    session: &Arc<Session>,
    enqueue: impl Future<Output = Result<Enqueued, LockError>> + Send + 'static,
) -> Result<Enqueued, LockError> {
    let (tx, rx) = oneshot::channel();
    let (engine, session) = (engine.clone(), session.clone());
    tokio::spawn(async move {
        let result = Some(enqueue.await);
        // Undelivered (the acquire is gone), the answer removes its key when dropped.
        let _ = tx.send(Answer {
            result,
            engine,
            session,
        });
    });
    match rx.await {
        Ok(mut answer) => answer.result.take().expect("answered once"),
        Err(_) => Err(Unavailable::TaskEnded.into()),
    }
}

/// An enqueue's answer on its way to the acquire that asked for it.
struct Answer {
    result: Option<Result<Enqueued, LockError>>,
    engine: Engine,
    session: Arc<Session>,
}

impl Drop for Answer {
    fn drop(&mut self) {
        // A stale key is not this request's: the acquire that gets it removes it, or the sweep.
        if let Some(Ok(Enqueued::Placed { ticket, .. })) = self.result.take() {
            spawn_removal(self.engine.clone(), ticket, self.session.clone());
        }
    }
}

/// Deletes a ticket's key, retrying while etcd is unreachable, until it is gone or its lease
/// is (then etcd deletes it). Used for abandoned waits and holds that end without release.
pub fn spawn_removal(engine: Engine, ticket: Ticket, session: Arc<Session>) {
    tokio::spawn(async move {
        let remove = || queue::remove(engine.etcd(), &ticket);
        let removed = remove
            .retry(retry::etcd())
            .when(|_| !session.is_lost())
            .notify(|e, _| warn!(key = ticket.key, error = %e, "could not remove queue key; retrying"))
            .await;
        if let Err(e) = removed {
            info!(key = ticket.key, error = %e, "session lost; etcd removes the key with the lease");
        }
    });
}
