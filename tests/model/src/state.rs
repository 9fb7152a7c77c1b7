//! The model's state: an abstract etcd (locks' settings keys and queue keys with their create
//! and mod revisions, pods' leases) and each client's view of it.
//!
//! Revisions are renumbered after every step, keeping their order ([`State::normalize`]): the
//! protocol only compares them, so two states that differ only in how far the counter has run
//! behave alike, and the state space stays finite.

/// An etcd revision (0: none).
pub type Rev = u16;

/// Whether a queue entry records its grant (`acquiredAt`), and who wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Record {
    /// Not recorded: the key waits, or was granted a moment ago.
    No,
    /// Recorded by its own client.
    Own,
    /// Recorded by a waiter behind it (recording on behalf).
    Behalf,
}

/// A queue key, bound to its pod's lease.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    /// The client that put it.
    pub owner: u8,
    /// The lease epoch of the owner's pod it is bound to.
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
}

impl Key {
    /// Its name.
    pub fn name(&self) -> Name {
        (self.owner, self.epoch, self.holder)
    }
}

/// A lock: its settings key and its queue.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lock {
    /// `maxHolders`, as the settings key says (or said, while the lock is deleted).
    pub max: u8,
    /// The settings key's mod revision; 0 while the lock is deleted.
    pub modrev: Rev,
    /// The queue, in create-revision order.
    pub queue: Vec<Key>,
    /// The highest fencing token granted so far.
    pub last_token: Rev,
    /// How many scheduled `maxHolders` changes were made.
    pub changes: u8,
}

/// A pod's sidecar and its session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Pod {
    /// Its lease's epoch: a new session has a new lease.
    pub epoch: u8,
    /// Whether etcd still has that lease.
    pub lease: bool,
    /// Whether the pod died (its clients act no more; its lease expires).
    pub crashed: bool,
}

/// A lock's settings as a client last read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cached {
    /// `maxHolders`.
    pub max: u8,
    /// The settings key's mod revision (0: the lock was not found).
    pub modrev: Rev,
}

/// What a waiter read and what wakes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Wait {
    /// Its key's create revision.
    pub ticket: Rev,
    /// The revision of its last read.
    pub at: Rev,
    /// The keys it watches (create revision; true: any change, false: deletion).
    pub wakes: Vec<(Rev, bool)>,
    /// The unrecorded grant ahead it waits behind, by name, which it may record.
    pub behind: Option<Name>,
}

/// A queue key's name: its owner, the lease epoch in it, and the holder id's generation.
pub type Name = (u8, u8, u8);

/// Where a client's current acquire or hold is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Phase {
    /// No acquire in progress.
    Idle,
    /// About to send the enqueue transaction.
    Enqueue,
    /// Removing a key of its own holder id found in the way (or given up), then enqueueing.
    Requeue { old: Rev },
    /// Waiting for an event on what it watches.
    Waiting(Wait),
    /// About to read its position again.
    Reading { ticket: Rev },
    /// Holding (from its grant decision on); `recorded`: its grant record was written or
    /// tried.
    Holding { ticket: Rev, epoch: u8, recorded: bool },
}

/// A client: an app and the engine's acquire or hold for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Client {
    /// Its acquire or hold.
    pub phase: Phase,
    /// The settings its sidecar cached.
    pub cache: Cached,
    /// Acquires it has yet to make.
    pub left: u8,
    /// Its holder id's generation.
    pub holder: u8,
    /// Keys its sidecar is removing in the background (create revisions).
    pub removals: Vec<Rev>,
}

/// A grant that broke a safety rule as it was made (kept, so the property sees it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Broken {
    /// More holders than the `maxHolders` in force.
    Limit,
    /// A token not above every token granted before.
    TokenOrder,
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
    /// The first safety rule a grant broke.
    pub broken: Option<Broken>,
    /// The highest revision the state remembers (after [`State::normalize`]).
    pub top: Rev,
}

impl State {
    /// The revision the next write gets: above every revision the state remembers (one step
    /// makes at most one write transaction).
    pub fn next_rev(&self) -> Rev {
        self.top + 1
    }

    /// Renumbers revisions 1, 2, ... in their order (0 stays "none"), and sets `top`.
    pub fn normalize(&mut self) {
        let mut seen = vec![0];
        self.each_rev(|r| seen.push(*r));
        seen.sort_unstable();
        seen.dedup();
        self.each_rev(|r| *r = seen.binary_search(r).expect("seen") as Rev);
        self.top = (seen.len() - 1) as Rev;
    }

    fn each_rev(&mut self, mut f: impl FnMut(&mut Rev)) {
        for lock in &mut self.locks {
            f(&mut lock.modrev);
            f(&mut lock.last_token);
            for key in &mut lock.queue {
                f(&mut key.create);
                f(&mut key.modrev);
            }
        }
        if let Some((_, create)) = &mut self.release {
            f(create);
        }
        for client in &mut self.clients {
            f(&mut client.cache.modrev);
            client.removals.iter_mut().for_each(&mut f);
            match &mut client.phase {
                Phase::Idle | Phase::Enqueue => {}
                Phase::Requeue { old: r } | Phase::Reading { ticket: r } => f(r),
                Phase::Holding { ticket, .. } => f(ticket),
                Phase::Waiting(w) => {
                    f(&mut w.ticket);
                    f(&mut w.at);
                    w.wakes.iter_mut().for_each(|(r, _)| f(r));
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
        let epoch = self.pods[pod as usize].epoch;
        for lock in &mut self.locks {
            (lock.queue).retain(|k| owners[k.owner as usize] != pod || k.epoch != epoch);
        }
        self.pods[pod as usize].lease = false;
    }
}
