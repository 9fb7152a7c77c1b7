//! A granted hold of this sidecar: what it holds and how, and its heartbeat window. The task
//! that watches over it lives in [`monitor`](crate::lock::life::monitor).

use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::max_hold::Deadline;
use crate::lock::clock;
use crate::lock::etcd::session::Session;
use crate::lock::messages::{Grant, LockToken};
use crate::lock::protocol::entry::Mode;
use crate::lock::protocol::entry::rfc3339;
use crate::lock::protocol::names::LockId;
use crate::lock::protocol::token::Token;
use crate::lock::txn::handoff::NextKeys;
use crate::lock::txn::queue::Ticket;

/// One granted hold of this sidecar.
#[derive(Debug)]
pub struct Hold {
    /// The lock held.
    pub lock: LockId,
    /// The holder id.
    pub holder_id: String,
    /// The queue key.
    pub ticket: Ticket,
    /// The fencing token: the epoch its key was enqueued under and the key's create revision.
    pub fencing: Token,
    /// A revision at which the key was known to be in place: its watch starts after it.
    pub confirmed: i64,
    /// The session whose lease the key is bound to.
    pub session: Arc<Session>,
    /// The heartbeat window (zero: none).
    pub heartbeat: Duration,
    /// How it holds, decided with its grant and fixed for its life.
    pub terms: Terms,
    /// When the heartbeat window ends; each heartbeat moves it.
    pub(in crate::lock) deadline: watch::Sender<Instant>,
    /// Cancelled when the hold ends, by release or loss.
    pub ended: CancellationToken,
    /// Taken by a release of the hold (of its set, on the set's first lock) for as long as it
    /// runs: a second release at once waits for the first's answer (#54 F14).
    pub(in crate::lock) releasing: tokio::sync::Mutex<()>,
}

/// How a hold holds, decided with its grant and fixed for its life.
#[derive(Debug, Clone)]
pub struct Terms {
    /// When the hold began.
    pub acquired_at: SystemTime,
    /// Exclusive, or shared with other shared holds.
    pub mode: Mode,
    /// How many of the lock's slots it takes.
    pub permits: u32,
    /// Bound to the HTTP connection that asked for it (`POST .../hold`): that connection owns
    /// it, so no other request may take it over by naming its holder id.
    pub connection_bound: bool,
    /// What its release may hand the lock on with (see [`handoff`](crate::lock::txn::handoff)).
    pub chain: NextKeys,
    /// A multi-lock hold's whole set, this lock among them, each with its token (see
    /// [`multi`](crate::lock::acquire::multi)); empty for a single lock. Released, heartbeated
    /// and lost as one.
    pub set: Vec<(LockId, Token)>,
    /// Its deadline, if it has a maximum hold time.
    pub max_hold: Option<Deadline>,
}

#[cfg(test)]
impl Terms {
    /// An exclusive hold of one lock, begun now, bound to no connection, with no handoff.
    pub fn exclusive_now() -> Self {
        Terms {
            acquired_at: clock::now(),
            mode: Mode::Exclusive,
            permits: 1,
            connection_bound: false,
            chain: NextKeys::known(None),
            set: vec![],
            max_hold: None,
        }
    }
}

impl Hold {
    /// A new hold with token `fencing`, held on `terms`; its heartbeat window (if any) starts
    /// now.
    pub fn new(
        lock: LockId,
        holder_id: String,
        (ticket, fencing): (Ticket, Token),
        confirmed: i64,
        session: Arc<Session>,
        heartbeat: Duration,
        terms: Terms,
    ) -> Self {
        let (deadline, _) = watch::channel(Instant::now() + heartbeat);
        Hold {
            lock,
            holder_id,
            ticket,
            fencing,
            confirmed,
            session,
            heartbeat,
            terms,
            deadline,
            ended: CancellationToken::new(),
            releasing: tokio::sync::Mutex::new(()),
        }
    }

    /// The fencing token, as handed out.
    pub fn token(&self) -> i64 {
        self.fencing.get()
    }

    /// Restarts the heartbeat window; returns when the hold will end without another heartbeat
    /// (for a hold without a window: when its lease may expire without keepalives), or at its
    /// deadline if that comes first.
    pub fn heartbeat(&self) -> SystemTime {
        let expires = if self.heartbeat.is_zero() {
            let left = self
                .session
                .expires_at()
                .saturating_duration_since(Instant::now());
            clock::now() + left
        } else {
            self.deadline.send_replace(Instant::now() + self.heartbeat);
            clock::now() + self.heartbeat
        };
        // No heartbeat keeps a hold past its maximum hold time.
        self.terms.max_hold.map_or(expires, |d| expires.min(d.wall))
    }
}

impl Grant {
    pub(crate) fn of(hold: &Hold) -> Self {
        Grant {
            lock: hold.lock.clone(),
            holder_id: hold.holder_id.clone(),
            fencing_token: hold.token(),
            lease_id: hold.ticket.lease,
            ttl_seconds: hold.session.ttl,
            heartbeat_timeout_seconds: hold.heartbeat.as_secs() as u32,
            acquired_at: rfc3339(hold.terms.acquired_at),
            max_hold_seconds: hold.terms.max_hold.map(|d| d.seconds),
            deadline: hold.terms.max_hold.map(|d| rfc3339(d.wall)),
            mode: hold.terms.mode,
            permits: hold.terms.permits,
            handed_on: false,
            locks: (hold.terms.set.iter())
                .map(|(lock, token)| LockToken {
                    lock: lock.name.clone(),
                    fencing_token: token.get(),
                })
                .collect(),
        }
    }
}
