//! What one seed's actors share: the trace, the checkers, the faults counted, the first
//! failure. Every actor runs on the one thread of the seed's runtime; the lock is never
//! contended, only needed because engine tasks must be `Send`.

use super::LOCKS;
use super::check::{Checker, Ended};
use crate::etcd::Etcd;
use podlock::lock::Grant;
use std::collections::BTreeMap;
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
    /// How many times the operator moved a lock to a new epoch.
    pub renewals: u64,
    /// How many times etcd was restored or wiped.
    pub rebuilds: u64,
    /// Restores may use a snapshot taken before a lock's latest epoch (finding F11).
    pub older_epochs: bool,
    etcd: Arc<Etcd>,
    start: Instant,
}

impl World {
    /// A world over `etcd`, its locks declared with their first `maxHolders`; `older_epochs`:
    /// see [`Shared::older_epochs`].
    pub fn new(etcd: Arc<Etcd>, older_epochs: bool) -> Self {
        World(Arc::new(Mutex::new(Shared {
            trace: Vec::new(),
            check: Checker::default(),
            faults: BTreeMap::new(),
            failure: None,
            max_holders: LOCKS.iter().map(|l| l.max_holders).collect(),
            returned: vec![false; LOCKS.len()],
            renewals: 0,
            rebuilds: 0,
            older_epochs,
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

    /// An acquire was answered.
    pub fn answered(&self, holder: &str, took: Duration, wait: Duration) {
        self.with(|s| {
            let r = s.check.answered(took, wait);
            s.judge(r.map_err(|e| format!("{holder}: {e}")));
        });
    }

    /// `holder` was granted `g` on `LOCKS[lock]`.
    pub fn granted(&self, holder: &str, lock: usize, g: &Grant) {
        self.with(|s| {
            s.log(format!(
                "{holder} granted {} token {} lease {:x}",
                g.lock.name, g.fencing_token, g.lease_id
            ));
            let r = s.check.granted(&s.etcd, holder, g, s.max_holders[lock]);
            s.judge(r);
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
        self.with(|s| {
            s.check.checks += 1;
            let r = super::receipts::check(&s.etcd, (holder, g), released, s.rebuilds != rebuilds);
            s.judge(r);
        });
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
    fn log(&mut self, line: String) {
        let t = self.start.elapsed().as_millis();
        self.trace.push(format!("{:>4}.{:03} {line}", t / 1000, t % 1000));
    }

    fn judge(&mut self, r: Result<(), String>) {
        if let Err(e) = r {
            self.log(format!("BROKEN {e}"));
            self.failure.get_or_insert(e);
        }
    }
}
