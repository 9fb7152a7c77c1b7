//! What one model run explores: the locks, the pods and their clients, how many faults and
//! settings changes may happen, and which protocol variant (or injected bug) is in force.

/// How a client waits and holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSpec {
    /// The pod (sidecar) it runs in: clients of one pod share its lease.
    pub pod: u8,
    /// The lock it contends for.
    pub lock: u8,
    /// A second lock taken with the first as one (a multi-lock acquire, see
    /// [`crate::multi`]): one key in each queue, put by one transaction.
    pub also: Option<u8>,
    /// Shared (else exclusive).
    pub shared: bool,
    /// A connection-bound hold (`POST /hold`): a new holder id per connection, and a closed
    /// connection removes its key in the background. Otherwise `/acquire` with one holder id,
    /// which may meet its own earlier key still in the queue.
    pub connection: bool,
    /// A heartbeat window: the sidecar may end the hold as lost and remove its key.
    pub heartbeat: bool,
    /// How many acquires it makes, one after the other.
    pub acquires: u8,
    /// Its first acquire asks for a maximum hold time (its later ones do not): its hold may end
    /// at any moment, by its sidecar or by the operator ([`crate::deadline`]).
    pub deadline: bool,
    /// How many of its lock's slots each of its holds takes (`permits`, [`crate::permits`]).
    pub permits: u8,
}

/// Recording the grant of a key ahead whose owner left it unrecorded: a rejected design (it
/// was `queue::record_for`), checked to show why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnBehalf {
    /// Off: a key waits for each key ahead of it to record its own grant.
    Off,
    /// As `queue::record_for` did (rejected by this model, removed from the engine): a waiter behind an unrecorded grant it would otherwise be let in
    /// past records that key (by name, guarded by its mod revision and the settings' mod
    /// revision the waiter last read), then reads its position again. The key's owner, if it
    /// is still waiting, is granted when it next reads.
    Plain,
    /// The same, and a waiter that finds its own key recorded by another before it learned of
    /// its grant gives the key up (removes it and enqueues again) instead of holding with a
    /// token older than grants already made behind it.
    Forfeit,
}

/// How a release hands the lock on (docs/design.md, "Direct handoff").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// A release only deletes the holder's key; the next waiter reads its position.
    Off,
    /// What the engine does: an exclusive holder, which knows the keys behind it (its chain:
    /// from the read that granted it, or handed on with its grant), releases in one
    /// transaction that deletes its key and writes the grant into the first of them if that
    /// one is exclusive and untouched, passing on the rest of the chain; guarded by its own
    /// key, the settings it knows and the successor's mod revision. The successor learns its
    /// grant from the write, without a read. In a semaphore the holder hands on its own slot:
    /// the keys ahead of its successor are then some of those that were ahead of it when it
    /// was granted, all recorded, fewer than `maxHolders`.
    Exclusive,
    /// The same, and a writer's release grants the whole run of readers behind it at once: a
    /// design the model rejects (readers learn their grants in any order, so tokens fall).
    ReaderRun,
}

/// How many keys behind it a holder knows (its chain), in the model; the engine reads more.
pub const CHAIN: usize = 2;

/// What becomes of the lock etcd in a run, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebuild {
    /// Wiped and started again empty at the same address (a bundled etcd reinstalled with
    /// fresh volumes): its revisions start again from 1.
    Wipe,
    /// Restored from a snapshot taken earlier in the run. `bump_revision`: with etcdutl's
    /// `--bump-revision` (and `--mark-compacted`), large enough that its revisions continue
    /// above every one handed out before; without it, they continue from the snapshot's.
    Restore { bump_revision: bool },
    /// Wiped, the operator moving the lock to a new epoch, then restored (with
    /// `--bump-revision`) from a snapshot taken before the wipe: the older epoch's settings
    /// come back (issue #54, F11, found by the seeded world).
    WipeThenRestore,
}

/// How the operator chooses the token epoch when it publishes a lock's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochRule {
    /// Never bumps: every token has epoch 0 (podlock before epochs).
    Off,
    /// Bumps to `epoch(status.fencingToken) + 1` when the settings are gone while that token
    /// is set, or when etcd's revision lies below that token's (a restore).
    StatusToken,
    /// The same, from the highest of `status.fencingEpoch` (written before an epoch is
    /// published) and the token's epoch; and whenever the settings are gone from a lock it
    /// published: what the operator does.
    WriteAhead,
}

/// A known bug to inject, to show that the checker finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// Keys ahead count as granted whether or not they recorded their grant.
    GrantPastUngranted,
    /// Keys ahead count as exclusive whatever their mode (modes ignored after a raise).
    IgnoreModes,
    /// A waiter's read does not re-check the settings: it decides by the `maxHolders` it knew.
    StaleLimit,
    /// A hold learns its loss only from its session, not from its key's deletion.
    NoKeyWatch,
    /// A waiter behind a waiting key in a semaphore watches it for deletion only (the lost
    /// wake-up the `acquiredAt` write prevents).
    PredecessorDeletionOnly,
    /// The enqueue's settings guard compares the settings' mod revision only, not their value:
    /// a revision read from an etcd since wiped can match the new etcd's.
    GuardByRevision,
    /// The operator's epoch bump leaves the queue in place (keys enqueued under the old epoch
    /// are granted under it).
    BumpKeepsQueue,
    /// A release hands the lock on without its guards on the settings and on being an
    /// exclusive holder: a holder granted under a `maxHolders` since lowered hands its slot on.
    HandoffUnguarded,
    /// A grant written by a release counts as recorded for the rule before its owner has
    /// learned it: a key behind may be let in first, with a higher token.
    HandedCountsAsGranted,
    /// A multi-lock waiter records its grant (`acquiredAt`) in each lock as soon as it is
    /// admitted there, before it is admitted on every lock.
    MultiRecordsEarly,
    /// A multi-lock set's grant record is guarded by its keys only, not by the settings each
    /// of its turns was decided under (`set::record` guards both).
    SetRecordUnguarded,
    /// The views of who holds count holders by position (the leading run of one mode within
    /// `maxHolders`), as status, `GET` and a force release did before the one rule: a hold
    /// granted before a lowering is missing, and a key behind an unrecorded grant is named.
    ViewsByPosition,
    /// A lock's removal forgets its token epoch (the engine before the edges review): a
    /// DistributedLock deleted and created again, its status empty, is published under
    /// epoch 0.
    DeleteForgetsEpoch,
    /// The publisher rule outranks fencing (the engine before the edges review's finding 6):
    /// an operator that knows tokens above what the other cluster's settings hand out leaves
    /// those settings alone.
    PublisherOverFencing,
    /// An operator judges every entry, whatever its cluster: a pod of another cluster, which
    /// its API server does not know, looks deleted to it.
    ForeignPods,
    /// A late copy of an enqueue lands unnoticed (no guard watches for it): only the orphan
    /// sweep, which this run lacks, would remove it.
    LateCopyUnguarded,
    /// The operator does not notice keys a restore brought back (the engine before issue #40's
    /// finding 2): after a restore with `--bump-revision`, a released hold is named as holding
    /// until its sidecar's orphan sweep removes it.
    ReturnedUndetected,
    /// A sidecar takes settings under a lower token epoch than it has seen the lock under
    /// (the engine before issue #54's F11 fix): after a restore from a snapshot older than the
    /// lock's latest epoch, it grants under the older one, below its own earlier tokens.
    NoEpochFloor,
    /// A release's copy that finds its key gone answers `lost` without reading the receipt
    /// (the engine before receipts, issue #40's finding 3): a release its own first copy made
    /// is answered 410.
    ReceiptIgnored,
    /// A release's copy that finds its key gone answers `released`, as if its own first copy
    /// had deleted it: a hold ended otherwise (its lease, an administrator) is called released.
    GoneIsReleased,
    /// One receipt per lock and lease (the engine before issue #54's F5): another holder id of
    /// the same pod releasing the lock while a release waits for its answer overwrites its
    /// receipt, and a release that succeeded is answered `lost`.
    ReceiptPerLease,
    /// The operator's deadline release deletes the key by its name, not guarded by the create
    /// revision it read: a later hold under the same key name is ended.
    DeadlineByName,
    /// The operator writes a yield request into a holder's entry before its grant is recorded:
    /// the record, a put of the owner's own entry, erases it.
    YieldBeforeRecord,
    /// A grant record is guarded by its key's create revision only (the engine before issue
    /// #54's F2): a late copy of it, landing after the operator wrote a yield request into the
    /// recorded entry, erases the request.
    RecordByCreateOnly,
    /// The queue's rule counts the keys ahead and its own as one slot each, whatever their
    /// permits (a weighted semaphore admitting as a plain one).
    CountNotWeight,
    /// A release hands its slot on whatever the successor asks: a hold of 1 hands its grant to
    /// a request of 2.
    HandoffIgnoresPermits,
    /// The queue's rule lets a key in past waiting keys ahead of it, when its permits fit
    /// beside the holders' (a large request passed by smaller ones).
    SmallerPasses,
    /// A waiter's position read ignores a grant a release handed to its key (the engine before
    /// issue #54's F10): read after the handoff and a lowering of `maxHolders`, the key waits
    /// while every view names it a holder.
    ReadIgnoresHanded,
}

/// One configuration to check.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Its name in the report.
    pub name: &'static str,
    /// Per lock: `maxHolders` at the start.
    pub max_holders: Vec<u8>,
    /// Per lock: the values `maxHolders` is set to, in turn, whenever the operator likes.
    pub changes: Vec<Vec<u8>>,
    /// How many pods there are.
    pub pods: u8,
    /// The clients.
    pub clients: Vec<ClientSpec>,
    /// How many faults may happen in a run: a lease ended (expired or revoked), a pod
    /// crashed, a key deleted by the operator, the lock deleted, a missed heartbeat.
    pub faults: u8,
    /// How many force releases (`podlock.io/release`) an administrator may ask for in a run,
    /// besides the faults.
    pub releases: u8,
    /// How many holds the operator may end at their deadline in a run (their sidecar had
    /// not), besides the faults.
    pub deadlines: u8,
    /// How many yield requests (`podlock.io/yield`) an administrator may make in a run.
    pub yields: u8,
    /// Whether the operator may delete a lock (and declare it again).
    pub lock_deletion: bool,
    /// The recording-on-behalf variant.
    pub on_behalf: OnBehalf,
    /// An injected bug, if any.
    pub bug: Option<Bug>,
    /// What becomes of etcd, if anything.
    pub rebuild: Option<Rebuild>,
    /// Whether the lock's DistributedLock may be deleted and created again, once (in a run
    /// that rebuilds etcd).
    pub recreate: bool,
    /// How the operator chooses the token epoch.
    pub epoch_rule: EpochRule,
    /// Whether each plain client's first enqueue may be applied once more, late (a copy the
    /// hedge sent that reached its member after the answer, see `src/lock/life/late.rs`).
    pub late_copies: bool,
    /// Whether a release's answer may be lost after its first copy applied, the copy the hedge
    /// sent again then answering it (see [`crate::resend`]).
    pub resent_releases: bool,
    /// Whether a holder's grant record (its own, or a set's) may be applied once more, late:
    /// a copy the hedge sent, or a retry after a lost answer, reaching etcd after the first
    /// copy landed (see [`crate::yielding`]).
    pub late_records: bool,
    /// How a release hands the lock on.
    pub handoff: Handoff,
    /// Whether the operator's status lags: it mirrors the queue as a step of its own (else
    /// every grant is in the status at once).
    pub status_lag: bool,
    /// Whether a second cluster's operator publishes the lock too (its own status, the
    /// publisher rule, two wipes: [`crate::publishers`]).
    pub two_publishers: bool,
    /// Per pod, the cluster whose API server knows it; each cluster's operator ends the holds
    /// of the pods it judges gone ([`crate::clusters`]). Empty: one cluster, whose operator's
    /// revocations are the faults' ended leases.
    pub clusters: Vec<u8>,
}

impl ClientSpec {
    /// A plain `/acquire` client of `lock` in `pod`, acquiring once.
    pub fn new(pod: u8, lock: u8) -> Self {
        ClientSpec {
            pod,
            lock,
            also: None,
            shared: false,
            connection: false,
            heartbeat: false,
            acquires: 1,
            deadline: false,
            permits: 1,
        }
    }

    /// The same, asking for `n` permits.
    pub fn permits(self, n: u8) -> Self {
        ClientSpec { permits: n, ..self }
    }

    /// The same, in shared mode.
    pub fn shared(self) -> Self {
        ClientSpec { shared: true, ..self }
    }

    /// The same, holding through a connection (`POST /hold`).
    pub fn connection(self) -> Self {
        ClientSpec {
            connection: true,
            ..self
        }
    }

    /// The same, with a heartbeat window.
    pub fn heartbeat(self) -> Self {
        ClientSpec {
            heartbeat: true,
            ..self
        }
    }

    /// The same, its first acquire asking for a maximum hold time.
    pub fn deadline(self) -> Self {
        ClientSpec {
            deadline: true,
            ..self
        }
    }

    /// The same, acquiring `n` times.
    pub fn acquires(self, n: u8) -> Self {
        ClientSpec { acquires: n, ..self }
    }

    /// The same, taking lock `also` too, as one multi-lock acquire.
    pub fn and(self, also: u8) -> Self {
        ClientSpec {
            also: Some(also),
            ..self
        }
    }

    /// The locks it takes: its lock, then the other of a multi-lock acquire.
    pub fn locks(&self) -> impl Iterator<Item = u8> + use<> {
        std::iter::once(self.lock).chain(self.also)
    }
}
