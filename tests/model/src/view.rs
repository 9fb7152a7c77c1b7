//! Each client's view of the abstract etcd ([`crate::state`]): the settings it cached, where its
//! acquire or hold is, and what it waits on.

use crate::multi::SetTurn;
use crate::state::{Lock, Rev};

/// A lock's settings as a client last read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cached {
    /// `maxHolders`.
    pub max: u8,
    /// The settings key's mod revision (0: the lock was not found).
    pub modrev: Rev,
    /// The settings' token epoch.
    pub epoch: u8,
}

impl Cached {
    /// The settings of `lock` as etcd has them now.
    pub fn of(lock: &Lock) -> Self {
        Cached {
            max: lock.max,
            modrev: lock.modrev,
            epoch: lock.epoch,
        }
    }
}

/// What a waiter read and what wakes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Wait {
    /// Its key's create revision.
    pub ticket: Rev,
    /// The revision of its last read.
    pub at: Rev,
    /// The keys it watches (lock, create revision; true: any change, false: deletion).
    pub wakes: Vec<(u8, Rev, bool)>,
    /// The unrecorded grant ahead it waits behind, by name, which it may record.
    pub behind: Option<Name>,
    /// A multi-lock set's turn on each of its locks, each read on its own (empty for one lock).
    pub turns: Vec<SetTurn>,
}

/// A queue key's name: its owner, the session (lease) in it, and the holder id's generation.
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
    /// tried; `chain`: the keys behind it that it knows, to hand the lock on to.
    Holding {
        ticket: Rev,
        session: u8,
        recorded: bool,
        chain: Vec<Rev>,
    },
    /// Released: its first copy was applied (and deleted the key if `own`), but its answer was
    /// lost; the copy the hedge sent again is to answer (see [`crate::resend`]). `slot`: where
    /// its receipt lies.
    Releasing {
        ticket: Rev,
        session: u8,
        own: bool,
        slot: u8,
    },
}

/// A client: an app and the engine's acquire or hold for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Client {
    /// Its acquire or hold.
    pub phase: Phase,
    /// The settings its sidecar cached.
    pub cache: Cached,
    /// The highest token epoch its sidecar has taken the lock's settings under since it last
    /// found the lock undeclared: the floor below which it grants nothing (issue #54, F11;
    /// the engine's settings cache keeps it).
    pub seen: u8,
    /// Those of the other lock of a multi-lock acquire.
    pub also_cache: Option<Cached>,
    /// Acquires it has yet to make.
    pub left: u8,
    /// Its holder id's generation.
    pub holder: u8,
    /// Keys its sidecar is removing in the background (create revisions).
    pub removals: Vec<Rev>,
    /// The late copy of its first enqueue (in a run with late copies).
    pub late: crate::late::Late,
    /// A copy of its last grant record still on its way to etcd (in a run with late records):
    /// the create revision of its keys and the only mod revision at which its guard lets it
    /// land (0: none).
    pub record_copy: Option<(Rev, Rev)>,
}

impl Client {
    /// The create revision of the key its acquire or hold is about, if any.
    pub fn ticket(&self) -> Option<Rev> {
        match &self.phase {
            Phase::Idle | Phase::Enqueue => None,
            Phase::Requeue { old: r } | Phase::Reading { ticket: r } => Some(*r),
            Phase::Holding { ticket, .. } | Phase::Releasing { ticket, .. } => Some(*ticket),
            Phase::Waiting(w) => Some(w.ticket),
        }
    }
}
