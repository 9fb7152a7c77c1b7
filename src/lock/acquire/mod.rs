//! Acquiring: the steps of etcd's `Mutex.Lock`, with a semaphore's window. Answer a holder
//! that already holds, claim the slot, put a key in the queue, wait for its turn (or leave the
//! queue at the deadline), start the hold.

mod ask;
pub(super) mod multi;
pub(super) mod pending;
pub(super) mod wait;

use futures::future::try_join_all;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::lock::clock;
use crate::lock::engine::Engine;
use crate::lock::engine::hold::{Hold, Terms};
use crate::lock::engine::max_hold::MaxHold;
use crate::lock::engine::registry::{Claimed, SlotKey};
use crate::lock::error::{LockError, Unavailable};
use crate::lock::etcd::Etcd;
use crate::lock::etcd::session::Session;
use crate::lock::life::detached;
use crate::lock::life::monitor::{self, MarkWhen};
use crate::lock::messages::{AcquireRequest, EventKind, Grant};
use crate::lock::protocol::entry::{Entry, rfc3339};
use crate::lock::protocol::names::{LockId, check_holder_id};
use crate::lock::protocol::token::Token;
use crate::lock::protocol::{Ask, Position, Standing};
use crate::lock::txn::handoff::{self, Chain, NextKeys};
use crate::lock::txn::queue::{self, Enqueued, Ticket};
use crate::lock::txn::settings::Declared;
use crate::lock::txn::settings::{HEARTBEAT, Settings};
use ask::{check_permits_asked, check_rejoin, checked};
use pending::Pending;
use wait::{Granted, Turn};

/// How many times an acquire puts its key again (settings changed, an earlier key of the same
/// holder in the way, the session's lease revoked) before it gives up.
const MAX_PLACEMENTS: usize = 5;

/// How long a try-once acquire waits for a holder ahead of it to record its grant (see
/// [`MarkWhen`]): a write already on its way.
const RECORDING_GRACE: Duration = Duration::from_secs(1);

/// An acquire's key in the queue.
struct Placed {
    ticket: Ticket,
    /// The token it holds with, once granted: the epoch it was enqueued under, its revision.
    token: Token,
    session: Arc<Session>,
    /// Where the key stands (`None`: not known without a read).
    standing: Option<Standing>,
    /// The hold's maximum hold time, as its entry records it.
    max_hold: MaxHold,
}

impl Placed {
    /// The revision at which the key may hold the lock at once, if it may.
    fn held(&self) -> Option<i64> {
        (self.standing.as_ref()).and_then(|s| (s.position == Position::Holder).then_some(s.revision))
    }
}

impl Engine {
    /// Acquires `req.lock` for `req.holder_id`, waiting FIFO up to `req.wait`.
    ///
    /// The steps of etcd's `Mutex.Lock`, with a semaphore's window: answer a holder that
    /// already holds, claim the slot, put a key in the queue, wait for its turn (or leave the
    /// queue at the deadline), start the hold. Dropping the returned future while it waits (a
    /// client that disconnects) removes the waiter's key at once.
    pub async fn acquire(&self, req: AcquireRequest) -> Result<Grant, LockError> {
        check_holder_id(&req.holder_id)?;
        check_permits_asked(&req)?;
        if let Some(window) = req.heartbeat_timeout_seconds {
            HEARTBEAT.check(window)?;
        }
        if !req.with.is_empty() {
            return self.acquire_set(req).await;
        }
        let slot: SlotKey = (req.lock.clone(), req.holder_id.clone());
        if let Some(hold) = self.registry().held(&slot) {
            check_rejoin(&req, &hold)?;
            if let Some(grant) = self.regrant(&hold).await? {
                return Ok(grant);
            }
        }
        let mut pending = match self.registry().claim(&slot) {
            Ok(()) => Pending::new(self, vec![slot]),
            Err(Claimed::Holds(hold)) => return check_rejoin(&req, &hold).map(|()| Grant::of(&hold)),
            Err(Claimed::Waits) => {
                return Err(LockError::AlreadyWaiting {
                    lock: req.lock,
                    holder: req.holder_id,
                });
            }
        };
        let deadline = Instant::now() + req.wait;
        let mut declared = self.declared(&req.lock, false).await?;
        let placed = self.place(&req, &mut declared, &mut pending).await?;
        let handed_on = placed.held().is_none();
        let (seen, mark) = if let Some(at) = placed.held() {
            (
                Granted {
                    at,
                    chain: vec![],
                    handed: false,
                },
                MarkWhen::for_grant(true, declared.settings.max_holders, req.mode),
            )
        } else {
            let seen = self
                .await_turn(&req, &placed, &mut declared, &mut pending, deadline)
                .await?;
            (
                seen,
                MarkWhen::for_grant(false, declared.settings.max_holders, req.mode),
            )
        };
        let grant = self.start_hold(req, pending, placed, &declared, seen, mark);
        Ok(Grant {
            handed_on,
            ..grant.await?
        })
    }

    /// Answers an acquire by a holder that already holds: the same grant while its key is
    /// still in place. A key found gone is a loss (410), never a silent new hold; `None`: the
    /// hold was released meanwhile, acquire anew.
    pub(super) async fn regrant(&self, hold: &Arc<Hold>) -> Result<Option<Grant>, LockError> {
        let ours = queue::is_ours(self.etcd(), &hold.ticket).await?;
        if hold.session.is_lost() {
            self.end_lost(hold, monitor::SESSION_LOST).await;
        } else if !ours {
            self.end_lost(hold, monitor::KEY_DELETED).await;
        }
        // Answer from the registry as it is now: the hold may have ended during the read.
        match self.registry().get_held(&hold.lock, &hold.holder_id) {
            Ok(now) => Ok(Some(Grant::of(&now))),
            Err(lost @ LockError::Lost { .. }) => Err(lost),
            Err(_) => Ok(None),
        }
    }

    /// Puts the acquire's key into the queue, under the lock's current settings and a live
    /// session; records it in `pending`, which removes it unless it becomes a hold.
    async fn place(
        &self,
        req: &AcquireRequest,
        declared: &mut Declared,
        pending: &mut Pending<'_>,
    ) -> Result<Placed, LockError> {
        for _ in 0..MAX_PLACEMENTS {
            let (lock, settings) = (std::slice::from_ref(&req.lock), std::slice::from_mut(declared));
            let (max_hold, ttl) = self
                .judged(lock, settings, |d| checked(req, d[0].settings))
                .await?;
            let s = declared.settings;
            let session = self.sessions().get(ttl).await?;
            let entry = self.entry(req, ttl, s, s.epoch, max_hold);
            let key = req.lock.entry_key(session.id, &req.holder_id);
            self.registry().placing(&pending.slots[0], &key);
            let enqueue = {
                let (etcd, lock, under) = (self.etcd().clone(), req.lock.clone(), declared.clone());
                let (lease, key) = (session.id, key.clone());
                async move { queue::enqueue(&etcd, &lock, &key, &entry, lease, &under).await }
            };
            let to = (&session, vec![key]);
            match detached::enqueue_to_completion(self, to, enqueue, Enqueued::placed).await {
                Ok(Enqueued::Placed { ticket, standing }) => {
                    pending.keys = Some((vec![ticket.clone()], session.clone()));
                    // A revision a token cannot carry: refused (the key leaves with `pending`).
                    let token = Token::new(s.epoch, ticket.revision).map_err(|source| LockError::Token {
                        lock: req.lock.clone(),
                        source,
                    })?;
                    return Ok(Placed {
                        ticket,
                        token,
                        session,
                        standing,
                        max_hold,
                    });
                }
                Ok(Enqueued::SettingsChanged(kv)) => {
                    let found = kv.as_ref().map(Declared::from_kv).transpose()?;
                    *declared = self.remember(&req.lock, found)?;
                }
                Ok(Enqueued::Stale(old)) => {
                    warn!(
                        key = old.key,
                        revision = old.revision,
                        "removing an earlier key of this holder that no acquire tracks"
                    );
                    queue::remove(self.etcd(), &old).await?;
                }
                Err(LockError::LeaseNotFound(e)) => session.end(&format!("etcd: {e}")),
                Err(LockError::Forbidden(_)) if self.sessions().poisoned(&session).await => {}
                Err(e) => return Err(e),
            }
        }
        Err(Unavailable::NotPlaced {
            lock: req.lock.clone(),
            attempts: MAX_PLACEMENTS,
        }
        .into())
    }

    /// `check`s what an acquire asks of `locks` against their settings `declared`, which may be
    /// the cache's. A grant needs no more: its transaction is guarded by the settings' mod
    /// revision. A refusal is confirmed on the settings read afresh, which refreshes the cache,
    /// and judged again if they changed (#54 F3: nothing else on this path reads them, and
    /// permits 3 were refused "maxHolders 2" after a raise to 4, again and again).
    async fn judged<T>(
        &self,
        locks: &[LockId],
        declared: &mut [Declared],
        check: impl Fn(&[Declared]) -> Result<T, LockError>,
    ) -> Result<T, LockError> {
        let refused = match check(declared) {
            Ok(asked) => return Ok(asked),
            Err(refused) => refused,
        };
        let fresh = try_join_all(locks.iter().map(|l| self.declared(l, true))).await?;
        if fresh[..] == *declared {
            return Err(refused);
        }
        declared.clone_from_slice(&fresh);
        check(declared)
    }

    /// Waits for the placed key's turn; returns the revision at which it was granted and the
    /// keys behind it it knows (its chain). At the deadline it leaves the queue and answers
    /// `lock_held`.
    async fn await_turn(
        &self,
        req: &AcquireRequest,
        placed: &Placed,
        declared: &mut Declared,
        pending: &mut Pending<'_>,
        deadline: Instant,
    ) -> Result<Granted, LockError> {
        let start = placed.standing.clone();
        let deadline = match (
            start.as_ref().map(|s| (&s.position, s.recording)),
            req.wait.is_zero(),
        ) {
            // Try-once with a free slot, behind a holder whose grant is still being recorded
            // (granted a moment ago): that is bookkeeping, not a held lock. (Behind a
            // multi-lock key waiting for its other locks, it is a wait like any other.)
            (Some((Position::BehindUngranted(_), true)), true) => Instant::now() + RECORDING_GRACE,
            // Try-once, and the enqueue said it waits: no need to read again.
            (Some(_), true) => return Err(self.give_up(&req.lock, req.wait, pending).await),
            _ => deadline,
        };
        let ticket = &placed.ticket;
        let asked = Ask {
            mode: req.mode,
            permits: req.permits,
        };
        let turn = wait::wait_turn(self, &req.lock, (ticket, asked), declared, deadline, start).await?;
        match turn {
            Turn::Granted(granted) => Ok(granted),
            Turn::Gone => Err(self.vanished(&req.lock, &placed.session).await),
            Turn::TimedOut => Err(self.give_up(&req.lock, req.wait, pending).await),
            // maxHolders was lowered below the permits asked for while the key waited.
            Turn::TooLarge => {
                pending.leave().await;
                Err(ask::above_permits(&req.lock, req.permits, declared.settings))
            }
        }
    }

    /// Leaves the queue after a wait (of `waited`) for `lock` timed out, and says who holds it.
    pub(super) async fn give_up(
        &self,
        lock: &LockId,
        waited: Duration,
        pending: &mut Pending<'_>,
    ) -> LockError {
        // Leave the queue before answering, so the 409 means "no trace left".
        pending.leave().await;
        let holders = self.inspect(lock).await.map(|i| i.holders).unwrap_or_default();
        let why = if waited.is_zero() {
            String::new()
        } else {
            format!("; waited {waited:?}")
        };
        LockError::Held {
            lock: lock.clone(),
            holders,
            why,
        }
    }

    /// Turns a granted key into a hold: records its grant (now, or in the background), checks
    /// its lease is sound, registers it and starts watching over it.
    async fn start_hold(
        &self,
        req: AcquireRequest,
        mut pending: Pending<'_>,
        placed: Placed,
        declared: &Declared,
        seen: Granted,
        mark: MarkWhen,
    ) -> Result<Grant, LockError> {
        let settings = declared.settings;
        let Placed {
            ticket,
            token,
            session,
            max_hold,
            ..
        } = placed;
        let confirmed = seen.at;
        let mut entry = self.entry(&req, session.ttl, settings, token.epoch(), max_hold);
        // Stamped before the grant is recorded in etcd (which may admit the next waiter of a
        // semaphore), and answered as the same instant etcd shows: grants' `acquiredAt` then
        // follow the order the lock made them in, whichever answer arrives first.
        let acquired_at = clock::now();
        entry.acquired_at = Some(rfc3339(acquired_at));
        if mark == MarkWhen::Now && !queue::mark_acquired(self.etcd(), &ticket, &entry).await? {
            return Err(self.vanished(&req.lock, &session).await);
        }
        check_lease(&session)?;
        let heartbeat = req
            .heartbeat_timeout_seconds
            .unwrap_or(settings.heartbeat_timeout_seconds);
        let terms = Terms {
            acquired_at,
            mode: req.mode,
            permits: req.permits,
            connection_bound: req.connection_bound,
            chain: next_keys(self.etcd(), (&req.lock, &ticket), declared, entry.ask(), seen),
            set: vec![],
            max_hold: max_hold.start(acquired_at),
        };
        let hold = Arc::new(Hold::new(
            req.lock,
            req.holder_id,
            (ticket, token),
            confirmed,
            session,
            Duration::from_secs(heartbeat.into()),
            terms,
        ));
        pending.keys = None;
        self.registry().hold(pending.slots[0].clone(), hold.clone());
        debug!(lock = %hold.lock, holder = %hold.holder_id, token = hold.token(), "acquired");
        self.publish(&hold, EventKind::Acquired, None);
        monitor::spawn_monitor(self.clone(), hold.clone(), mark, entry);
        Ok(Grant::of(&hold))
    }

    /// The entry of `req`'s key, enqueued under token epoch `epoch`, with its maximum hold time.
    pub(super) fn entry(
        &self,
        req: &AcquireRequest,
        ttl: u32,
        s: Settings,
        epoch: u32,
        max_hold: MaxHold,
    ) -> Entry {
        Entry {
            holder_id: req.holder_id.clone(),
            pod: self.pod().clone(),
            requested_at: rfc3339(clock::now()),
            acquired_at: None,
            ttl_seconds: ttl,
            heartbeat_timeout_seconds: req
                .heartbeat_timeout_seconds
                .unwrap_or(s.heartbeat_timeout_seconds),
            max_hold_seconds: max_hold.seconds,
            container: req.container.clone(),
            mode: req.mode,
            permits: req.permits,
            epoch,
            handed: false,
            next: vec![],
            with: vec![],
            yield_deadline: None,
        }
    }

    /// The error for a waiter whose key disappeared: the lock was deleted, or its lease ended.
    /// A lease that etcd no longer has ends its session at once, so that the next acquire
    /// starts a new one instead of failing until a keepalive notices.
    pub(super) async fn vanished(&self, lock: &LockId, session: &Session) -> LockError {
        self.check_session(session).await;
        match self.declared(lock, true).await {
            Err(e) => e,
            Ok(_) => Unavailable::Vanished.into(),
        }
    }
}

/// A hold must start with most of its lease confirmed: if keepalives have been failing, the
/// lease may end any moment and the lock move on while the app believes it holds.
pub(super) fn check_lease(session: &Session) -> Result<(), LockError> {
    let confirmed = session.expires_at().saturating_duration_since(Instant::now());
    if session.is_lost() || confirmed < Duration::from_secs(session.ttl.into()) / 2 {
        return Err(Unavailable::LeaseUnconfirmed(confirmed).into());
    }
    Ok(())
}

/// What the hold of `ticket` granted under `declared` may hand on with: the chain its grant
/// came with, or, for a grant handed on without one, the keys behind it read now (see
/// [`NextKeys`]).
fn next_keys(
    etcd: &Etcd,
    (lock, ticket): (&LockId, &Ticket),
    declared: &Declared,
    ask: Ask,
    seen: Granted,
) -> NextKeys {
    match seen.handed && seen.chain.is_empty() && handoff::possible(ask.mode) {
        true => NextKeys::read(etcd, lock, ticket, declared, ask),
        false => NextKeys::known(Chain::of(declared, ask, seen.chain)),
    }
}
