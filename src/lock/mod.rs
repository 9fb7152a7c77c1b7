//! The lock engine: fair, fenced, liveness-aware locks and semaphores on etcd.
//!
//! [`Engine`] is what a sidecar runs: it acquires, releases and heartbeats holds for one pod,
//! keeps their leases alive ([`session`]), queues contenders FIFO without a thundering herd
//! ([`queue`]), watches each hold until it ends ([`hold`]) and publishes [`HoldEvent`]s. It knows
//! nothing of HTTP or Kubernetes.

mod error;
pub mod etcd;
pub mod hold;
pub mod keys;
mod model;
pub mod queue;
pub mod session;
pub mod settings;

pub use error::LockError;
pub use keys::{Entry, HolderInfo, LockId, PodRef, Settings};
pub use model::{AcquireRequest, EventKind, Grant, HoldEvent, LocalEntry, LockInfo};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::broadcast;
use tokio::time::Instant;
use tracing::{info, warn};

use etcd::Etcd;
use hold::Hold;
use keys::rfc3339;
use queue::{Enqueued, Ticket, Turn};
use session::Sessions;
use settings::Declared;

pub(crate) enum Slot {
    Waiting,
    Held(Arc<Hold>),
    Lost { token: i64, reason: String },
}

type Registry = HashMap<(LockId, String), Slot>;

struct Inner {
    etcd: Etcd,
    sessions: Sessions,
    pod: PodRef,
    standalone: bool,
    declared: Mutex<HashMap<LockId, Declared>>,
    registry: Mutex<Registry>,
    events: broadcast::Sender<HoldEvent>,
}

/// The lock engine of one sidecar. Cheap to clone.
#[derive(Clone)]
pub struct Engine(Arc<Inner>);

impl Engine {
    /// An engine on `client` for `pod`; `standalone` serves undeclared locks with defaults.
    pub fn new(client: etcd_client::Client, pod: PodRef, standalone: bool) -> Self {
        Engine(Arc::new(Inner {
            etcd: Etcd::new(client.clone()),
            sessions: Sessions::new(client),
            pod,
            standalone,
            declared: Mutex::default(),
            registry: Mutex::default(),
            events: broadcast::channel(1024).0,
        }))
    }

    /// The etcd client with its counters.
    pub fn etcd(&self) -> &Etcd {
        &self.0.etcd
    }

    /// The pod this engine serves.
    pub fn pod(&self) -> &PodRef {
        &self.0.pod
    }

    /// How many keepalives failed since start.
    pub fn keepalive_failures(&self) -> u64 {
        self.0.sessions.keepalive_failures()
    }

    /// Subscribes to events about this sidecar's holds.
    pub fn subscribe(&self) -> broadcast::Receiver<HoldEvent> {
        self.0.events.subscribe()
    }

    /// Whether etcd answers within `within`.
    pub async fn ready(&self, within: Duration) -> bool {
        // Read something this sidecar may read even with namespace-scoped etcd credentials.
        let opts = etcd_client::GetOptions::new().with_prefix().with_count_only();
        let probe = self
            .0
            .etcd
            .get(keys::config_prefix(Some(&self.0.pod.namespace)), Some(opts));
        matches!(tokio::time::timeout(within, probe).await, Ok(Ok(_)))
    }

    /// The settings of `lock`: declared ones (cached), or the defaults when standalone.
    async fn declared(&self, lock: &LockId, fresh: bool) -> Result<Declared, LockError> {
        if !fresh && let Some(d) = self.0.declared.lock().unwrap().get(lock) {
            return Ok(*d);
        }
        let found = settings::read(&self.0.etcd, lock).await?;
        self.remember(lock, found)
    }

    fn remember(&self, lock: &LockId, found: Option<Declared>) -> Result<Declared, LockError> {
        let mut cache = self.0.declared.lock().unwrap();
        let d = match found {
            Some(d) => d,
            None if self.0.standalone => Declared {
                settings: Settings::default(),
                revision: 0,
            },
            None => {
                cache.remove(lock);
                return Err(LockError::NotFound(lock.clone()));
            }
        };
        cache.insert(lock.clone(), d);
        Ok(d)
    }

    /// Acquires `req.lock` for `req.holder_id`, waiting FIFO up to `req.wait`.
    ///
    /// Dropping the returned future while it waits (a client that disconnects) removes the
    /// waiter's key at once.
    pub async fn acquire(&self, req: AcquireRequest) -> Result<Grant, LockError> {
        keys::check_holder_id(&req.holder_id)?;
        let slot_key = (req.lock.clone(), req.holder_id.clone());
        let held = match self.0.registry.lock().unwrap().get(&slot_key) {
            Some(Slot::Held(h)) => Some(h.clone()),
            _ => None,
        };
        if let Some(h) = held {
            // Acquiring again is idempotent, but only while the key is still there: the hold's
            // monitor may not have seen a deletion yet.
            if queue::is_ours(&self.0.etcd, &h.ticket).await? {
                return Ok(Grant::of(&h));
            }
            self.end_lost(&h, hold::KEY_DELETED).await;
        }
        {
            let mut reg = self.0.registry.lock().unwrap();
            match reg.get(&slot_key) {
                Some(Slot::Held(h)) => return Ok(Grant::of(h)),
                Some(Slot::Waiting) => {
                    return Err(LockError::Held {
                        lock: req.lock,
                        holders: vec![],
                        why: format!("; holder {} already has an acquire waiting", req.holder_id),
                    });
                }
                _ => reg.insert(slot_key.clone(), Slot::Waiting),
            };
        }
        let mut pending = Pending {
            engine: self,
            slot: slot_key,
            ticket: None,
        };
        let deadline = Instant::now() + req.wait;
        let mut declared = self.declared(&req.lock, false).await?;
        let (ticket, session, held, mut seen) = loop {
            let s = declared.settings;
            let ttl = keys::check_bounds(
                "ttlSeconds",
                req.ttl_seconds.unwrap_or(s.ttl_seconds),
                keys::TTL_BOUNDS,
            )?;
            let session = self.0.sessions.get(ttl).await?;
            let entry = self.entry(&req, ttl, declared.settings);
            let key = req.lock.entry_key(session.id, &req.holder_id);
            let enqueue = {
                let (etcd, lock, max) = (self.0.etcd.clone(), req.lock.clone(), s.max_holders);
                let (lease, revision) = (session.id, declared.revision);
                async move { queue::enqueue(&etcd, &lock, &key, &entry, lease, revision, max).await }
            };
            let enqueued = hold::enqueue_to_completion(self, &session, enqueue).await?;
            match enqueued {
                Enqueued::Placed { ticket, held, at } => break (ticket, session, held, at),
                Enqueued::SettingsChanged(kv) => {
                    declared = self.remember(&req.lock, kv.as_ref().map(Declared::from_kv).transpose()?)?;
                }
            }
        };
        pending.ticket = Some((ticket.clone(), session.clone()));
        let max_holders = declared.settings.max_holders;
        if !held {
            let turn = if req.wait.is_zero() {
                Turn::TimedOut // try-once: no need to read the queue again
            } else {
                queue::wait_turn(&self.0.etcd, &req.lock, &ticket, max_holders, deadline).await?
            };
            match turn {
                Turn::Granted(at) => {
                    seen = at;
                    let mut entry = self.entry(&req, session.ttl, declared.settings);
                    entry.acquired_at = Some(rfc3339(SystemTime::now()));
                    let (etcd, marked) = (self.0.etcd.clone(), ticket.clone());
                    let mark = async move { queue::mark_acquired(&etcd, &marked, &entry).await };
                    if max_holders > 1 {
                        // The next waiter of a semaphore wakes on this write: it must be done.
                        if !mark.await? {
                            return Err(self.vanished(&req.lock).await);
                        }
                    } else {
                        // Nobody waits on a mutex holder's write (it only records acquiredAt):
                        // keep it off the handoff path. It is guarded by the key's create
                        // revision, so landing after the release changes nothing.
                        tokio::spawn(async move {
                            if let Err(e) = mark.await {
                                warn!(error = %e, "could not record acquiredAt");
                            }
                        });
                    }
                }
                Turn::Gone => return Err(self.vanished(&req.lock).await),
                Turn::TimedOut => {
                    // Leave the queue before answering, so the 409 means "no trace left".
                    if let Some((ticket, session)) = pending.ticket.take()
                        && let Err(e) = queue::remove(&self.0.etcd, &ticket).await
                    {
                        warn!(key = ticket.key, error = %e, "could not leave the queue; retrying in the background");
                        hold::spawn_removal(self.clone(), ticket, session);
                    }
                    let holders = self
                        .inspect(&req.lock)
                        .await
                        .map(|i| i.holders)
                        .unwrap_or_default();
                    let why = if req.wait.is_zero() {
                        String::new()
                    } else {
                        format!("; waited {:?}", req.wait)
                    };
                    return Err(LockError::Held {
                        lock: req.lock,
                        holders,
                        why,
                    });
                }
            }
        }
        // A hold must start with most of its lease confirmed: if keepalives have been failing,
        // the lease may end any moment and the lock move on while the app believes it holds.
        let confirmed = session.expires_at().saturating_duration_since(Instant::now());
        if confirmed < Duration::from_secs(session.ttl.into()) / 2 {
            return Err(LockError::Unavailable(format!(
                "etcd keepalives are failing (lease confirmed for only {confirmed:?} more); retry"
            )));
        }
        let heartbeat = req
            .heartbeat_timeout_seconds
            .unwrap_or(declared.settings.heartbeat_timeout_seconds);
        let hold = Arc::new(Hold::new(
            req.lock,
            req.holder_id,
            ticket,
            seen,
            session,
            Duration::from_secs(heartbeat.into()),
        ));
        pending.ticket = None;
        self.0
            .registry
            .lock()
            .unwrap()
            .insert(pending.slot.clone(), Slot::Held(hold.clone()));
        info!(lock = %hold.lock, holder = %hold.holder_id, token = hold.token(), "acquired");
        self.publish(&hold, EventKind::Acquired, None);
        hold::spawn_monitor(self.clone(), hold.clone());
        Ok(Grant::of(&hold))
    }

    fn entry(&self, req: &AcquireRequest, ttl: u32, s: Settings) -> Entry {
        Entry {
            holder_id: req.holder_id.clone(),
            pod: self.0.pod.clone(),
            requested_at: rfc3339(SystemTime::now()),
            acquired_at: None,
            ttl_seconds: ttl,
            heartbeat_timeout_seconds: req
                .heartbeat_timeout_seconds
                .unwrap_or(s.heartbeat_timeout_seconds),
            container: req.container.clone(),
        }
    }

    /// The error for a waiter whose key disappeared: the lock was deleted, or the lease ended.
    async fn vanished(&self, lock: &LockId) -> LockError {
        match self.declared(lock, true).await {
            Err(e) => e,
            Ok(_) => LockError::Unavailable(
                "the queue entry vanished while waiting (its lease ended); retry".into(),
            ),
        }
    }

    fn publish(&self, hold: &Hold, kind: EventKind, reason: Option<String>) {
        let _ = self.0.events.send(HoldEvent {
            kind,
            lock: hold.lock.name.clone(),
            namespace: hold.lock.namespace.clone(),
            holder_id: hold.holder_id.clone(),
            fencing_token: hold.token(),
            reason,
            at: rfc3339(SystemTime::now()),
        });
    }

    /// Reads a lock's settings and queue from etcd.
    pub async fn inspect(&self, lock: &LockId) -> Result<LockInfo, LockError> {
        let d = self.declared(lock, true).await?;
        let resp = self
            .0
            .etcd
            .get(lock.queue_prefix(), Some(queue::queue_order()))
            .await?;
        let state = queue::split_queue(resp.kvs(), d.settings.max_holders);
        Ok(LockInfo {
            lock: lock.name.clone(),
            held: !state.holders.is_empty(),
            fencing_token: state.holders.iter().map(|h| h.fencing_token).max(),
            holders: state.holders,
            waiters: state.waiters,
            ttl_seconds: d.settings.ttl_seconds,
            max_holders: d.settings.max_holders,
        })
    }

    /// This sidecar's holds and waits.
    pub fn local(&self) -> Vec<LocalEntry> {
        let reg = self.0.registry.lock().unwrap();
        let mut out: Vec<LocalEntry> = reg
            .iter()
            .filter_map(|((lock, holder), slot)| {
                let (state, fencing_token) = match slot {
                    Slot::Held(h) => ("held", Some(h.token())),
                    Slot::Waiting => ("waiting", None),
                    Slot::Lost { .. } => return None,
                };
                Some(LocalEntry {
                    lock: lock.name.clone(),
                    holder_id: holder.clone(),
                    state,
                    fencing_token,
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.lock, &a.holder_id).cmp(&(&b.lock, &b.holder_id)));
        out
    }

    /// How many holds this sidecar has.
    pub fn held_count(&self) -> usize {
        self.0
            .registry
            .lock()
            .unwrap()
            .values()
            .filter(|s| matches!(s, Slot::Held(_)))
            .count()
    }
}

/// An acquire in progress: on drop (finished, failed or cancelled) it clears the `Waiting` slot
/// and removes a queue key that did not become a hold.
struct Pending<'a> {
    engine: &'a Engine,
    slot: (LockId, String),
    ticket: Option<(Ticket, Arc<session::Session>)>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let mut reg = self.engine.0.registry.lock().unwrap();
        if matches!(reg.get(&self.slot), Some(Slot::Waiting)) {
            reg.remove(&self.slot);
        }
        drop(reg);
        if let Some((ticket, session)) = self.ticket.take() {
            hold::spawn_removal(self.engine.clone(), ticket, session);
        }
    }
}
