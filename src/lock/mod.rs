//! The lock engine: fair, fenced, liveness-aware locks and semaphores on etcd.
//!
//! [`Engine`] is what a sidecar runs: it acquires, releases and heartbeats holds for one pod,
//! keeps their leases alive (`etcd/session.rs`), queues contenders FIFO without a
//! thundering herd (`txn/queue.rs`), watches each hold until it ends
//! (`life/hold.rs`) and publishes [`HoldEvent`]s. It knows nothing of HTTP or Kubernetes.
//! The operator and `podlock declare` reach podlock's data through [`Store`] alone, in typed
//! records; the key layout (`protocol/keys.rs`) stays in here.
//!
//! The files are cut into wings, folders that import only themselves and the wings below them
//! (docs/design.md, "The engine's wings"): [`protocol`], `etcd`, `txn`, `store`, `holdings`, then
//! this module, then `life` and `fence`, then `acquire` and `observe`. The steps of the engine's
//! work live in files of their own, each an `impl Engine` or a task given one, so they import
//! this module. One import runs the other way: [`Engine::new`] starts the orphan sweep
//! (`sweep.rs`), which holds the engine weakly so that it ends with it.

mod acquire;
mod error;
mod etcd;
mod fence;
mod holdings;
mod life;
mod messages;
mod observe;
pub mod protocol;
mod refusal;
mod store;
mod sweep;
mod txn;

pub use error::{LockError, Unavailable};
pub use etcd::Stats;
pub use etcd::link::Link;
pub use holdings::max_hold::{REQUEST_MAX_HOLD, WARNING_FIELD};
pub use messages::{
    AcquireRequest, EventKind, FenceCheck, Grant, HoldEvent, HolderSet, LocalEntry, LockDeleted, LockInfo,
    LockToken, Observed,
};
pub use observe::Observer;
pub use protocol::entry::{Entry, HolderInfo, Mode, PodRef, rfc3339};
pub use protocol::names::{
    InvalidName, LockId, check_container, check_dns_subdomain, check_holder_id, cluster_name,
    unique_holder_id,
};
pub use protocol::token::{MAX_EPOCH, REVISION_LIMIT, Token, TokenError, next_epoch};
pub use refusal::Refusal;
pub use store::changes::{Change, Changes, QueueEntry};
pub use store::clusters::{Withdrawn, may_publish};
pub use store::{LockState, NamespacePassword, Revoked, RoundTripError, Store};
pub use txn::queue::QueueState;
pub use txn::release_note::{DEADLINE, Ending, YIELD};
pub use txn::settings::{Bound, HEARTBEAT, MAX_HOLD, MAX_HOLDERS, Settings, TTL};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;

use etcd::Etcd;
use etcd::session::Sessions;
use holdings::events;
use holdings::hold::Hold;
use holdings::registry::Registry;
use protocol::keys;
use txn::queue;
use txn::settings::{self, Declared};

struct Inner {
    etcd: Etcd,
    sessions: Sessions,
    pod: PodRef,
    standalone: bool,
    declared: Mutex<HashMap<LockId, Declared>>,
    registry: Registry,
    events: events::Subscribers,
}

/// The lock engine of one sidecar. Cheap to clone.
#[derive(Clone)]
pub struct Engine(Arc<Inner>);

impl Engine {
    /// An engine on `client` for `pod`; `standalone` serves undeclared locks with defaults.
    /// `members` has one client per etcd member: new watches and requests go to one that answers
    /// (see `etcd/members.rs`), and so do keepalives (see `etcd/session.rs`). Starts its orphan
    /// sweep (see `sweep.rs`) on the current Tokio runtime.
    pub fn new(
        client: etcd_client::Client,
        members: Vec<etcd_client::Client>,
        pod: PodRef,
        standalone: bool,
    ) -> Self {
        let etcd = Etcd::with_members(client, members);
        let engine = Engine(Arc::new(Inner {
            sessions: Sessions::new(etcd.clone()),
            etcd,
            pod,
            standalone,
            declared: Mutex::default(),
            registry: Registry::default(),
            events: events::Subscribers::default(),
        }));
        tokio::spawn(sweep::run(Arc::downgrade(&engine.0)));
        engine
    }

    /// The etcd client with its counters.
    pub(crate) fn etcd(&self) -> &Etcd {
        &self.0.etcd
    }

    /// The engine's etcd clients, for whoever can build new ones when etcd refuses them.
    pub fn link(&self) -> &Link {
        self.0.etcd.link()
    }

    /// How much etcd work this engine caused.
    pub fn stats(&self) -> &Stats {
        self.0.etcd.stats()
    }

    /// The pod this engine serves.
    pub fn pod(&self) -> &PodRef {
        &self.0.pod
    }

    /// How many keepalives failed since start.
    pub fn keepalive_failures(&self) -> u64 {
        self.0.sessions.keepalive_failures()
    }

    /// Subscribes to events about this sidecar's holds of `lock` (of every lock when `None`).
    /// The receiver ends if it falls behind (see `holdings/events.rs`): then treat every hold as lost.
    pub fn subscribe(&self, lock: Option<LockId>) -> mpsc::Receiver<HoldEvent> {
        self.0.events.subscribe(lock)
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
            return Ok(d.clone());
        }
        let found = settings::read(&self.0.etcd, lock).await?;
        self.remember(lock, found)
    }

    fn remember(&self, lock: &LockId, found: Option<Declared>) -> Result<Declared, LockError> {
        let mut cache = self.0.declared.lock().unwrap();
        let d = match found {
            Some(d) => d,
            None if self.0.standalone => Declared::undeclared(),
            None => {
                cache.remove(lock);
                return Err(LockError::NotFound(lock.clone()));
            }
        };
        cache.insert(lock.clone(), d.clone());
        Ok(d)
    }

    fn publish(&self, hold: &Hold, kind: EventKind, reason: Option<String>) {
        let deadline = hold.max_hold.map(|d| rfc3339(d.wall));
        self.announce(hold, kind, reason, deadline);
    }

    /// Publishes an event about `hold` that names `deadline` (its maximum hold time's, or the
    /// one a yield request set).
    fn announce(&self, hold: &Hold, kind: EventKind, reason: Option<String>, deadline: Option<String>) {
        let event = HoldEvent {
            kind,
            lock: hold.lock.clone(),
            holder_id: hold.holder_id.clone(),
            fencing_token: hold.token(),
            mode: hold.mode,
            reason,
            deadline,
            at: rfc3339(SystemTime::now()),
        };
        self.0.events.publish(&hold.lock, &event);
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
        self.0.registry.local()
    }

    /// How many holds this sidecar has.
    pub fn held_count(&self) -> usize {
        self.0.registry.held_count()
    }
}
