//! The model's state: an abstract etcd (locks' settings keys and queue keys with their create
//! and mod revisions, pods' leases); each client's view of it is in [`crate::view`].
//!
//! Revisions are renumbered after every step, keeping their order ([`State::normalize`]): the
//! protocol only compares them, so two states that differ only in how far the counter has run
//! behave alike, and the state space stays finite. etcd's own counter ([`State::etcd`]) is kept
//! apart: after a wipe or a restore from an older snapshot it lies below revisions handed out
//! before, and every new revision then lands between it and the next one remembered
//! ([`State::next_rev`]): the new etcd's revisions stay below the old ones, the worst case for
//! fencing tokens.

use podlock::lock::Token as Fencing;
use podlock::lock::protocol::epoch::Known;

/// An etcd revision (0: none).
pub type Rev = u16;

pub use crate::multi::Turn;
pub use crate::resend::Receipt;
pub use crate::view::{Cached, Client, Name, Phase, Wait};
pub use crate::yielding::Yields;

/// A fencing token: the lock's epoch when its key was enqueued, then the key's create revision
/// (`Token` in the engine: `epoch * 2^40 + revision`; (0, 0): none).
pub type Token = (u8, Rev);

/// Whether a queue entry records its grant (`acquiredAt`), and who wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Record {
    /// Not recorded: the key waits, or was granted a moment ago.
    No,
    /// Recorded by its own client.
    Own,
    /// Recorded by a waiter behind it (recording on behalf).
    Behalf,
    /// Written by the release of the holder ahead (direct handoff): granted, but not yet
    /// recorded by its owner, so it counts as not recorded for the keys behind it.
    Handed,
}

/// A queue key, bound to its pod's lease.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    /// The client that put it.
    pub owner: u8,
    /// The session (lease) of the owner's pod it is bound to.
    pub session: u8,
    /// The token epoch its entry records (the settings' epoch it was enqueued under).
    pub epoch: u8,
    /// The holder id's generation (a connection-bound client has a new one per connection).
    pub holder: u8,
    /// Its create revision: its place in the queue and its fencing token.
    pub create: Rev,
    /// Its mod revision.
    pub modrev: Rev,
    /// Its entry's mode.
    pub shared: bool,
    /// Its entry's grant record.
    pub record: Record,
    /// The chain handed on with a [`Record::Handed`] grant: the keys behind it the releaser
    /// knew (create revisions, nearest first).
    pub next: Vec<Rev>,
    /// Its entry asks for a maximum hold time (`maxHoldSeconds`).
    pub timed: bool,
    /// Its entry carries a yield request ([`crate::yielding`]).
    pub yielding: bool,
}

impl Key {
    /// Its fencing token.
    pub fn token(&self) -> Token {
        (self.epoch, self.create)
    }

    fn each_rev(&mut self, f: &mut impl FnMut(&mut Rev)) {
        f(&mut self.create);
        f(&mut self.modrev);
        self.next.iter_mut().for_each(f);
    }

    /// Its name.
    pub fn name(&self) -> Name {
        (self.owner, self.session, self.holder)
    }
}

/// A lock: its settings key and its queue in etcd, what the operator keeps in its
/// DistributedLock's status, and the highest token granted (which no one reads: the property's
/// record).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lock {
    /// `maxHolders`, as the settings key says (or said, while the lock is deleted).
    pub max: u8,
    /// The settings key's mod revision; 0 while the lock is deleted (or etcd lost it).
    pub modrev: Rev,
    /// The settings' token epoch.
    pub epoch: u8,
    /// The queue, in create-revision order.
    pub queue: Vec<Key>,
    /// The highest fencing token granted so far.
    pub last_token: Token,
    /// How many scheduled `maxHolders` changes were made.
    pub changes: u8,
    /// Removed, its epoch kept in etcd while it has no settings (`/podlock/v1/retired/...`):
    /// the operator publishes it again under that epoch.
    pub retired: bool,
    /// The release receipts in etcd: one per pod's session (lease), naming the key its last
    /// release deleted (see [`crate::resend`]).
    pub receipts: Vec<Receipt>,
    /// The cluster whose operator published the settings (0 but in [`crate::publishers`]).
    pub publisher: u8,
}

/// What the operator keeps of a lock outside etcd, in its DistributedLock's status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Status {
    /// `status.fencingEpoch`: the highest epoch the operator published (written before it
    /// publishes one).
    pub epoch: u8,
    /// `status.fencingToken`: the highest token the operator saw in the queue.
    pub token: Token,
    /// etcd was restored from a snapshot, and the operator has not reconciled the lock since.
    pub unreconciled: bool,
    /// The restore brought back a key the operator's etcd watch had seen end (its memory, not
    /// the DistributedLock's): the operator moves the lock to a new epoch when it reconciles.
    pub returned: bool,
    /// The DistributedLock was created anew: its status records nothing yet (no
    /// `fencingEpoch`, no `fencingToken`), until the operator publishes it.
    pub fresh: bool,
}

impl Status {
    /// What `status` says was handed out, as the operator reads it: nothing for a lock created
    /// anew, else the epoch recorded and the largest token seen (none while it is `(0, 0)`).
    pub fn known(&self) -> Known {
        if self.fresh {
            return Known::default();
        }
        let (epoch, revision) = self.token;
        Known {
            published: Some(u32::from(self.epoch)),
            token: (self.token != (0, 0))
                .then(|| Fencing::new(u32::from(epoch), i64::from(revision)).expect("a token")),
        }
    }
}

/// What only the runs that rebuild etcd keep (`None` in the others, whose states stay as small
/// as they were).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Rebuilt {
    /// Wipes or restores still allowed.
    pub left: u8,
    /// The snapshot taken, if one was.
    pub snapshot: Option<Snapshot>,
    /// Per lock: its status.
    pub status: Vec<Status>,
    /// A grant went below an earlier token between a restore and the operator's reconcile of
    /// it (kept, and the run goes on).
    pub window_broken: bool,
    /// A client was granted under a lower token epoch than its sidecar had seen the lock under
    /// (kept, and the run goes on: the property [`crate::props::FLOOR`]).
    pub floor_broken: bool,
    /// A grant was made after etcd's wipe or restore.
    pub granted_after: bool,
    /// The DistributedLock was deleted and created again (once, in the runs that do).
    pub recreated: bool,
    /// A grant under an epoch above 0 was made after that.
    pub granted_recreated: bool,
    /// The second cluster's status of the lock ([`crate::publishers`]; lock 0 only).
    pub other: Status,
    /// The highest epoch any operator published, and the cluster that published it first.
    pub highest: (u8, u8),
    /// The lock's settings carry an epoch published again by an operator that did not know
    /// it was used (its status behind the other cluster's), and no operator that knows has
    /// reconciled since: the cross-cluster window ([`crate::publishers`]).
    pub reused: bool,
    /// A grant went below an earlier token in that window (kept, and the run goes on).
    pub reuse_broken: bool,
    /// Whether revisions above etcd's are remembered (after a wipe or restore): set by
    /// [`State::normalize`], so that a write finds out without looking at every revision.
    pub behind: bool,
}

/// What a snapshot of etcd holds, and a restore brings back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Snapshot {
    /// Per lock: `maxHolders`, the settings' mod revision and epoch, the queue, and whether
    /// its epoch was kept at a removal.
    pub locks: Vec<(u8, Rev, u8, Vec<Key>, bool)>,
    /// Per pod: the session whose lease was live.
    pub leases: Vec<Option<u8>>,
    /// etcd's revision.
    pub etcd: Rev,
}

/// A pod's sidecar and its session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Pod {
    /// Its session: a new session has a new lease.
    pub session: u8,
    /// Whether etcd still has that lease.
    pub lease: bool,
    /// Whether the pod died (its clients act no more; its lease expires).
    pub crashed: bool,
}

/// A grant that broke a safety rule as it was made (kept, so the property sees it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Broken {
    /// More holders than the `maxHolders` in force.
    Limit,
    /// A token not above every token granted before.
    TokenOrder,
    /// An operator ended the holds of a live pod.
    LiveRevoked,
    /// A release answered otherwise than what its own copy did (see [`crate::resend`]).
    ReleaseAnswer,
    /// The operator's deadline release ended another hold than the one it read as due (see
    /// [`crate::deadline`]).
    DeadlineOther,
}

/// The whole model state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The locks.
    pub locks: Vec<Lock>,
    /// The pods.
    pub pods: Vec<Pod>,
    /// The clients.
    pub clients: Vec<Client>,
    /// Faults still allowed.
    pub faults: u8,
    /// Administrators' force releases still allowed.
    pub releases: u8,
    /// A force release the operator has read but not yet applied: the lock, and the create
    /// revision of the holder's key it read (its guarded delete comes in a later step).
    pub release: Option<(u8, Rev)>,
    /// Whether a force release ended a hold its client believed it had.
    pub released_holder: bool,
    /// Holds the operator may still end at their deadline.
    pub deadlines: u8,
    /// A deadline release the operator has read but not yet applied: the lock, and the create
    /// revision and name of the timed holder's key it read.
    pub deadline: Option<(u8, Rev, Name)>,
    /// Whether a hold was ended at its deadline by its sidecar, and by the operator while its
    /// client believed it held.
    pub deadline_ended: (bool, bool),
    /// The yield requests ([`crate::yielding`]).
    pub yields: Yields,
    /// An operator ended the holds of a dead pod of its cluster.
    pub revoked: bool,
    /// A late copy of an enqueue put its key back after the key had left the queue.
    pub late_landed: bool,
    /// A release whose answer was lost was answered `released` by its copy sent again.
    pub resent_own: bool,
    /// The first safety rule a grant broke.
    pub broken: Option<Broken>,
    /// etcd's revision: the one the next write comes after.
    pub etcd: Rev,
    /// The state of etcd's rebuild and of the operator's status, in the runs that rebuild.
    pub rebuilt: Option<Box<Rebuilt>>,
}

impl State {
    /// The rebuild's state (in a run that rebuilds etcd).
    pub fn rebuilt(&mut self) -> &mut Rebuilt {
        self.rebuilt.as_deref_mut().expect("a run that rebuilds etcd")
    }

    /// The revision of a write made now: etcd's revision plus one. Revisions remembered above
    /// etcd's (handed out before a wipe or restore) move up to make room, so the new one lies
    /// below all of them.
    pub fn next_rev(&mut self) -> Rev {
        let etcd = self.etcd;
        if self.rebuilt.as_ref().is_some_and(|r| r.behind) {
            self.each_rev(|r| {
                if *r > etcd {
                    *r += 1;
                }
            });
        }
        self.etcd = etcd + 1;
        self.etcd
    }

    /// Renumbers revisions 1, 2, ... in their order (0 stays "none"). etcd's revision, when at
    /// or above every remembered one, becomes the highest of them: how far beyond it lies
    /// changes nothing.
    pub fn normalize(&mut self) {
        let mut seen = vec![0];
        self.each_rev(|r| seen.push(*r));
        let top = seen.iter().copied().max().unwrap_or(0);
        self.etcd = self.etcd.min(top);
        if let Some(r) = &mut self.rebuilt {
            r.behind = self.etcd < top;
        }
        seen.push(self.etcd);
        seen.sort_unstable();
        seen.dedup();
        let rank = |r: &mut Rev| *r = seen.binary_search(r).expect("seen") as Rev;
        self.each_rev(rank);
        rank(&mut self.etcd);
    }

    fn each_rev(&mut self, mut f: impl FnMut(&mut Rev)) {
        for lock in &mut self.locks {
            f(&mut lock.modrev);
            f(&mut lock.last_token.1);
            lock.queue.iter_mut().for_each(|k| k.each_rev(&mut f));
            lock.receipts.iter_mut().for_each(|r| f(&mut r.ticket));
        }
        if let Some(r) = &mut self.rebuilt {
            r.status.iter_mut().for_each(|st| f(&mut st.token.1));
            if let Some(snap) = &mut r.snapshot {
                f(&mut snap.etcd);
                for (_, modrev, _, queue, _) in &mut snap.locks {
                    f(modrev);
                    queue.iter_mut().for_each(|k| k.each_rev(&mut f));
                }
            }
        }
        if let Some((_, create)) = &mut self.release {
            f(create);
        }
        if let Some((_, create, _)) = &mut self.deadline {
            f(create);
        }
        self.yields.each_rev(&mut f);
        for client in &mut self.clients {
            f(&mut client.cache.modrev);
            client.also_cache.iter_mut().for_each(|c| f(&mut c.modrev));
            client.removals.iter_mut().for_each(&mut f);
            if let Some((create, modrev)) = &mut client.record_copy {
                f(create);
                f(modrev);
            }
            match &mut client.phase {
                Phase::Idle | Phase::Enqueue => {}
                Phase::Requeue { old: r }
                | Phase::Reading { ticket: r }
                | Phase::Releasing { ticket: r, .. } => f(r),
                Phase::Holding { ticket, chain, .. } => {
                    f(ticket);
                    chain.iter_mut().for_each(&mut f);
                }
                Phase::Waiting(w) => {
                    f(&mut w.ticket);
                    f(&mut w.at);
                    w.wakes.iter_mut().for_each(|(_, r, _)| f(r));
                    for t in &mut w.turns {
                        f(&mut t.at);
                        if let Turn::Admitted(cached) = &mut t.turn {
                            f(&mut cached.modrev);
                        }
                    }
                }
            }
        }
    }

    /// The key of `lock` named `name`, if there is one.
    pub fn named(&mut self, lock: u8, name: Name) -> Option<&mut Key> {
        (self.locks[lock as usize].queue.iter_mut()).find(|k| k.name() == name)
    }

    /// The key of `lock` with create revision `create`, if it is still there.
    pub fn key(&self, lock: u8, create: Rev) -> Option<&Key> {
        self.locks[lock as usize]
            .queue
            .iter()
            .find(|k| k.create == create)
    }

    /// The same, to change it.
    pub fn key_mut(&mut self, lock: u8, create: Rev) -> Option<&mut Key> {
        (self.locks[lock as usize].queue.iter_mut()).find(|k| k.create == create)
    }

    /// Deletes the key of `lock` with create revision `create`, if it is still there (a delete
    /// guarded by create revision); returns whether it did.
    pub fn delete(&mut self, lock: u8, create: Rev) -> bool {
        let queue = &mut self.locks[lock as usize].queue;
        let before = queue.len();
        queue.retain(|k| k.create != create);
        queue.len() != before
    }

    /// Ends `pod`'s lease: etcd deletes every key bound to it, in every lock, at once.
    pub fn end_lease(&mut self, pod: u8, owners: &[u8]) {
        let session = self.pods[pod as usize].session;
        for lock in &mut self.locks {
            (lock.queue).retain(|k| owners[k.owner as usize] != pod || k.session != session);
            (lock.receipts).retain(|r| r.pod != pod || r.session != session);
        }
        self.pods[pod as usize].lease = false;
    }
}
