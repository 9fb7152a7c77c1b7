//! Delivery of [`HoldEvent`]s to subscribers. Each subscriber has a queue of its own, filtered
//! by lock, so a busy lock never crowds a quiet one's `lost` out of a shared buffer. A
//! subscriber that falls [`CAPACITY`] events behind is dropped rather than skipped over: its
//! stream ends, and a client that sees its stream end must treat its holds as lost (every
//! client podlock ships does), so no `lost` can go unnoticed.

use std::sync::Mutex;
use tokio::sync::mpsc::{self, error::TrySendError};
use tracing::warn;

use crate::lock::messages::HoldEvent;
use crate::lock::protocol::names::LockId;

/// How many undelivered events a subscriber may have.
pub const CAPACITY: usize = 1024;

type Subscriber = (Option<LockId>, mpsc::Sender<HoldEvent>);

/// The subscribers of one engine.
#[derive(Default)]
pub(crate) struct Subscribers(Mutex<Vec<Subscriber>>);

impl Subscribers {
    /// A new subscriber to the events of `lock` (all locks when `None`).
    pub fn subscribe(&self, lock: Option<LockId>) -> mpsc::Receiver<HoldEvent> {
        let (tx, rx) = mpsc::channel(CAPACITY);
        self.0.lock().unwrap().push((lock, tx));
        rx
    }

    /// Ends every subscriber's stream (at shutdown, after the last events).
    pub fn close(&self) {
        self.0.lock().unwrap().clear();
    }

    /// Queues `event` (about `lock`) for every subscriber of it; drops the ones that are full
    /// or gone.
    pub fn publish(&self, lock: &LockId, event: &HoldEvent) {
        self.0.lock().unwrap().retain(|(filter, tx)| {
            if filter.as_ref().is_some_and(|f| f != lock) {
                return !tx.is_closed();
            }
            match tx.try_send(event.clone()) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    warn!(lock = %lock, "an events subscriber fell {CAPACITY} events behind; ending its stream");
                    false
                }
                Err(TrySendError::Closed(_)) => false,
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::messages::EventKind;

    fn event(lock: &LockId, kind: EventKind) -> HoldEvent {
        HoldEvent {
            kind,
            lock: lock.clone(),
            holder_id: "h".into(),
            fencing_token: 1,
            mode: crate::lock::protocol::entry::Mode::Exclusive,
            reason: None,
            deadline: None,
            at: String::new(),
        }
    }

    #[tokio::test]
    async fn a_busy_lock_cannot_crowd_out_a_quiet_ones_lost() {
        let (busy, quiet) = (
            LockId::new("ns", "busy").unwrap(),
            LockId::new("ns", "quiet").unwrap(),
        );
        let subscribers = Subscribers::default();
        let mut quiet_rx = subscribers.subscribe(Some(quiet.clone()));
        for _ in 0..10 * CAPACITY {
            subscribers.publish(&busy, &event(&busy, EventKind::Acquired));
        }
        subscribers.publish(&quiet, &event(&quiet, EventKind::Lost));
        assert_eq!(quiet_rx.recv().await.unwrap().kind, EventKind::Lost);
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_ended_not_skipped() {
        let lock = LockId::new("ns", "l").unwrap();
        let subscribers = Subscribers::default();
        let mut rx = subscribers.subscribe(Some(lock.clone()));
        for _ in 0..=CAPACITY {
            subscribers.publish(&lock, &event(&lock, EventKind::Acquired));
        }
        subscribers.publish(&lock, &event(&lock, EventKind::Lost));
        let mut received = vec![];
        while let Some(ev) = rx.recv().await {
            received.push(ev.kind);
        }
        // The stream ended after what fitted: the client then treats its holds as lost.
        assert_eq!(received.len(), CAPACITY);
        assert!(!received.contains(&EventKind::Lost));
    }
}
