//! `Engine`: the state one sidecar keeps (its etcd client and sessions, the settings cache, the
//! registry of holds and waits, the event subscribers), its read-only views, and the orphan
//! sweep that runs beside it.
//!
//! The engine's verbs are `impl Engine` blocks in the wings above this one, each in the file of
//! its verb (docs/design.md, "Where each `Engine` method lives"): they reach this state through
//! the accessors here.
//!
//! The orphan sweep removes queue keys under this sidecar's own leases that no acquire and no
//! hold of its registry tracks.
//!
//! Such a key can only come from a copy of an enqueue that etcd applied after its acquire had
//! ended (a hedged request, or one delayed in the network): it sits on a live lease, nobody will
//! release it, and once first in the queue it would hold the lock for as long as the pod lives.
//! A key is removed when two sweeps in a row find it unknown with the same create revision, so
//! that a release or removal already under way is not raced; the removal is guarded by that
//! revision, so a newer key of the same holder is never touched.
//!
//! A restore of etcd from a snapshot brings back such keys too: the keys of holds and waits
//! that ended after the snapshot, on a lease that lived through it. Nothing in etcd tells them
//! from holds that go on, and every view (the fence check through other sidecars included)
//! names them until they are gone (issue #54, finding 4). So when a session's keepalives come
//! back after a break ([`Resumed`]), the sweep asks etcd whether its history still reaches the
//! revision etcd was at before: a restore with `--mark-compacted` (which etcdutl requires with
//! `--bump-revision`) compacts every revision before it, and a periodic compaction never
//! reaches one seen seconds ago. If etcd went back, every key on that lease that the registry
//! does not track, as a hold with that very create revision or an acquire placing it, is
//! removed at once, without waiting for a second sweep.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tracing::{info, warn};

use super::events;
use super::hold::Hold;
use super::receipts::ReceiptSlots;
use super::registry::Registry;
use super::settings_cache::{Admitted, SettingsCache};
use crate::lock::clock;
use crate::lock::error::{LockError, Unavailable};
use crate::lock::etcd::link::Link;
use crate::lock::etcd::session::{Resumed, Sessions};
use crate::lock::etcd::{Etcd, Stats};
use crate::lock::feed::Feeds;
use crate::lock::messages::{EventKind, HoldEvent, LocalEntry, LockInfo};
use crate::lock::protocol::entry::{PodRef, rfc3339};
use crate::lock::protocol::keys::{self, parse_entry_key};
use crate::lock::protocol::names::LockId;
use crate::lock::txn::queue::{self, Ticket};
use crate::lock::txn::settings::{self, Declared};

struct Inner {
    etcd: Etcd,
    feeds: Arc<Feeds>,
    sessions: Sessions,
    pod: PodRef,
    standalone: bool,
    declared: Mutex<SettingsCache>,
    registry: Registry,
    receipts: ReceiptSlots,
    events: events::Subscribers,
}

/// The lock engine of one sidecar. Cheap to clone.
#[derive(Clone)]
pub struct Engine(Arc<Inner>);

impl Engine {
    /// An engine on `client` for `pod`; `standalone` serves undeclared locks with defaults.
    /// `members` has one client per etcd member: new watches and requests go to one that answers
    /// (see `etcd/members.rs`), and so do keepalives (see `etcd/session.rs`). Starts its orphan
    /// sweep (below) on the current Tokio runtime, which its sessions tell of their breaks.
    pub fn new(
        client: etcd_client::Client,
        members: Vec<etcd_client::Client>,
        pod: PodRef,
        standalone: bool,
    ) -> Self {
        let etcd = Etcd::with_members(client, members);
        let (sessions, resumed) = Sessions::new(etcd.clone());
        let engine = Engine(Arc::new(Inner {
            sessions,
            feeds: Feeds::new(etcd.link().clone(), etcd.shared_stats()),
            etcd,
            pod,
            standalone,
            declared: Mutex::default(),
            registry: Registry::default(),
            receipts: ReceiptSlots::default(),
            events: events::Subscribers::default(),
        }));
        tokio::spawn(sweep_until_gone(Arc::downgrade(&engine.0), resumed));
        engine
    }

    /// The feeds its waits and holds follow their own keys and the settings on.
    pub(in crate::lock) fn feeds(&self) -> &Arc<Feeds> {
        &self.0.feeds
    }

    /// The registry of this sidecar's holds and waits.
    pub(in crate::lock) fn registry(&self) -> &Registry {
        &self.0.registry
    }

    /// The release receipts' slots of its releases in flight.
    pub(in crate::lock) fn receipt_slots(&self) -> &ReceiptSlots {
        &self.0.receipts
    }

    /// The sessions (leases) its keys are bound to.
    pub(in crate::lock) fn sessions(&self) -> &Sessions {
        &self.0.sessions
    }

    /// Whether it serves undeclared locks with the default settings (`--standalone`).
    pub(in crate::lock) fn standalone(&self) -> bool {
        self.0.standalone
    }

    /// The subscribers to its holds' events.
    pub(in crate::lock) fn subscribers(&self) -> &events::Subscribers {
        &self.0.events
    }

    /// The slots of `lock` as this sidecar last read its settings (1 if never): only how much
    /// of the queue to read, the answer takes the settings read with it.
    pub(in crate::lock) fn slots_seen(&self, lock: &LockId) -> u32 {
        let cache = self.0.declared.lock().unwrap();
        cache.peek(lock).map_or(1, |d| d.settings.max_holders)
    }

    /// How many locks' settings it keeps.
    pub(super) fn cached_settings(&self) -> usize {
        self.0.declared.lock().unwrap().len()
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
    /// The receiver ends if it falls behind (see `events.rs`): then treat every hold as lost.
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
    pub(in crate::lock) async fn declared(&self, lock: &LockId, fresh: bool) -> Result<Declared, LockError> {
        if !fresh && let Some(d) = self.0.declared.lock().unwrap().get(lock) {
            return Ok(d.clone());
        }
        let found = settings::read(&self.0.etcd, lock).await?;
        self.remember(lock, found)
    }

    /// Keeps settings `found` in etcd as `lock`'s: refused (503) if under a lower token epoch
    /// than this sidecar saw the lock under (#54 F11, `settings_cache.rs`); a lock not found is
    /// forgotten (and refused but by a standalone sidecar, which serves it with defaults).
    pub(in crate::lock) fn remember(
        &self,
        lock: &LockId,
        found: Option<Declared>,
    ) -> Result<Declared, LockError> {
        let mut cache = self.0.declared.lock().unwrap();
        let d = match found {
            Some(d) => d,
            None if self.0.standalone => Declared::undeclared(),
            None => {
                cache.remove(lock);
                return Err(LockError::NotFound(lock.clone()));
            }
        };
        let found = d.settings.epoch;
        match cache.admit(lock, &d) {
            Admitted::Kept => Ok(d),
            Admitted::WentBack { seen } => Err(Unavailable::EpochWentBack {
                lock: lock.clone(),
                seen,
                found,
            }
            .into()),
            Admitted::GaveUp { seen } => {
                warn!(
                    lock = %lock,
                    seen,
                    found,
                    "taking settings under a lower token epoch than this sidecar saw, refused for \
                     a minute: the lock's history was lost (deleted while etcd was wiped?); its \
                     tokens now lie below ones handed out before"
                );
                Ok(d)
            }
        }
    }

    pub(in crate::lock) fn publish(&self, hold: &Hold, kind: EventKind, reason: Option<String>) {
        let deadline = hold.terms.max_hold.map(|d| rfc3339(d.wall));
        self.announce(hold, kind, reason, deadline);
    }

    /// Publishes an event about `hold` that names `deadline` (its maximum hold time's, or the
    /// one a yield request set).
    pub(in crate::lock) fn announce(
        &self,
        hold: &Hold,
        kind: EventKind,
        reason: Option<String>,
        deadline: Option<String>,
    ) {
        let event = HoldEvent {
            kind,
            lock: hold.lock.clone(),
            holder_id: hold.holder_id.clone(),
            fencing_token: hold.token(),
            mode: hold.terms.mode,
            reason,
            deadline,
            at: rfc3339(clock::now()),
        };
        self.0.events.publish(&hold.lock, &event);
    }

    /// Reads a lock's settings and queue from etcd in one request, at one revision, as the
    /// fence check does: its holders are judged under the settings read with them (#54 F7: two
    /// reads named a waiter, or left out a holder, around a `maxHolders` change).
    pub async fn inspect(&self, lock: &LockId) -> Result<LockInfo, LockError> {
        let read = queue::read_lock(&self.0.etcd, lock, None).await?;
        let d = self.remember(lock, read.declared)?;
        let state = queue::split_queue(&read.queue, d.settings.max_holders);
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

/// How often the sweep runs: one lease read per session each time.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Sweeps until the engine is gone: every [`SWEEP_EVERY`], and a session's lease as soon as
/// its keepalives come back after a break (`resumed`), if etcd came back restored.
async fn sweep_until_gone(engine: Weak<Inner>, mut resumed: mpsc::Receiver<Resumed>) {
    let mut suspects = BTreeSet::new();
    let mut next = Instant::now() + SWEEP_EVERY;
    loop {
        let resumed = tokio::select! {
            _ = sleep_until(next) => None,
            resumed = resumed.recv() => match resumed {
                Some(r) => Some(r),
                None => return, // the sessions are gone with the engine
            },
        };
        let Some(inner) = engine.upgrade() else {
            return;
        };
        match resumed {
            Some(r) => Engine(inner).sweep_if_restored(r).await,
            None => {
                suspects = Engine(inner).sweep(&suspects).await;
                next = Instant::now() + SWEEP_EVERY;
            }
        }
    }
}

impl Engine {
    /// One sweep: removes the keys that were suspects before and still are; returns the new
    /// suspects, as (key, create revision).
    async fn sweep(&self, before: &BTreeSet<(String, i64)>) -> BTreeSet<(String, i64)> {
        let mut suspects = BTreeSet::new();
        for session in self.0.sessions.live().await {
            for ticket in self.untracked(session.id, false).await {
                if before.contains(&(ticket.key.clone(), ticket.revision)) {
                    self.remove_orphan(&ticket).await;
                } else {
                    suspects.insert((ticket.key, ticket.revision));
                }
            }
        }
        suspects
    }

    /// After the keepalives of `resumed.lease` came back from a break: if etcd's history no
    /// longer reaches the revision it was at before, it was restored from a snapshot, and the
    /// keys on that lease that the registry does not track are removed at once (see the
    /// module's doc).
    async fn sweep_if_restored(&self, resumed: Resumed) {
        let Resumed { lease, revision } = resumed;
        let prefix = keys::config_prefix(Some(&self.0.pod.namespace));
        match self.0.etcd.compacted_past(prefix, revision).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                warn!(error = %e, "could not tell whether etcd came back restored; the orphan sweep will find what it brought back");
                return;
            }
        }
        warn!(
            lease = format_args!("{lease:x}"),
            revision,
            "etcd came back without its history up to revision {revision} (restored from a snapshot): removing the keys it brought back on this lease"
        );
        for ticket in self.untracked(lease, true).await {
            self.remove_orphan(&ticket).await;
        }
    }

    /// The queue keys on `lease` that no acquire and no hold of the registry tracks, with
    /// their create revisions; with `exact`, a hold tracks its key only with that key's create
    /// revision (a restore may bring back an earlier key of the same name).
    async fn untracked(&self, lease: i64, exact: bool) -> Vec<Ticket> {
        let keys = match self.0.etcd.lease_keys(lease).await {
            Ok(Some(keys)) => keys,
            Ok(None) => return vec![], // the keepalive loop ends the session
            Err(e) => {
                warn!(error = %e, "orphan sweep could not read a lease's keys");
                return vec![];
            }
        };
        let mut found = vec![];
        for key in keys.into_iter().filter_map(|k| String::from_utf8(k).ok()) {
            let Some(slot) = parse_entry_key(&key) else {
                continue;
            };
            if !exact && self.0.registry.knows(&slot, &key) {
                continue;
            }
            let Ok(resp) = self.0.etcd.get(key.as_str(), None).await else {
                continue;
            };
            let Some(revision) = resp.kvs().first().map(|kv| kv.create_revision()) else {
                continue;
            };
            let held = self.0.registry.held(&slot).map(|h| h.ticket.clone());
            let tracked = match held {
                Some(t) => t.key == key && (!exact || t.revision == revision),
                None => self.0.registry.knows(&slot, &key),
            };
            if !tracked {
                found.push(Ticket { key, revision, lease });
            }
        }
        found
    }

    /// Removes `ticket`'s key, guarded by its create revision.
    async fn remove_orphan(&self, ticket: &Ticket) {
        if let Ok(true) = queue::remove(&self.0.etcd, ticket).await
            && let Some((lock, holder)) = parse_entry_key(&ticket.key)
        {
            info!(lock = %lock, holder, key = ticket.key, revision = ticket.revision, "removed a queue key no acquire tracks");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podlock_sim::etcd::{Config, Etcd as SimEtcd};

    /// Issue #54, F9: a `--standalone` sidecar kept the default settings of every name it was
    /// ever asked about, so its memory grew with every name touched. Fails so on the code
    /// before the bound with `the settings of 4196 locks kept after 4196 names`.
    #[tokio::test(start_paused = true)]
    async fn a_standalone_engine_keeps_the_settings_of_a_bounded_number_of_locks() {
        let etcd = SimEtcd::start(Config::default());
        let engine = Engine::new(etcd.client().await, vec![], PodRef::default(), true);
        let (bound, names) = (4096, 4096 + 100);
        for i in 0..names {
            let lock = LockId::new("ns", &format!("name-{i}")).unwrap();
            engine.declared(&lock, false).await.unwrap();
        }
        let kept = engine.0.declared.lock().unwrap().len();
        assert!(
            kept <= bound,
            "the settings of {kept} locks kept after {names} names"
        );
    }
}
