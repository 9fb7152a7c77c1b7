//! A simulated etcd: one in-process member serving the etcd v3 gRPC API podlock uses (KV,
//! Lease, Watch) over in-memory connections, on Tokio's clock, with no thread and no unordered
//! iteration, so that a run on a current-thread runtime with paused time is a function of its
//! inputs. Beyond gRPC, the faults a test injects: compaction, a restore with
//! `--bump-revision --mark-compacted`, a wipe, a leader change.

mod errors;
mod kv;
mod leases;
mod service;
mod state;
mod store;
mod txn;
mod watch;

pub use errors::EtcdError;
pub use state::{Config, State};

use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::DuplexStream;
use tokio::sync::{mpsc, oneshot, watch as signal};
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

/// How many bytes an in-memory connection buffers each way.
const CONNECTION_BUFFER: usize = 256 * 1024;

/// What the gRPC services and the lease reaper share.
pub(crate) struct Shared {
    state: Mutex<State>,
    /// Bumped after every change, so that watch streams and the lease reaper look again.
    ticks: signal::Sender<u64>,
    /// Bumped when the member's data is replaced (restore, wipe): its streams end, as they do
    /// when a real member restarts.
    generation: AtomicU64,
    /// Requests to hold back on their way in ([`Etcd::hold_next_watch`], [`Etcd::hold_next_txn`]).
    holds: Mutex<Vec<Hold>>,
    /// Shown the state after every change ([`Etcd::observe`]).
    observer: Mutex<Option<Observer>>,
}

/// A checker shown the state after every change, and whether the member's data was replaced
/// (a restore or a wipe). It runs with the state held: it must not call the member.
pub type Observer = Box<dyn FnMut(&State, bool) + Send>;

impl Shared {
    /// Runs `f` on the state; wakes whoever waits for a change if it changed what they wait
    /// on (a read wakes no one).
    pub(crate) fn update<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        self.change(f, false)
    }

    /// [`Shared::update`]; `rebuilt`: `f` replaces the member's data.
    fn change<R>(&self, f: impl FnOnce(&mut State) -> R, rebuilt: bool) -> R {
        let mut state = self.state.lock().expect("no panic while the state is held");
        let before = state.epoch();
        let r = f(&mut state);
        if rebuilt || state.epoch() != before {
            if let Some(observe) = self.observer.lock().unwrap().as_mut() {
                observe(&state, rebuilt);
            }
            self.ticks.send_modify(|t| *t += 1);
        }
        r
    }

    /// Reads the state.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.state.lock().expect("no panic while the state is held"))
    }

    /// A receiver that sees every change.
    pub(crate) fn subscribe(&self) -> signal::Receiver<u64> {
        self.ticks.subscribe()
    }

    /// The current generation of the member's data.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Waits while a request of kind `what` for `key` is held back ([`Etcd::hold_next_watch`],
    /// [`Etcd::hold_next_txn`]).
    pub(crate) async fn hold_back(&self, what: Held, key: &[u8]) {
        if let Some(hold) = self.take_hold(what, key) {
            hold.wait().await;
        }
    }

    /// The hold set for the next request of kind `what` for `key`, if one is: it is the
    /// request's to wait on ([`Hold::wait`]).
    pub(crate) fn take_hold(&self, what: Held, key: &[u8]) -> Option<Hold> {
        let mut holds = self.holds.lock().expect("no panic while the holds are held");
        let i = (holds.iter()).position(|h| h.what == what && key.starts_with(&h.prefix));
        i.map(|i| holds.remove(i))
    }
}

/// The kinds of request a test can hold back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Held {
    /// A watch create request, by its key.
    Watch,
    /// A transaction, by the key of its first put.
    Txn,
}

/// A request to hold back: the next one of its kind for a key under `prefix`.
pub(crate) struct Hold {
    what: Held,
    prefix: Vec<u8>,
    arrived: oneshot::Sender<()>,
    release: oneshot::Receiver<()>,
}

impl Hold {
    /// Says the request has come, and waits until the test lets it on (or drops its end).
    pub(crate) async fn wait(self) {
        let _ = self.arrived.send(());
        let _ = self.release.await;
    }
}

/// A test's end of a request held back on its way in ([`Etcd::hold_next_watch`],
/// [`Etcd::hold_next_txn`]).
pub struct HeldRequest {
    arrived: oneshot::Receiver<()>,
    release: oneshot::Sender<()>,
}

impl HeldRequest {
    /// Completes when the request has come; false if it never will (the member stopped). It is
    /// held until [`HeldRequest::release`], or until this is dropped.
    pub async fn arrived(&mut self) -> bool {
        (&mut self.arrived).await.is_ok()
    }

    /// Lets the request on: it is applied (a watch made) on the data etcd has now.
    pub fn release(self) {
        let _ = self.release.send(());
    }
}

/// A snapshot of the member's data (`etcdctl snapshot save`).
#[derive(Clone, Debug)]
pub struct Snapshot(State);

/// The simulated etcd member; its server and lease reaper run as tasks on the current Tokio
/// runtime until it is dropped.
pub struct Etcd {
    shared: Arc<Shared>,
    incoming: mpsc::UnboundedSender<DuplexStream>,
    tasks: Vec<JoinHandle<()>>,
}

impl Etcd {
    /// Starts an empty member with `config`; must be called within a Tokio runtime.
    pub fn start(config: Config) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(config)),
            ticks: signal::channel(0).0,
            generation: AtomicU64::new(0),
            holds: Mutex::default(),
            observer: Mutex::default(),
        });
        let (incoming, connections) = mpsc::unbounded_channel();
        let tasks = vec![
            tokio::spawn(service::serve(shared.clone(), connections)),
            tokio::spawn(leases_reaper(shared.clone())),
        ];
        Etcd {
            shared,
            incoming,
            tasks,
        }
    }

    /// A new in-memory connection to the member: the seam where a test puts its faults.
    pub fn connect(&self) -> DuplexStream {
        let (client, server) = tokio::io::duplex(CONNECTION_BUFFER);
        // The server task lives as long as `self`: a send fails only while the member drops.
        let _ = self.incoming.send(server);
        client
    }

    /// A gRPC channel to the member that connects (and reconnects) in memory.
    pub fn channel(&self) -> Channel {
        let incoming = self.incoming.clone();
        let connector = tower::service_fn(move |_| {
            let (client, server) = tokio::io::duplex(CONNECTION_BUFFER);
            let sent = incoming.send(server);
            async move {
                sent.map_err(|_| std::io::Error::other("the simulated etcd has stopped"))?;
                Ok::<_, std::io::Error>(TokioIo::new(client))
            }
        });
        Endpoint::from_static("http://etcd.sim:2379").connect_with_connector_lazy(connector)
    }

    /// An etcd client of the member, as podlock makes one (`Client::from_channel`).
    pub async fn client(&self) -> etcd_client::Client {
        let channel = etcd_client::Channel::Tonic(self.channel());
        (etcd_client::Client::from_channel(channel, None).await).expect("no auth: nothing to fail")
    }

    /// Reads the member's data (for checkers: what keys, leases, revisions there are).
    pub fn inspect<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        self.shared.read(f)
    }

    /// Compacts at `revision`, as `etcdctl compact` does.
    pub fn compact(&self, revision: i64) -> Result<(), EtcdError> {
        self.shared.update(|s| s.store.compact(revision))
    }

    /// A leader change: a new raft term, and every lease's TTL starts again (from its latest
    /// checkpoint, if it had one).
    pub fn change_leader(&self) {
        self.shared
            .update(|s| s.change_leader(tokio::time::Instant::now()));
    }

    /// Holds back the next watch create request for a key under `prefix` until the returned
    /// [`HeldRequest`] lets it on, as a slow network would; its stream's later requests wait
    /// behind it. A test's seam to land writes between a client's read and the start of the
    /// watch it makes after it.
    pub fn hold_next_watch(&self, prefix: &[u8]) -> HeldRequest {
        self.hold_next(Held::Watch, prefix)
    }

    /// Holds back the next transaction whose first put is of a key under `prefix` until the
    /// returned [`HeldRequest`] lets it on: applied then, as a copy a member received before a
    /// fault and committed seconds later is. Other requests pass it.
    pub fn hold_next_txn(&self, prefix: &[u8]) -> HeldRequest {
        self.hold_next(Held::Txn, prefix)
    }

    fn hold_next(&self, what: Held, prefix: &[u8]) -> HeldRequest {
        let (arrived, arrival) = oneshot::channel();
        let (release, released) = oneshot::channel();
        let hold = Hold {
            what,
            prefix: prefix.to_vec(),
            arrived,
            release: released,
        };
        self.shared.holds.lock().unwrap().push(hold);
        HeldRequest {
            arrived: arrival,
            release,
        }
    }

    /// A snapshot of the member's data now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot(self.shared.read(State::clone))
    }

    /// The member restarted from `snapshot` with `etcdutl snapshot restore --bump-revision
    /// bump [--mark-compacted]`: its streams end, its revision is the snapshot's plus `bump`,
    /// and its leases start their TTLs again under the new leader; the ids of new leases go on
    /// past every one given before.
    pub fn restore(&self, snapshot: &Snapshot, bump: i64, mark_compacted: bool) {
        self.replace(|s| {
            let before = std::mem::replace(s, snapshot.0.clone());
            s.leases.restarted_after(&before.leases);
            s.store.bump(bump, mark_compacted);
            s.change_leader(tokio::time::Instant::now());
        });
    }

    /// The member reinstalled with an empty data directory: revisions start again from 1, and
    /// the ids of new leases go on past every one given before.
    pub fn wipe(&self) {
        self.replace(|s| {
            let before = std::mem::replace(s, State::new(s.config.clone()));
            s.leases.restarted_after(&before.leases);
        });
    }

    fn replace(&self, f: impl FnOnce(&mut State)) {
        self.shared.change(f, true);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        self.shared.ticks.send_modify(|t| *t += 1);
    }

    /// Shows `observer` the state after every change from now on (see [`Observer`]).
    pub fn observe(&self, observer: Observer) {
        *self.shared.observer.lock().unwrap() = Some(observer);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Revokes each lease when it expires on Tokio's clock. etcd's leader looks every 500 ms and
/// revokes through raft; here a lease goes at its expiry exactly.
async fn leases_reaper(shared: Arc<Shared>) {
    let mut changes = shared.subscribe();
    loop {
        let next = shared.read(|s| s.leases.next_expiry());
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(next.unwrap_or_else(tokio::time::Instant::now)), if next.is_some() => {
                shared.update(|s| s.expire(tokio::time::Instant::now()));
            }
            changed = changes.changed() => if changed.is_err() { return },
        }
    }
}
