//! Writes that must outlive the request that asked for them: an enqueue run to its end even if
//! its acquire is dropped, and a queue key removed until it is gone. A client that disconnects
//! must never leave a key behind that would, once first in the queue, hold the lock.

use backon::Retryable;
use futures::FutureExt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use tracing::{info, warn};

use super::late;
use crate::lock::engine::Engine;
use crate::lock::error::{LockError, Unavailable};
use crate::lock::etcd::Sent;
use crate::lock::etcd::session::Session;
use crate::lock::txn::multi_lock;
use crate::lock::txn::queue::Ticket;
use crate::retry;

/// Runs `enqueue` (of `keys`) to its end, even if the acquire awaiting it is dropped (its client
/// went away): etcd may apply the transaction all the same, and a key that nobody tracks would
/// stay as long as the session and, once first in the queue, hold the lock. A key placed for an
/// acquire that is gone is removed as soon as the transaction answers. An enqueue sent more
/// than once has its keys watched for late copies ([`late`](super::late)).
///
/// The enqueue runs in the acquire's own task (no task and channel per request); only an
/// acquire dropped before its answer hands the enqueue to a task of its own.
pub async fn enqueue_to_completion<T: Send + 'static>(
    engine: &Engine,
    (session, keys): (&Arc<Session>, Vec<String>),
    enqueue: impl Future<Output = Sent<T>> + Send + 'static,
    placed: fn(T) -> Vec<Ticket>,
) -> Result<T, LockError> {
    let lease = session.id;
    let (engine, session) = (engine.clone(), session.clone());
    let guarded = {
        let engine = engine.clone();
        async move {
            let sent = enqueue.await;
            if sent.copies > 1 {
                late::guard(engine, keys, lease);
            }
            sent.answer
        }
    };
    let abandoned = move |answer: Result<T, LockError>| {
        // A stale key is not this request's: the acquire that gets it removes it, or the sweep.
        spawn_removal(engine, answer.map(placed).unwrap_or_default(), session);
    };
    match finish_even_if_dropped(guarded, abandoned).await {
        Ok(answer) => answer,
        Err(_panicked) => Err(Unavailable::EnqueuePanicked.into()),
    }
}

/// Runs `work` in the caller's task and returns its output (`Err`: it panicked). Dropped
/// before `work` ends, it hands `work` to a task of its own that runs it to its end and gives
/// its output to `abandoned`.
async fn finish_even_if_dropped<T, F, A>(work: F, abandoned: A) -> std::thread::Result<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
    A: FnOnce(T) + Send + 'static,
{
    let mut unfinished = Unfinished {
        work: Some(Box::pin(work)),
        abandoned: Some(abandoned),
    };
    let work = unfinished.work.as_mut().expect("set above");
    let output = AssertUnwindSafe(work).catch_unwind().await;
    unfinished.work = None; // ended (answered or panicked): nothing to hand on
    output
}

/// Work under way in a caller's task, handed to a task of its own if the caller drops it.
struct Unfinished<F, A>
where
    F: Future<Output: Send + 'static> + Send + 'static,
    A: FnOnce(F::Output) + Send + 'static,
{
    work: Option<Pin<Box<F>>>,
    abandoned: Option<A>,
}

impl<F, A> Drop for Unfinished<F, A>
where
    F: Future<Output: Send + 'static> + Send + 'static,
    A: FnOnce(F::Output) + Send + 'static,
{
    fn drop(&mut self) {
        if let (Some(work), Some(abandoned)) = (self.work.take(), self.abandoned.take()) {
            tokio::spawn(async move { abandoned(work.await) });
        }
    }
}

/// Deletes the tickets' keys (each only while it has its create revision) in one transaction
/// ([`multi_lock::end_together`]: a multi-lock set's keys leave their queues at one revision, as they
/// entered them), retrying while etcd is unreachable, until they are gone or their lease is
/// (then etcd deletes them). Used for abandoned waits and holds that end without release.
pub fn spawn_removal(engine: Engine, tickets: Vec<Ticket>, session: Arc<Session>) {
    let Some(key) = tickets.first().map(|t| t.key.clone()) else {
        return;
    };
    tokio::spawn(async move {
        let remove = || multi_lock::end_together(engine.etcd(), &tickets);
        let removed = remove
            .retry(retry::etcd())
            .when(|_| !session.is_lost())
            .notify(|e, _| warn!(key, error = %e, "could not remove queue keys; retrying"))
            .await;
        if let Err(e) = removed {
            info!(key, error = %e, "session lost; etcd removes the keys with the lease");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Poll;
    use tokio::sync::oneshot;

    /// Work that counts its start in `started`, then ends with what `finish` sends.
    fn work(started: &Arc<AtomicUsize>) -> (oneshot::Sender<u32>, impl Future<Output = u32> + use<>) {
        let (finish, finished) = oneshot::channel();
        let started = started.clone();
        let work = async move {
            started.fetch_add(1, Ordering::SeqCst);
            finished.await.expect("the test finishes the work")
        };
        (finish, work)
    }

    #[tokio::test]
    async fn work_dropped_mid_flight_runs_to_its_end_and_its_output_is_handed_on() {
        let started = Arc::new(AtomicUsize::new(0));
        let (finish, work) = work(&started);
        let (handed, abandoned_output) = oneshot::channel();
        let mut run = Box::pin(finish_even_if_dropped(work, move |out| {
            handed.send(out).unwrap();
        }));
        assert!(matches!(futures::poll!(&mut run), Poll::Pending));
        assert_eq!(
            started.load(Ordering::SeqCst),
            1,
            "the work runs in the caller's task"
        );
        drop(run); // the caller goes away mid-flight
        finish
            .send(7)
            .expect("the work still runs after its caller is gone");
        assert_eq!(abandoned_output.await, Ok(7));
    }

    #[tokio::test]
    async fn work_that_ends_answers_its_caller_and_nothing_is_handed_on() {
        let (started, handed_on) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (finish, work) = work(&started);
        finish.send(3).unwrap();
        let counter = handed_on.clone();
        let run = finish_even_if_dropped(work, move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(run.await.ok(), Some(3));
        tokio::task::yield_now().await;
        assert_eq!(handed_on.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn work_that_panics_is_an_error_not_a_handoff() {
        let handed_on = Arc::new(AtomicUsize::new(0));
        let counter = handed_on.clone();
        let work = async { panic!("a bug in the work") };
        let run = finish_even_if_dropped::<u32, _, _>(work, move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        assert!(run.await.is_err());
        tokio::task::yield_now().await;
        assert_eq!(handed_on.load(Ordering::SeqCst), 0);
    }
}
