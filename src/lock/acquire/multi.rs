//! Multi-lock acquires: several locks of a namespace taken as one (docs/design.md, "Several
//! locks at once"; the protocol model's `multi` runs).
//!
//! The request puts a key in every lock's queue in one transaction, so its keys share one
//! create revision: one place in a single order over all queues, and one fencing token (but
//! where the locks' token epochs differ). A key waits only for keys with lower revisions, in
//! every queue, so no cycle of waiters can form, whatever the order or overlap of the sets. It
//! waits for its turn on every lock at once, each by the single-lock rule ([`wait`]), and
//! records its grant on all its keys in one transaction guarded by its keys and by the settings
//! each turn was decided under ([`multi_lock::record`]): only then does it hold, and only then may the
//! keys behind it on a semaphore pass it. No release hands it a grant and it hands none on.
//!
//! Its holds are one per lock, linked by [`Hold::set`]: a release or heartbeat of any of them
//! acts on all, and the loss of one ends the others (see [`ending`](crate::lock::life::ending)).

use futures::future::try_join_all;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;
use tracing::debug;

use super::ask::{check_rejoin, check_set, checked_set};
use super::pending::Pending;
use super::wait::{self, Turn};
use crate::lock::clock;
use crate::lock::engine::Engine;
use crate::lock::engine::hold::{Hold, Terms};
use crate::lock::engine::max_hold::MaxHold;
use crate::lock::engine::registry::Claimed;
use crate::lock::error::{LockError, Unavailable};
use crate::lock::etcd::session::Session;
use crate::lock::life::detached;
use crate::lock::life::monitor::{self, MarkWhen};
use crate::lock::messages::{AcquireRequest, EventKind, Grant};
use crate::lock::protocol::Ask;
use crate::lock::protocol::entry::{Entry, rfc3339};
use crate::lock::protocol::names::LockId;
use crate::lock::protocol::token::Token;
use crate::lock::txn::handoff::NextKeys;
use crate::lock::txn::multi_lock::{self, EnqueuedSet, members};
use crate::lock::txn::queue::Ticket;
use crate::lock::txn::settings::{Declared, TTL};

/// How many times a multi-lock acquire puts its keys again before it gives up (as a single one).
const MAX_PLACEMENTS: usize = 5;

/// A set's keys in the queues, all of one create revision.
struct Placed {
    tickets: Vec<Ticket>,
    session: Arc<Session>,
    /// Each lock's token epoch when the keys were enqueued: their tokens' epochs.
    epochs: Vec<u32>,
    /// The set's maximum hold time: the request's, within every lock's, else the strictest.
    max_hold: MaxHold,
}

/// Why a set's wait ended without every turn.
enum Stop {
    Gone,
    TimedOut(usize),
    Failed(LockError),
}

impl Engine {
    /// Acquires `req.lock` and every lock of `req.with` as one (see the module's doc).
    pub(in crate::lock) async fn acquire_set(&self, req: AcquireRequest) -> Result<Grant, LockError> {
        let locks = check_set(&req)?;
        let mut pending = loop {
            match self.claim_set(&req, &locks)? {
                Ok(pending) => break pending,
                Err(held) => {
                    if let Some(grant) = self.rejoin_set(&req, &held).await? {
                        return Ok(grant);
                    } // released meanwhile: claim again
                }
            }
        };
        let deadline = Instant::now() + req.wait;
        let mut declared = try_join_all(locks.iter().map(|l| self.declared(l, false))).await?;
        let placed = self.place_set(&req, &locks, &mut declared, &mut pending).await?;
        loop {
            let at = match self
                .wait_set(&req, &locks, &placed, &mut declared, deadline)
                .await
            {
                Ok(at) => at,
                Err(Stop::Failed(e)) => return Err(e),
                Err(Stop::Gone) => return Err(self.vanished(&req.lock, &placed.session).await),
                Err(Stop::TimedOut(i)) => return Err(self.give_up(&locks[i], req.wait, &mut pending).await),
            };
            let acquired_at = clock::now();
            let entries = self.set_entries(&req, &locks, &declared, &placed, Some(acquired_at));
            let members = members(&locks, &declared, &placed.tickets);
            if multi_lock::record(self.etcd(), &members, &placed.tickets, &entries).await? {
                return self.start_set(req, &locks, &declared, pending, placed, (at, acquired_at));
            }
            // A key gone fails the acquire; settings changed under a turn: wait again.
            let stale = try_join_all(locks.iter().map(|l| self.declared(l, true))).await?;
            if stale == declared {
                return Err(self.vanished(&req.lock, &placed.session).await);
            }
            declared = stale;
        }
    }

    /// Claims the slot of every lock of the set; `Err(hold)`: the holder already holds one of
    /// them (answered by [`Engine::rejoin_set`]).
    fn claim_set(
        &self,
        req: &AcquireRequest,
        locks: &[LockId],
    ) -> Result<Result<Pending<'_>, Arc<Hold>>, LockError> {
        let mut pending = Pending::new(self, vec![]);
        for lock in locks {
            let slot = (lock.clone(), req.holder_id.clone());
            match self.registry().claim(&slot) {
                Ok(()) => pending.slots.push(slot),
                Err(Claimed::Holds(hold)) => return Ok(Err(hold)),
                Err(Claimed::Waits) => {
                    return Err(LockError::AlreadyWaiting {
                        lock: lock.clone(),
                        holder: req.holder_id.clone(),
                    });
                }
            }
        }
        Ok(Ok(pending))
    }

    /// Answers a multi-lock acquire by a holder that already holds `held`: its grant if it is
    /// a hold of the same set, in the same way (see the contract's "Holder identity");
    /// `None`: it was released meanwhile.
    async fn rejoin_set(&self, req: &AcquireRequest, held: &Arc<Hold>) -> Result<Option<Grant>, LockError> {
        let mut asked: Vec<&str> = std::iter::once(&req.lock)
            .chain(&req.with)
            .map(|l| l.name.as_str())
            .collect();
        let mut has: Vec<&str> = held.terms.set.iter().map(|(l, _)| l.name.as_str()).collect();
        asked.sort();
        has.sort();
        if asked != has {
            return Err(LockError::HolderInUse {
                lock: held.lock.clone(),
                holder: req.holder_id.clone(),
                why: format!(
                    "; it holds {} as part of [{}]: release it first",
                    held.lock.name,
                    has.join(", ")
                ),
            });
        }
        check_rejoin(req, held)?;
        self.regrant(held).await
    }

    /// Puts the set's keys into their queues (see [`multi_lock::enqueue`]), under the locks' current
    /// settings and a live session; records them in `pending`.
    async fn place_set(
        &self,
        req: &AcquireRequest,
        locks: &[LockId],
        declared: &mut [Declared],
        pending: &mut Pending<'_>,
    ) -> Result<Placed, LockError> {
        for _ in 0..MAX_PLACEMENTS {
            let placed = self.draft(req, locks, declared).await?;
            for (slot, t) in pending.slots.iter().zip(&placed.tickets) {
                self.registry().placing(slot, &t.key);
            }
            let entries = self.set_entries(req, locks, declared, &placed, None);
            let enqueue = {
                let (etcd, locks, declared) = (self.etcd().clone(), locks.to_vec(), declared.to_vec());
                let (keys, lease) = (placed.tickets.clone(), placed.session.id);
                async move {
                    multi_lock::enqueue(&etcd, &members(&locks, &declared, &keys), &entries, lease).await
                }
            };
            let to = (
                &placed.session,
                placed.tickets.iter().map(|t| t.key.clone()).collect(),
            );
            match detached::enqueue_to_completion(self, to, enqueue, EnqueuedSet::placed).await {
                Ok(EnqueuedSet::Placed(tickets)) => {
                    pending.keys = Some((tickets.clone(), placed.session.clone()));
                    let placed = Placed { tickets, ..placed };
                    tokens(locks, &placed)?; // a revision no token carries: refused
                    return Ok(placed);
                }
                Ok(EnqueuedSet::SettingsChanged(changed)) => {
                    for (i, kv) in changed {
                        let found = kv.as_ref().map(Declared::from_kv).transpose()?;
                        declared[i] = self.remember(&locks[i], found)?;
                    }
                }
                Ok(EnqueuedSet::Stale(old)) => {
                    multi_lock::remove(self.etcd(), &old).await?;
                }
                Err(LockError::LeaseNotFound(e)) => placed.session.end(&format!("etcd: {e}")),
                Err(LockError::Forbidden(_)) if self.sessions().poisoned(&placed.session).await => {}
                Err(e) => return Err(e),
            }
        }
        Err(Unavailable::NotPlaced {
            lock: req.lock.clone(),
            attempts: MAX_PLACEMENTS,
        }
        .into())
    }

    /// The set's keys as they are to be put (revision 0 until they are), under the locks'
    /// settings `declared` (refreshed if they refuse it, see [`Engine::judged`]), on a live
    /// session of the request's TTL (else the shortest of the locks').
    async fn draft(
        &self,
        req: &AcquireRequest,
        locks: &[LockId],
        declared: &mut [Declared],
    ) -> Result<Placed, LockError> {
        let max_hold = self
            .judged(locks, declared, |d| checked_set(req, locks, d))
            .await?;
        let shortest = declared.iter().map(|d| d.settings.ttl_seconds).min();
        let ttl = req.ttl_seconds.or(shortest).unwrap_or_default();
        let session = self.sessions().get(TTL.check(ttl)?).await?;
        let ticket = |l: &LockId| Ticket {
            key: l.entry_key(session.id, &req.holder_id),
            revision: 0,
            lease: session.id,
        };
        Ok(Placed {
            tickets: locks.iter().map(ticket).collect(),
            epochs: declared.iter().map(|d| d.settings.epoch).collect(),
            session,
            max_hold,
        })
    }

    /// Waits for the set's turn on every lock at once; returns the latest revision a turn was
    /// seen at. Stops at the first key gone or turn timed out.
    async fn wait_set(
        &self,
        req: &AcquireRequest,
        locks: &[LockId],
        placed: &Placed,
        declared: &mut [Declared],
        deadline: Instant,
    ) -> Result<i64, Stop> {
        let turns = (locks
            .iter()
            .zip(&placed.tickets)
            .zip(declared.iter_mut())
            .enumerate())
        .map(|(i, ((lock, ticket), d))| async move {
            match wait::wait_turn(self, lock, (ticket, Ask::one(req.mode)), d, deadline, None).await {
                Ok(Turn::Granted(granted)) => Ok(granted.at),
                Ok(Turn::Gone) => Err(Stop::Gone),
                Ok(Turn::TimedOut) => Err(Stop::TimedOut(i)),
                Ok(Turn::TooLarge) => unreachable!("a set's keys ask one permit, which every lock has"),
                Err(e) => Err(Stop::Failed(e)),
            }
        });
        Ok(try_join_all(turns).await?.into_iter().max().unwrap_or_default())
    }

    /// The entries of the set's keys, each naming the other locks (`acquired`: with the grant
    /// recorded).
    fn set_entries(
        &self,
        req: &AcquireRequest,
        locks: &[LockId],
        declared: &[Declared],
        placed: &Placed,
        acquired: Option<SystemTime>,
    ) -> Vec<Entry> {
        let others = |lock: &LockId| {
            locks
                .iter()
                .filter(|l| *l != lock)
                .map(|l| l.name.clone())
                .collect()
        };
        (locks.iter().zip(declared).zip(&placed.epochs))
            .map(|((lock, d), &epoch)| Entry {
                with: others(lock),
                acquired_at: acquired.map(rfc3339),
                heartbeat_timeout_seconds: heartbeat(req, declared),
                ..self.entry(req, placed.session.ttl, d.settings, epoch, placed.max_hold)
            })
            .collect()
    }

    /// Turns the set's recorded keys into holds, one per lock, linked by their set.
    fn start_set(
        &self,
        req: AcquireRequest,
        locks: &[LockId],
        declared: &[Declared],
        mut pending: Pending<'_>,
        placed: Placed,
        (at, acquired_at): (i64, SystemTime),
    ) -> Result<Grant, LockError> {
        crate::lock::acquire::check_lease(&placed.session)?;
        let tokens = tokens(locks, &placed)?;
        let set: Vec<(LockId, Token)> = locks.iter().cloned().zip(tokens.iter().copied()).collect();
        let window = Duration::from_secs(heartbeat(&req, declared).into());
        let entries = self.set_entries(&req, locks, declared, &placed, Some(acquired_at));
        let holds: Vec<Arc<Hold>> = (locks.iter().zip(&placed.tickets).zip(tokens))
            .map(|((lock, ticket), token)| {
                let terms = Terms {
                    acquired_at,
                    mode: req.mode,
                    permits: req.permits,
                    connection_bound: req.connection_bound,
                    chain: NextKeys::known(None),
                    set: set.clone(),
                    max_hold: placed.max_hold.start(acquired_at),
                };
                let (ticket, session) = (ticket.clone(), placed.session.clone());
                let hold = Hold::new(
                    lock.clone(),
                    req.holder_id.clone(),
                    (ticket, token),
                    at,
                    session,
                    window,
                    terms,
                );
                Arc::new(hold)
            })
            .collect();
        pending.keys = None;
        for ((slot, hold), entry) in pending.slots.iter().zip(&holds).zip(entries) {
            self.registry().hold(slot.clone(), hold.clone());
            self.publish(hold, EventKind::Acquired, None);
            monitor::spawn_monitor(self.clone(), hold.clone(), MarkWhen::Now, entry);
        }
        debug!(lock = %req.lock, holder = %req.holder_id, token = holds[0].token(), locks = locks.len(), "acquired as one");
        Ok(Grant {
            handed_on: false,
            ..Grant::of(&holds[0])
        })
    }
}

/// The fencing tokens of the set's keys, one per lock (each of its lock's epoch at the
/// enqueue); refused if their revision is beyond what a token carries.
fn tokens(locks: &[LockId], placed: &Placed) -> Result<Vec<Token>, LockError> {
    (locks.iter().zip(&placed.epochs).zip(&placed.tickets))
        .map(|((lock, &epoch), t)| {
            Token::new(epoch, t.revision).map_err(|source| LockError::Token {
                lock: lock.clone(),
                source,
            })
        })
        .collect()
}

/// The set's heartbeat window: the request's, else the strictest of its locks' (0: none).
fn heartbeat(req: &AcquireRequest, declared: &[Declared]) -> u32 {
    let windows = declared
        .iter()
        .map(|d| d.settings.heartbeat_timeout_seconds)
        .filter(|w| *w > 0);
    req.heartbeat_timeout_seconds
        .unwrap_or_else(|| windows.min().unwrap_or(0))
}
