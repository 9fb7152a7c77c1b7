//! Known bugs of the engine, re-introduced for the seeded world only (issue #54, item 7): each
//! is a fix undone at the one place it lives, behind `if bugs::on(Bug::X)`. The world turns one
//! on for a seed and runs seeds until one breaks a rule: the proof that the world finds it
//! (docs/design.md, "The seeded world", and `tests/sim/src/world/bugs.rs`). Each mirrors a bug
//! run of the protocol model (`tests/model`, its runs named `bug: ...`) or a finding of #54.
//!
//! Only the cargo feature `bugs` (which only podlock-sim enables) lets a bug be turned on;
//! without it [`on`] is a `const fn` answering `false`, and every `if bugs::on(..)` is dead
//! code the compiler drops.

/// A bug the seeded world can turn on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// The model's "bug: permits counted as one": the queue's rule counts every key, its own
    /// included, as one slot whatever its permits (`txn/queue.rs`, `of_keys`).
    CountNotWeight,
    /// The model's "bug: permits ignored by a handoff": a release hands its slot to the key
    /// behind whatever it asks (`protocol/handoff.rs`, `may_hand`).
    HandoffIgnoresPermits,
    /// The model's "bug: permits let a smaller request pass": the rule sees only the granted
    /// keys ahead, so a request passes waiting ones (`txn/queue.rs`, `of_keys`).
    SmallerPasses,
    /// The model's "bug: grant past ungranted keys": every key ahead counts as granted,
    /// recorded or not (`txn/queue.rs`, `Ahead::of`).
    GrantPastUngranted,
    /// The model's "bug: a handed grant counts as recorded": a grant a release wrote counts
    /// for the keys behind before its owner records it (`txn/queue.rs`, `Ahead::of`).
    HandedCountsAsGranted,
    /// The model's "bug: modes ignored": every key counts as exclusive to the rule
    /// (`txn/queue.rs`, `of_keys`).
    IgnoreModes,
    /// The model's "bug: stale limit": a waiter's read decides by the settings it knew, not by
    /// those it read (`acquire/wait.rs`, `standing`).
    StaleLimit,
    /// #54's F10, the model's "bug: semaphore, a read ignores a handed grant": a waiter's
    /// read does not see the grant a release wrote into its entry (`acquire/wait.rs`).
    ReadIgnoresHanded,
    /// The model's "bug: lost wake-up": a waiter behind a waiting key of a semaphore watches
    /// it for deletion only, not for its grant record (`protocol::wakes`).
    PredecessorDeletionOnly,
    /// The model's "bug: handoff unguarded": a release hands on without checking the settings
    /// its grant was decided under (`txn/handoff.rs`, `hand_on`).
    HandoffUnguarded,
    /// The model's "bug: no key watch": a hold learns its loss from its session only, not
    /// from its key's deletion (`life/monitor.rs`, `key_deleted`).
    NoKeyWatch,
    /// The model's "bug: guard by revision": the enqueue's settings guard compares the
    /// config key's mod revision only, not its value (`txn/settings.rs`, `unchanged`).
    GuardByRevision,
    /// The model's "bug: bump keeps the queue": a new token epoch leaves the queue in place
    /// (`txn/settings.rs`, `publish`).
    BumpKeepsQueue,
    /// The model's "bug: views by position": who holds is the leading run of keys within
    /// `maxHolders`, recorded or not (`protocol::holders`: status, `GET`, the fence check).
    ViewsByPosition,
    /// The model's "bug: release receipt ignored": a release that finds its key gone answers
    /// `lost` without reading its receipt (`txn/receipt.rs`, `released`).
    ReceiptIgnored,
    /// The model's "bug: a gone key counts as released": a release that finds its key gone
    /// answers `released` whatever ended the hold (`txn/receipt.rs`, `released`).
    GoneIsReleased,
    /// #54's F5, the model's "bug: one receipt per lock and lease": every release of a lock
    /// and lease puts its receipt at slot 0 (`engine/receipts.rs`).
    ReceiptPerLease,
    /// The model's "bug: late copy unguarded": no watch removes a late copy of an enqueue
    /// (`life/late.rs`); only the orphan sweep does, 5 to 10 s later.
    LateCopyUnguarded,
    /// The model's "bug: returned keys undetected": the epoch rule ignores keys a restore
    /// brought back (`protocol/epoch.rs`, `choose`).
    ReturnedUndetected,
    /// #54's F12: the fence check calls a hold current past its maximum hold time's deadline
    /// (`fence.rs`).
    FenceIgnoresDeadline,
}

#[cfg(feature = "bugs")]
thread_local! {
    /// The bug on for the seed this thread runs: the world runs one seed per thread, and every
    /// engine task of the seed on that thread.
    static ON: std::cell::Cell<Option<Bug>> = const { std::cell::Cell::new(None) };
}

/// Turns `bug` on (or every bug off) for this thread.
#[cfg(feature = "bugs")]
pub fn set(bug: Option<Bug>) {
    ON.with(|on| on.set(bug));
}

/// Whether `bug` is on for this thread.
#[cfg(feature = "bugs")]
pub fn on(bug: Bug) -> bool {
    ON.with(|on| on.get() == Some(bug))
}

/// Whether `bug` is on: never, without the feature `bugs`.
#[cfg(not(feature = "bugs"))]
pub const fn on(_bug: Bug) -> bool {
    false
}
