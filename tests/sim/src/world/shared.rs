//! What one seed's actors share: the trace, the checkers, the faults counted, the first
//! failure. Every actor runs on the one thread of the seed's runtime; the lock is never
//! contended, only needed because engine tasks must be `Send`.

use super::admission::Admission;
use super::belief::Beliefs;
use super::check::{Checker, Ended};
use super::liveness::Waits;
use super::nobody::Nobodys;
use super::steps::Ops;
use super::{LOCKS, sets};
use crate::etcd::Etcd;
use podlock::lock::Grant;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// What a seed's actors share. Cheap to clone.
#[derive(Clone)]
pub struct World(Arc<Mutex<Shared>>);

/// The record of a seed's run.
pub struct Shared {
    /// A line per step.
    pub trace: Vec<String>,
    /// The checkers.
    pub check: Checker,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// The first rule broken.
    pub failure: Option<String>,
    /// Each lock's highest `maxHolders` so far: holds granted before a lowering keep theirs.
    pub max_holders: Vec<u32>,
    /// Per lock: etcd brought back keys that had ended (a restore), and the operator has not
    /// yet published the lock again (what its watch would tell it).
    pub returned: Vec<bool>,
    /// What the operator's steps share (`steps.rs`).
    pub ops: Ops,
    /// The holds told `lost` at their maximum hold time, by lock and token.
    pub deadline_ends: BTreeSet<(String, i64)>,
    /// The waiters the liveness checker follows.
    pub live: Waits,
    /// The holds the belief checker follows.
    pub belief: Beliefs,
    /// The holding keys nobody holds or waits for.
    pub nobody: Nobodys,
    /// The grants etcd's changes show, against the queue's rule (shown every change by etcd).
    pub admission: Arc<Mutex<Admission>>,
    /// How many times etcd was restored or wiped, or a lock deleted: each takes release
    /// receipts away.
    pub rebuilds: u64,
    pub(super) etcd: Arc<Etcd>,
    start: Instant,
}

impl World {
    /// A world over `etcd`, its locks declared with their first `maxHolders`.
    pub fn new(etcd: Arc<Etcd>) -> Self {
        let admission = Arc::new(Mutex::new(Admission::default()));
        let follows = admission.clone();
        etcd.observe(Box::new(move |state, rebuilt| {
            follows.lock().unwrap().changed(state, rebuilt)
        }));
        World(Arc::new(Mutex::new(Shared {
            trace: Vec::new(),
            check: Checker::default(),
            faults: BTreeMap::new(),
            failure: None,
            max_holders: LOCKS.iter().map(|l| l.max_holders).collect(),
            returned: vec![false; LOCKS.len()],
            ops: Ops::new(LOCKS.len()),
            deadline_ends: BTreeSet::new(),
            live: Waits::default(),
            belief: Beliefs::default(),
            nobody: Nobodys::default(),
            admission,
            rebuilds: 0,
            etcd,
            start: Instant::now(),
        })))
    }

    /// Runs `f` on the shared record.
    pub fn with<R>(&self, f: impl FnOnce(&mut Shared) -> R) -> R {
        f(&mut self.0.lock().unwrap())
    }

    /// Adds a line to the trace, stamped with the simulated time.
    pub fn log(&self, line: String) {
        self.with(|s| s.log(line));
    }

    /// Counts and logs a fault.
    pub fn fault(&self, kind: &'static str, what: String) {
        self.with(|s| {
            *s.faults.entry(kind).or_default() += 1;
            s.log(format!("fault {kind}: {what}"));
        });
    }

    /// An acquire was answered, `granted` or not.
    pub fn answered(&self, holder: &str, took: Duration, wait: Duration, granted: bool) {
        self.with(|s| {
            let r = s.check.answered(took, wait);
            s.judge(r.map_err(|e| format!("{holder}: {e}")));
            let r = s.live.answered(holder, granted);
            s.judge(r);
        });
    }

    /// `holder` was granted `g` on the locks `asked` (indexes in `LOCKS`: one, or a set's).
    pub fn granted(&self, holder: &str, asked: &[usize], g: &Grant) {
        self.with(|s| {
            s.log(format!(
                "{holder} granted {} token {} lease {:x}",
                g.lock.name, g.fencing_token, g.lease_id
            ));
            let r = sets::granted(s, holder, asked, g);
            s.judge(r);
        });
        super::ends::timed(self, holder, g);
    }

    /// `holder` asks to release its hold of `token` of `lock` (with the rest of its set): it
    /// no longer believes it holds.
    pub fn releasing(&self, holder: &str, lock: &str, token: i64) {
        self.with(|s| {
            for (lock, token) in s.check.hold_of(holder, (lock, token)) {
                s.belief.releasing(&lock, token);
            }
        });
    }

    /// `holder` was told its hold of `token` ended: its release was answered, or `lost` came.
    pub fn released(&self, holder: &str, lock: &str, token: i64) {
        self.with(|s| {
            s.log(format!("{holder} over {lock} token {token}"));
            s.check.ended(lock, token);
        });
    }

    /// `holder`'s release of `g` was answered `released` (or `lost`); etcd had been restored or
    /// wiped `rebuilds` times when it was asked.
    pub fn release_answered(&self, (holder, g): (&str, &Grant), released: bool, rebuilds: u64) {
        // A set's release is answered `lost` when any of its locks was lost, whatever its
        // transaction did to the others: its receipts say nothing of the answer.
        if !g.locks.is_empty() {
            return;
        }
        self.with(|s| {
            s.check.checks += 1;
            let r = super::receipts::check(&s.etcd, (holder, g), released, s.rebuilds != rebuilds);
            s.judge(r);
        });
    }

    /// `holder`'s release of its hold of `token` of `lock` was answered: that hold, a whole
    /// set's if it is one, ended.
    pub fn released_hold(&self, holder: &str, lock: &str, token: i64) {
        for (lock, token) in self.with(|s| s.check.hold_of(holder, (lock, token))) {
            self.released(holder, &lock, token);
        }
    }

    /// A token of `lock` to check: `own`, or (now and then) the last one whose hold ended;
    /// and when its hold ended, if it had.
    pub fn token_to_fence(&self, lock: &str, own: i64, older: bool) -> (i64, Option<Ended>) {
        self.with(|s| {
            let token = (s.check.last_over(lock)).filter(|_| older).unwrap_or(own);
            (token, s.check.ended_at(lock, token))
        })
    }

    /// A fence check of `lock`'s `token` through pod `via` answered `current`; `ended`: when
    /// its hold had ended before the check was asked, if it had.
    pub fn fenced(
        &self,
        who: &str,
        (lock, token): (&str, i64),
        via: usize,
        current: bool,
        ended: Option<Ended>,
    ) {
        self.with(|s| {
            s.log(format!(
                "{who} fence {lock} token {token} via pod-{via}: current {current}"
            ));
            let r = s.check.fenced((lock, token), via, current, ended);
            s.judge(r);
        });
    }

    /// Notes a broken rule found outside the checkers (what is left at the end).
    pub fn fail(&self, what: String) {
        self.with(|s| s.judge(Err(what)));
    }
}

impl Shared {
    pub(super) fn log(&mut self, line: String) {
        let t = self.start.elapsed().as_millis();
        self.trace.push(format!("{:>4}.{:03} {line}", t / 1000, t % 1000));
    }

    /// Judges what the admission checker found since it was last asked.
    pub(super) fn judge_admission(&mut self) {
        self.check.checks += 1;
        let found = self.admission.lock().unwrap().failure.take();
        self.judge(found.map_or(Ok(()), Err));
    }

    pub(super) fn judge(&mut self, r: Result<(), String>) {
        if let Err(e) = r {
            self.log(format!("BROKEN {e}"));
            self.failure.get_or_insert(e);
        }
    }
}
