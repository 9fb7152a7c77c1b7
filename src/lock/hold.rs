//! A granted hold and the task that watches over it until it ends.
//!
//! A hold ends by release, or it is *lost*: its key was deleted (the lock was deleted, the
//! operator revoked it), its session was lost (lease expired or revoked, keepalives failed for a
//! whole TTL), or its heartbeat window passed. Whichever comes first wins under the engine's
//! registry lock, and exactly one event (`released` or `lost`) is published.

use etcd_client::WatchFilterType;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{oneshot, watch};
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use super::keys::LockId;
use super::queue::{self, Enqueued, Ticket};
use super::session::Session;
use super::{Engine, EventKind, LockError, Slot};

/// One granted hold of this sidecar.
#[derive(Debug)]
pub struct Hold {
    /// The lock held.
    pub lock: LockId,
    /// The holder id.
    pub holder_id: String,
    /// The queue key; its create revision is the fencing token.
    pub ticket: Ticket,
    /// A revision at which the key was known to be in place: its watch starts after it.
    pub confirmed: i64,
    /// The session whose lease the key is bound to.
    pub session: Arc<Session>,
    /// When the hold began.
    pub acquired_at: SystemTime,
    /// The heartbeat window (zero: none).
    pub heartbeat: Duration,
    deadline: watch::Sender<Instant>,
    /// Cancelled when the hold ends, by release or loss.
    pub ended: CancellationToken,
}

impl Hold {
    /// A new hold; its heartbeat window (if any) starts now.
    pub fn new(
        lock: LockId,
        holder_id: String,
        ticket: Ticket,
        confirmed: i64,
        session: Arc<Session>,
        heartbeat: Duration,
    ) -> Self {
        let (deadline, _) = watch::channel(Instant::now() + heartbeat);
        Hold {
            lock,
            holder_id,
            ticket,
            confirmed,
            session,
            acquired_at: SystemTime::now(),
            heartbeat,
            deadline,
            ended: CancellationToken::new(),
        }
    }

    /// The fencing token.
    pub fn token(&self) -> i64 {
        self.ticket.revision
    }

    /// Restarts the heartbeat window; returns when the hold will end without another heartbeat
    /// (for a hold without a window: when its lease may expire without keepalives).
    pub fn heartbeat(&self) -> SystemTime {
        if self.heartbeat.is_zero() {
            let left = self
                .session
                .expires_at()
                .saturating_duration_since(Instant::now());
            return SystemTime::now() + left;
        }
        self.deadline.send_replace(Instant::now() + self.heartbeat);
        SystemTime::now() + self.heartbeat
    }
}

/// Watches `hold` until it ends; reports a loss through the engine.
pub fn spawn_monitor(engine: Engine, hold: Arc<Hold>) {
    let span = info_span!("hold", lock = %hold.lock, holder = %hold.holder_id, token = hold.token());
    tokio::spawn(
        async move {
            let reason = tokio::select! {
                _ = hold.ended.cancelled() => return,
                _ = hold.session.lost() => "its lease expired or was revoked",
                reason = key_deleted(&engine, &hold) => reason,
                _ = heartbeat_missed(&hold) => "no heartbeat within heartbeatTimeoutSeconds",
            };
            engine.end_lost(&hold, reason).await;
        }
        .instrument(span),
    );
}

/// How long a hold runs before its key is watched. Most holds of a busy lock are shorter, and
/// a watch from the confirmed revision still sees a deletion in this gap: it only arrives
/// later, well within the 1 s the contract allows for a `lost` notice.
const KEY_WATCH_DELAY: Duration = Duration::from_millis(100);

/// Why a hold whose key disappeared was lost.
pub(crate) const KEY_DELETED: &str = "its key was deleted (lock deleted or hold revoked)";

/// Completes when the hold's key is deleted (or replaced).
async fn key_deleted(engine: &Engine, hold: &Hold) -> &'static str {
    let (etcd, ticket) = (engine.etcd(), &hold.ticket);
    sleep(KEY_WATCH_DELAY).await;
    // First from the confirmed revision; after a broken watch, from now, with a read.
    let mut from = Some(hold.confirmed + 1);
    loop {
        let key = [ticket.key.clone().into_bytes()];
        match etcd
            .watch_keys(&key, &[WatchFilterType::NoPut], from.take())
            .await
        {
            Ok(mut w) => {
                if w.start_revision != hold.confirmed {
                    match queue::is_ours(etcd, ticket).await {
                        Ok(false) => return KEY_DELETED,
                        Ok(true) => {}
                        Err(e) => warn!(error = %e, "could not confirm the hold's key; watching anyway"),
                    }
                }
                match w.changed().await {
                    Ok(()) => return KEY_DELETED,
                    Err(e) => warn!(error = %e, "hold watch broke; re-watching"),
                }
            }
            Err(e) => warn!(error = %e, "could not watch the hold's key; retrying"),
        }
        sleep(Duration::from_millis(250)).await;
    }
}

/// Completes when the heartbeat window passes without a heartbeat; never for a hold without one.
async fn heartbeat_missed(hold: &Hold) {
    if hold.heartbeat.is_zero() {
        return std::future::pending().await;
    }
    let mut deadline = hold.deadline.subscribe();
    loop {
        let at = *deadline.borrow_and_update();
        tokio::select! {
            _ = sleep_until(at) => {
                if *deadline.borrow() <= Instant::now() {
                    return;
                }
            }
            _ = deadline.changed() => {}
        }
    }
}

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
        Err(_) => Err(LockError::Unavailable("the enqueue task failed".into())),
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
        if let Some(Ok(Enqueued::Placed { ticket, .. })) = self.result.take() {
            spawn_removal(self.engine.clone(), ticket, self.session.clone());
        }
    }
}

/// Deletes a ticket's key, retrying while etcd is unreachable, until it is gone or its lease
/// is (then etcd deletes it). Used for abandoned waits and holds that end without release.
pub fn spawn_removal(engine: Engine, ticket: Ticket, session: Arc<Session>) {
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(100);
        loop {
            match queue::remove(engine.etcd(), &ticket).await {
                Ok(_) => return,
                Err(e) if session.is_lost() => {
                    info!(key = ticket.key, error = %e, "session lost; etcd removes the key with the lease");
                    return;
                }
                Err(e) => warn!(key = ticket.key, error = %e, "could not remove queue key; retrying"),
            }
            sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    });
}

/// Ending holds: release, heartbeat, loss and shutdown.
impl Engine {
    /// Takes the slot of `lock`/`holder` if it holds; otherwise says why not.
    fn take_held(&self, lock: &LockId, holder: &str) -> Result<Arc<Hold>, LockError> {
        let mut reg = self.0.registry.lock().unwrap();
        let key = (lock.clone(), holder.to_string());
        match reg.remove(&key) {
            Some(Slot::Held(h)) => Ok(h),
            other => {
                let why = match &other {
                    Some(Slot::Lost { token, reason }) => {
                        format!("; its hold (token {token}) was lost: {reason}")
                    }
                    Some(Slot::Waiting) => "; it is still waiting".into(),
                    _ => String::new(),
                };
                if let Some(slot) = other {
                    reg.insert(key, slot);
                }
                Err(LockError::NotHolder {
                    lock: lock.clone(),
                    holder: holder.into(),
                    why,
                })
            }
        }
    }

    /// Releases a hold: deletes its key (guarded by its create revision) and ends it.
    pub async fn release(&self, lock: &LockId, holder: &str) -> Result<(), LockError> {
        let hold = self.take_held(lock, holder)?;
        hold.ended.cancel();
        if let Err(e) = queue::remove(&self.0.etcd, &hold.ticket).await {
            warn!(lock = %lock, holder, error = %e, "release could not reach etcd; retrying in the background");
            spawn_removal(self.clone(), hold.ticket.clone(), hold.session.clone());
        }
        info!(lock = %lock, holder, token = hold.token(), "released");
        self.publish(&hold, EventKind::Released, None);
        Ok(())
    }

    /// Restarts a hold's heartbeat window; returns when it will expire.
    pub fn heartbeat(&self, lock: &LockId, holder: &str) -> Result<SystemTime, LockError> {
        let reg = self.0.registry.lock().unwrap();
        match reg.get(&(lock.clone(), holder.to_string())) {
            Some(Slot::Held(h)) => Ok(h.heartbeat()),
            Some(Slot::Lost { reason, .. }) => Err(LockError::Lost {
                lock: lock.clone(),
                holder: holder.into(),
                reason: reason.clone(),
            }),
            _ => Err(LockError::NotHolder {
                lock: lock.clone(),
                holder: holder.into(),
                why: String::new(),
            }),
        }
    }

    /// Ends `hold` as lost (called by its monitor), unless it already ended.
    pub(crate) async fn end_lost(&self, hold: &Arc<Hold>, reason: &str) {
        {
            let mut reg = self.0.registry.lock().unwrap();
            let key = (hold.lock.clone(), hold.holder_id.clone());
            match reg.get(&key) {
                Some(Slot::Held(h)) if Arc::ptr_eq(h, hold) => {
                    reg.insert(
                        key,
                        Slot::Lost {
                            token: hold.token(),
                            reason: reason.into(),
                        },
                    );
                }
                _ => return,
            }
        }
        hold.ended.cancel();
        warn!(lock = %hold.lock, holder = %hold.holder_id, token = hold.token(), reason, "hold lost");
        self.publish(hold, EventKind::Lost, Some(reason.into()));
        spawn_removal(self.clone(), hold.ticket.clone(), hold.session.clone());
    }

    /// Ends every hold and wait at once by revoking this sidecar's leases (on SIGTERM).
    pub async fn shutdown(&self) {
        let holds: Vec<Arc<Hold>> = self
            .0
            .registry
            .lock()
            .unwrap()
            .drain()
            .filter_map(|(_, s)| if let Slot::Held(h) = s { Some(h) } else { None })
            .collect();
        for h in &holds {
            h.ended.cancel();
        }
        self.0.sessions.close().await;
        for h in &holds {
            self.publish(h, EventKind::Released, None);
        }
        info!(released = holds.len(), "released every hold");
    }
}
