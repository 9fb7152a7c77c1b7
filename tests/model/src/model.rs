//! The Stateright model: every client step and every step of the world around the clients
//! (leases ending, pods dying, the operator) is one action, and each action that talks to
//! etcd is one etcd request, applied atomically to the abstract store. A client decides on
//! what its last read returned, which may be stale by the time it acts.

use stateright::{Model, Property};

use crate::late::Late;
use crate::props;
use crate::spec::{Rebuild, Spec};
use crate::state::{Cached, Client, Lock, Phase, Pod, Rebuilt, Rev, State, Status, Yields};

/// One client's step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// The app asks for the lock: the enqueue transaction (settings guard, put-if-absent,
    /// read of the keys ahead).
    Start,
    /// The enqueue transaction again (its settings or session were out of date).
    Enqueue,
    /// Removes its own earlier key found in the way (guarded by create revision).
    Requeue,
    /// An event on what it watches arrives: the position read (its own key, the settings,
    /// the keys ahead, in one transaction).
    Wake,
    /// The same read without an event (a watch broke, or the engine closes the gap between
    /// its read and its watches with another read).
    Rewatch,
    /// The position read again (the settings had changed, or after recording on behalf).
    Read,
    /// Records the grant of the key ahead that it waits behind (the rejected `record_for`).
    OnBehalf,
    /// Writes its own grant record (guarded by create revision).
    Record,
    /// A holder that knows no key behind it reads the keys behind it (its chain), so that its
    /// release can hand the lock on (the engine does so when the grant handed to it came with
    /// no key behind, which a busy lock's chain ran out to). Only a read.
    Refill,
    /// The app releases (or closes the hold's connection): guarded delete.
    Release,
    /// The copy of a release the hedge sent again answers it (see [`crate::resend`]).
    Resend,
    /// A multi-lock set reads its position in one of its locks, woken by an event there (or
    /// with a read due).
    WakeLock(u8),
    /// The same without an event (a broken watch).
    RewatchLock(u8),
    /// A multi-lock set admitted on every lock records its grant on all its keys.
    SetRecord,
    /// The hold's watch (or its session) tells it its key is gone.
    Learn,
    /// The deadline passes while waiting (or a connection-bound waiter's connection closes).
    GiveUp,
    /// A background removal of a key it no longer tracks (guarded by create revision), the
    /// one at this index.
    Removal(u8),
    /// The app misses its heartbeat: the sidecar ends the hold and removes its key.
    HeartbeatMiss,
    /// The hold reaches its maximum hold time: the sidecar ends it and removes its key.
    Deadline,
}

/// One step of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// A client's step.
    Client(u8, Step),
    /// A live pod's lease ends (expired while paused, or revoked by the operator).
    EndLease(u8),
    /// A pod dies.
    Crash(u8),
    /// A dead pod's lease expires.
    Expire(u8),
    /// The operator of a cluster ends the holds of a pod it judges gone: it revokes the
    /// pod's lease (cluster, pod).
    Revoke(u8, u8),
    /// The operator deletes a queue key (a hold revoked).
    DeleteKey(u8, Rev),
    /// The operator deletes a lock: its settings key and its queue, in one transaction.
    DeleteLock(u8),
    /// The operator declares a deleted lock again.
    Declare(u8),
    /// The operator sets the lock's `maxHolders` to its next scheduled value.
    SetMax(u8),
    /// An administrator asks to release a holder (`podlock.io/release`): the operator reads the
    /// lock and picks the holder key with this create revision, by the queue's rule
    /// (`protocol::held_count`) under the settings etcd has.
    ReleaseRead(u8, Rev),
    /// The operator deletes the key it read for the release, guarded by its create revision.
    ReleaseDelete,
    /// The operator reads a lock and picks the holder key with this create revision whose
    /// entry has a maximum hold time, as past its deadline (see [`crate::deadline`]).
    DeadlineRead(u8, Rev),
    /// The operator deletes the key it read as past its deadline, guarded by its create
    /// revision.
    DeadlineDelete,
    /// The operator reads a lock for a yield request and picks the holder key with this create
    /// revision (see [`crate::yielding`]).
    YieldRead(u8, Rev),
    /// The operator writes the request into the key it read, guarded by its mod revision.
    YieldWrite,
    /// etcd is wiped and started again, empty.
    Wipe,
    /// A snapshot of etcd is taken.
    Snapshot,
    /// etcd is restored from the snapshot.
    Restore,
    /// The operator reconciles a lock whose settings are gone or whose etcd was restored:
    /// publishes its settings under the epoch its rule chooses. `Some(c)`: etcd's revision
    /// happens to reach, at that write, the settings' mod revision client `c` cached from the
    /// etcd before (revisions of two etcds can coincide).
    Republish(u8, Option<u8>),
    /// The operator mirrors a lock's holders into its status (`status.fencingToken`) and
    /// the settings' epoch (`status.fencingEpoch`).
    Mirror(u8),
    /// The second cluster's operator reconciles lock 0 ([`crate::publishers`]).
    OtherPublish,
    /// The second cluster's operator mirrors lock 0 into its status.
    OtherMirror,
    /// A key no acquire tracks is removed (the sidecar's orphan sweep, or its lease expiring).
    Sweep(u8, Rev),
    /// A copy of client's first enqueue reaches etcd late (see [`crate::state::LateCopy`]).
    LateCopy(u8),
    /// A copy of client's last grant record reaches etcd late (see [`crate::yielding`]).
    LateRecord(u8),
    /// The lock's DistributedLock is deleted and created again: the operator's withdrawal
    /// removes its settings and queue, keeping its epoch in etcd, and the new object's status
    /// is empty.
    Recreate(u8),
}

impl Action {
    /// Whether the step is one the liveness properties may rely on: the protocol's own steps
    /// and a dead pod's lease expiring. Faults, settings changes, giving up and broken watches
    /// are not: a property must hold however many of them happened before, without them.
    pub fn good(&self) -> bool {
        match self {
            Action::Client(_, step) => !matches!(
                step,
                Step::Rewatch
                    | Step::RewatchLock(_)
                    | Step::GiveUp
                    | Step::HeartbeatMiss
                    | Step::Deadline
                    | Step::Refill
            ),
            Action::Expire(_)
            | Action::Revoke(..)
            | Action::Republish(..)
            | Action::Mirror(_)
            | Action::OtherPublish
            | Action::OtherMirror
            | Action::Sweep(..)
            | Action::LateCopy(_)
            | Action::LateRecord(_) => true,
            _ => false,
        }
    }
}

/// A path: each step with the state after it.
pub type Steps = Vec<(Action, State)>;

impl Action {
    /// Whether the step is a holder leaving (its release).
    pub fn leaves(&self) -> bool {
        matches!(self, Action::Client(_, Step::Release))
    }
}

/// The protocol model of one [`Spec`].
pub struct Protocol {
    /// What is explored.
    pub spec: Spec,
    /// Each client's pod.
    pub owners: Vec<u8>,
}

impl Protocol {
    /// The model of `spec`.
    pub fn new(spec: Spec) -> Self {
        let owners = spec.clients.iter().map(|c| c.pod).collect();
        Protocol { spec, owners }
    }

    /// The state every run starts from: each lock declared, no key queued.
    pub fn init(&self) -> State {
        let locks = (self.spec.max_holders.iter().enumerate())
            .map(|(i, &max)| Lock {
                max,
                modrev: i as Rev + 1,
                epoch: 0,
                queue: vec![],
                last_token: (0, 0),
                changes: 0,
                retired: false,
                receipts: vec![],
                publisher: 0,
            })
            .collect::<Vec<_>>();
        let locks_len = locks.len() as Rev;
        let pod = Pod {
            session: 0,
            lease: true,
            crashed: false,
        };
        let clients = (self.spec.clients.iter())
            .map(|c| Client {
                phase: Phase::Idle,
                cache: Cached::of(&locks[c.lock as usize]),
                seen: locks[c.lock as usize].epoch,
                also_cache: c.also.map(|l| Cached::of(&locks[l as usize])),
                left: c.acquires,
                holder: 0,
                removals: vec![],
                late: match self.spec.late_copies && c.also.is_none() {
                    true => Late::Unsent,
                    false => Late::Spent,
                },
                record_copy: None,
            })
            .collect();
        let mut state = State {
            pods: vec![pod; self.spec.pods as usize],
            locks,
            clients,
            faults: self.spec.faults,
            releases: self.spec.releases,
            release: None,
            released_holder: false,
            deadlines: self.spec.deadlines,
            deadline: None,
            deadline_ended: (false, false),
            yields: Yields {
                left: self.spec.yields,
                ..Yields::default()
            },
            revoked: false,
            late_landed: false,
            resent_own: false,
            broken: None,
            etcd: locks_len,
            rebuilt: self.spec.rebuild.map(|_| {
                Box::new(Rebuilt {
                    left: match self.spec.rebuild {
                        _ if self.spec.two_publishers => 2,
                        Some(Rebuild::WipeThenRestore) => 2,
                        _ => 1,
                    },
                    status: vec![Status::default(); locks_len as usize],
                    ..Rebuilt::default()
                })
            }),
        };
        state.normalize();
        state
    }

    /// Whether `client`'s pod is alive.
    pub fn alive(&self, state: &State, client: u8) -> bool {
        !state.pods[self.owners[client as usize] as usize].crashed
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.init()]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.broken.is_some() {
            return; // the run already failed: its path ends here
        }
        for c in 0..state.clients.len() as u8 {
            if self.alive(state, c) {
                self.client_steps(state, c, actions);
            }
        }
        self.world_steps(state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut next = state.clone();
        match action {
            Action::Client(c, step) => self.client_step(&mut next, c, step),
            _ => self.world_step(&mut next, action),
        }
        next.normalize();
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        props::properties()
    }
}
