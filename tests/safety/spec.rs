//! What each worker of the safety run is: its lock, sidecar and API, and what it asks for
//! (mode, holder id, further locks, a maximum hold time, permits).

use super::{COUNTER, POOL, POOL_SLOTS, RW};

/// The workers. Three contend for the mutex, each on its own sidecar (the fault loop's victims),
/// and three for the semaphore's two slots, so that a waiter always queues behind a full
/// window, one of them through `/hold`. On the reader-writer lock: two readers on one sidecar
/// naming the same holder id (one holder, as the contract says), a reader and a writer through
/// `/hold` on another without one (two holders), and a writer through `podlock lock`. Then two
/// sets: the semaphore with the mutex (on a mutex worker's sidecar, so that the mutex's faults
/// hit it too) and the reader-writer lock with the semaphore. The semaphore's `/hold` worker and
/// the semaphore-and-mutex set ask for a maximum hold time of 1 s, and outstay it on one hold in
/// 8 (the set's worker pausing before its write to the counter, without a heartbeat window):
/// their deadline ends those holds (`lost`, reason `deadline`, on both locks of the set) while
/// the set's worker still means to write, which the fenced counter must refuse once a later
/// holder wrote. (Not the mutex's own workers: the fault loop's stalls of them must end by their
/// heartbeat window, a force release or their pod's deletion.) One of the semaphore's
/// `/acquire` workers asks for both its slots in each hold (weighted permits): it must wait for
/// every other holder to leave, and not be passed by the 1-permit requests behind it; while
/// `maxHolders` is lowered to 1 its requests are refused (400), waiting ones at once.
pub const WORKERS: [Spec; 13] = [
    Spec::acquire(COUNTER, 0),
    Spec::acquire(COUNTER, 1),
    Spec::acquire(COUNTER, 2),
    Spec::acquire(POOL, 3),
    Spec::acquire(POOL, 4).permits(POOL_SLOTS),
    Spec::with(POOL, 5, Api::Hold, "exclusive", None).deadline(1),
    Spec::with(RW, 3, Api::Acquire, "shared", Some("reader")),
    Spec::with(RW, 3, Api::Acquire, "shared", Some("reader")),
    Spec::with(RW, 4, Api::Hold, "shared", None),
    Spec::with(RW, 4, Api::Hold, "exclusive", None),
    Spec::with(RW, 5, Api::LockCmd, "exclusive", None),
    Spec::set(POOL, &[COUNTER], 1, "pool-counter").deadline(1),
    Spec::set(RW, &[POOL], 5, "rw-pool"),
];

/// How a worker takes its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST .../acquire`, then release (and for a semaphore's worker, a heartbeat between).
    Acquire,
    /// `POST .../hold`, ended by closing the connection.
    Hold,
    /// `podlock lock NAME -- CMD`, the real binary.
    LockCmd,
}

/// One worker: the lock it takes, on which sidecar, how, in which mode, and the holder id it
/// names (`None`: the API's default).
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The lock.
    pub lock: &'static str,
    /// The sidecar (and so the pod) it talks to.
    pub sidecar: usize,
    /// The API it uses.
    pub api: Api,
    /// `exclusive` or `shared`.
    pub mode: &'static str,
    /// The holder id it names.
    pub holder: Option<&'static str>,
    /// The further locks it takes as one with `lock` (through `POST .../acquire` only).
    pub with: &'static [&'static str],
    /// The maximum hold time it asks for, in seconds (through `/acquire` or `/hold`).
    pub max_hold: Option<u32>,
    /// How many of the lock's slots each hold asks for (`None`: one, not asked).
    pub permits: Option<u32>,
}

impl Spec {
    /// A worker that acquires `lock` exclusively on `sidecar` under its pod's name.
    pub const fn acquire(lock: &'static str, sidecar: usize) -> Self {
        Spec::with(lock, sidecar, Api::Acquire, "exclusive", None)
    }

    /// A worker of `lock` on `sidecar` through `api` in `mode`, naming `holder`.
    pub const fn with(
        lock: &'static str,
        sidecar: usize,
        api: Api,
        mode: &'static str,
        holder: Option<&'static str>,
    ) -> Self {
        Spec {
            lock,
            sidecar,
            api,
            mode,
            holder,
            with: &[],
            max_hold: None,
            permits: None,
        }
    }

    /// The same worker, asking for `n` of its semaphore's slots in each hold (a weighted
    /// hold): the queue must not let a smaller request pass it, nor admit it beside holds whose
    /// permits leave too few.
    pub const fn permits(self, n: u32) -> Self {
        Spec {
            permits: Some(n),
            ..self
        }
    }

    /// The same worker, asking for a maximum hold time of `seconds`, far above its holds' work:
    /// one hold in 8 outstays it (see `outstays`, `apis::hold_time`).
    pub const fn deadline(self, seconds: u32) -> Self {
        Spec {
            max_hold: Some(seconds),
            ..self
        }
    }

    /// A worker that acquires `lock` and every lock of `with` as one, exclusively, on `sidecar`
    /// as `holder` (not its pod's name, which a single-lock worker of the sidecar may use).
    pub const fn set(
        lock: &'static str,
        with: &'static [&'static str],
        sidecar: usize,
        holder: &'static str,
    ) -> Self {
        Spec {
            with,
            ..Spec::with(lock, sidecar, Api::Acquire, "exclusive", Some(holder))
        }
    }

    /// Whether it takes `lock` (alone or in its set).
    pub fn takes(&self, lock: &str) -> bool {
        self.lock == lock || self.with.contains(&lock)
    }
}
