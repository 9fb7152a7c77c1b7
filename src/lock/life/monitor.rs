//! The task that watches over a granted [`Hold`] until it ends.
//!
//! A hold ends by release, or it is *lost*: its key was deleted (the lock was deleted, the
//! operator revoked it), its session was lost (lease expired or revoked, keepalives failed for a
//! whole TTL), its heartbeat window passed, or its maximum hold time ran out. Whichever comes first wins under the engine's
//! registry lock, and exactly one event (`released` or `lost`) is published (see [`ending`]).
//!
//! [`ending`]: super::ending

use backon::Retryable;
use etcd_client::EventType;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{Instant, sleep, sleep_until};
use tracing::{Instrument, info, info_span, warn};

use super::deadline;
use crate::lock::bugs::{self, Bug};
use crate::lock::engine::Engine;
use crate::lock::engine::hold::Hold;
use crate::lock::error::LockError;
use crate::lock::feed::Subscription;
use crate::lock::messages::EventKind;
use crate::lock::protocol::entry::{Entry, Mode};
use crate::lock::txn::{entry_swap, queue};
use crate::retry;

/// When a new hold records its grant (`acquiredAt` in its entry), which keys behind it in a
/// semaphore's window wait for before they may be granted (see `wait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MarkWhen {
    /// Before answering: the next waiter of a semaphore wakes on this write.
    Now,
    /// Right after answering, off the handoff path: nobody waits on it now, but a raised
    /// `maxHolders` would, and `acquiredAt` should be true.
    Background,
    /// Only if the hold outlives [`MARK_DELAY`]: a mutex hold, which no waiter needs
    /// marked (none is granted beside it) unless `maxHolders` is raised meanwhile, and then
    /// only waits this long for it. Short holds never pay for the write, so a busy mutex costs
    /// two writes per grant (enqueue, release); until the mark, `acquiredAt` reads as
    /// `requestedAt`.
    Later,
}

impl MarkWhen {
    /// The policy for a grant made at once (`at_enqueue`) or after waiting, in a lock with
    /// `max_holders` slots, of a hold in `mode`.
    pub(crate) fn for_grant(at_enqueue: bool, max_holders: u32, mode: Mode) -> Self {
        // Others may be granted beside it (a semaphore, or shared holds): they wait on its mark.
        let beside = max_holders > 1 || mode == Mode::Shared;
        match (at_enqueue, beside) {
            (false, true) => MarkWhen::Now,
            (true, true) => MarkWhen::Background,
            (_, false) => MarkWhen::Later,
        }
    }
}

/// Why a hold whose session ended was lost.
pub(crate) const SESSION_LOST: &str = "its lease expired or was revoked";

/// Why a hold ended by the sidecar's shutdown was lost.
pub(crate) const SHUTDOWN: &str = "the sidecar stopped (its pod is terminating); the lease was revoked";

/// Watches `hold` until it ends; reports a loss through the engine. Records the grant (`entry`)
/// in the background when `mark` says so.
pub(crate) fn spawn_monitor(engine: Engine, hold: Arc<Hold>, mark: MarkWhen, entry: Entry) {
    let span = info_span!("hold", lock = %hold.lock, holder = %hold.holder_id, token = hold.token());
    tokio::spawn(
        async move {
            let record = record_grant(&engine, &hold, mark, entry);
            let reason = tokio::select! {
                // Biased: a release cancels `ended` before deleting the key, and that deletion
                // must not be mistaken for a loss.
                biased;
                _ = hold.ended.cancelled() => return,
                _ = hold.session.lost() => SESSION_LOST,
                reason = async { tokio::join!(record, key_deleted(&engine, &hold)).1 } => reason,
                _ = heartbeat_missed(&hold) => "no heartbeat within heartbeatTimeoutSeconds",
                reason = deadline::reached(&engine, &hold) => reason,
            };
            let reason = match reason {
                KEY_DELETED => {
                    engine.check_session(&hold.session).await;
                    engine.why_key_deleted(&hold).await
                }
                other => other,
            };
            engine.end_lost(&hold, reason).await;
        }
        .instrument(span),
    );
}

/// Writes the hold's `acquiredAt` in the background, as `mark` says.
async fn record_grant(engine: &Engine, hold: &Hold, mark: MarkWhen, entry: Entry) {
    match mark {
        MarkWhen::Now => return,
        MarkWhen::Later => sleep(MARK_DELAY).await,
        MarkWhen::Background => {}
    }
    // Guarded by the key's create revision and version: landing after the release, or after a
    // yield request written into the recorded entry, changes nothing. Retried until it lands
    // (the monitor drops this future when the hold ends): an unrecorded grant holds back every
    // key behind it in a semaphore's or readers' window. So it never fails.
    let record = || queue::mark_acquired(engine.etcd(), &hold.ticket, &entry);
    let _ = record
        .retry(retry::etcd())
        .notify(|e, _| warn!(error = %e, "could not record acquiredAt; retrying"))
        .await;
}

/// How long a mutex hold runs before it records `acquiredAt` ([`MarkWhen::Later`]). Short
/// holds never write it; a longer one writes it soon enough that the operator, which coalesces
/// a lock's changes over 50 ms, mirrors the grant and the record in one status write rather
/// than two.
const MARK_DELAY: Duration = Duration::from_millis(30);

/// Why a hold whose key disappeared was lost.
pub(crate) const KEY_DELETED: &str = "its key was deleted (lock deleted or hold revoked)";

/// Completes when the hold's key is deleted (or replaced); meanwhile tells the hold's
/// subscribers of a yield request written into its entry. The key is followed on the lock's
/// feed (see `feed/`), from the confirmed revision; a feed that started later, or one
/// followed again after it broke, is caught up with a read.
async fn key_deleted(engine: &Engine, hold: &Hold) -> &'static str {
    if bugs::on(Bug::NoKeyWatch) {
        return std::future::pending().await;
    }
    let (etcd, ticket) = (engine.etcd(), &hold.ticket);
    let mut told = None;
    loop {
        let started = Instant::now();
        let key = vec![ticket.key.clone().into_bytes()];
        match engine
            .feeds()
            .follow(&hold.lock, ticket.lease, key, hold.confirmed)
            .await
        {
            Ok(mut feed) => {
                if feed.from > hold.confirmed {
                    match entry_swap::current(etcd, ticket).await {
                        Ok(None) => return KEY_DELETED,
                        Ok(Some((entry, _))) => tell_yield(engine, hold, &entry, &mut told),
                        Err(e) => warn!(error = %e, "could not confirm the hold's key; watching anyway"),
                    }
                }
                match deletion(engine, hold, &mut feed, &mut told).await {
                    Ok(()) => return KEY_DELETED,
                    Err(e) => warn!(error = %e, "hold watch broke; re-watching"),
                }
            }
            Err(e) => warn!(error = %e, "could not watch the hold's key; retrying"),
        }
        sleep_until(started + WATCH_RETRY_GAP).await;
    }
}

/// Follows the hold's key until its deletion, telling of the yield requests written into it
/// on the way; fails if the feed breaks.
async fn deletion(
    engine: &Engine,
    hold: &Hold,
    feed: &mut Subscription,
    told: &mut Option<String>,
) -> Result<(), LockError> {
    loop {
        feed.changed().await?;
        for event in feed.take_events() {
            // A key put again under the same name comes after the deletion of this one.
            if event.event_type() == EventType::Delete {
                return Ok(());
            }
            if let Some(entry) = event.kv().and_then(|kv| Entry::decode(kv.value())) {
                tell_yield(engine, hold, &entry, told);
            }
        }
    }
}

/// Publishes a `yield` event if `entry` asks the hold to yield by a time not `told` yet.
fn tell_yield(engine: &Engine, hold: &Hold, entry: &Entry, told: &mut Option<String>) {
    let Some(by) = entry
        .yield_deadline
        .as_ref()
        .filter(|by| told.as_ref() != Some(*by))
    else {
        return;
    };
    info!(deadline = %by, "an administrator asked the holder to yield");
    engine.announce(hold, EventKind::Yield, None, Some(by.clone()));
    *told = Some(by.clone());
}

/// The least time between the starts of two watches of a hold's key: a watch that served a
/// while (a silent one is given up after 800 ms) is replaced at once, by then on another member
/// (see `Members`); one that failed at once (etcd unreachable) is not retried in a tight loop.
const WATCH_RETRY_GAP: Duration = Duration::from_millis(250);

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::engine::hold::Terms;
    use crate::lock::etcd::session::Session;
    use crate::lock::protocol::names::LockId;
    use crate::lock::txn::queue::Ticket;

    fn hold(window: Duration) -> Hold {
        let ticket = Ticket {
            key: "k".into(),
            revision: 1,
            lease: 1,
        };
        let lock = LockId::new("ns", "l").unwrap();
        let token = crate::lock::protocol::token::Token::new(0, ticket.revision).unwrap();
        Hold::new(
            lock,
            "h".into(),
            (ticket, token),
            1,
            Session::detached(15),
            window,
            Terms::exclusive_now(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_restarts_the_window_and_silence_ends_it() {
        let hold = hold(Duration::from_secs(1));
        let start = Instant::now();
        let missed = heartbeat_missed(&hold);
        tokio::pin!(missed);
        tokio::select! {
            _ = &mut missed => panic!("ended inside the window"),
            _ = sleep(Duration::from_millis(900)) => {}
        }
        hold.heartbeat();
        missed.await;
        assert_eq!(start.elapsed(), Duration::from_millis(1900));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_without_a_window_never_misses_one() {
        let hold = hold(Duration::ZERO);
        let waited = tokio::time::timeout(Duration::from_secs(3600), heartbeat_missed(&hold)).await;
        assert!(waited.is_err());
    }
}
