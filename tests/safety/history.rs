//! The history: every operation the workers perform on a lock, with its invocation and answer
//! on one clock ([`now`]), for the linearizability checker ([`super::linearizability`]).
//!
//! An operation that got no answer (a connection error, a timeout, a 5xx that may have come
//! after etcd committed) is recorded as ambiguous: it may have taken effect, or not, and the
//! checker tries both. It is never dropped. A hold that ends otherwise than by release (lease
//! expiry, revocation, a deleted lock) is an operation of its own, `end`, whose window runs
//! from the grant (or its last answered heartbeat) to the moment its client was told `lost`;
//! where the contract promises that notice within 1 s, from 1 s before it (plus the time its
//! sidecar was stopped by the fault loop, when it could tell no one).

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Mutex;

use super::faults::{Fault, Kind};
use super::now;
use super::overlap::DECISION_SLACK;

/// What an operation asked for, as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    /// A grant asked for: acquire, `/hold` or `podlock lock`.
    Acquire,
    /// A hold ended by its client.
    Release,
    /// A heartbeat: the hold still lasts.
    Heartbeat,
    /// A hold ended otherwise than by release, as its client was told.
    End,
    /// A change of `maxHolders` begins (either value may bind grants).
    Limit,
    /// The new `maxHolders` binds every grant.
    Settle,
}

/// How an operation was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Done: granted, released, heartbeat accepted.
    Ok,
    /// A definite refusal: the client holds nothing (409, 410, 404, ...).
    Fail,
    /// No answer: done or not.
    Unknown,
}

impl Outcome {
    /// The outcome an HTTP answer means: a 5xx may come after etcd committed, so it is not
    /// definite; nor is a request that got no answer (`None`).
    pub fn of_status(status: Option<u16>) -> Self {
        match status {
            Some(200..=299) => Outcome::Ok,
            Some(400..=499) => Outcome::Fail,
            _ => Outcome::Unknown,
        }
    }
}

/// One operation of the history. Times are seconds of [`now`]; `ret` is `None` without answer.
#[derive(Debug, Clone, Serialize)]
pub struct Op {
    /// The lock.
    pub lock: &'static str,
    /// The holder identity: the sidecar's pod and the holder id.
    pub client: String,
    /// The worker that performed it (its row in the visualization).
    pub row: usize,
    /// What it asked.
    pub kind: OpKind,
    /// Which API it used.
    pub api: &'static str,
    /// The mode asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
    /// The mode a grant states.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub granted: Option<&'static str>,
    /// How many of the lock's slots an acquire asks for (absent: 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permits: Option<u32>,
    /// The answer.
    pub outcome: Outcome,
    /// The grant's fencing token, or the ended hold's (0: not known).
    pub token: i64,
    /// The `maxHolders` a limit or settle op sets.
    pub limit: u32,
    /// The invocation.
    pub call: f64,
    /// The answer, if one came.
    pub ret: Option<f64>,
}

/// A client told that its hold ended otherwise than by release.
#[derive(Debug, Clone)]
pub struct Notice {
    /// The lock, client and worker, as in [`Op`].
    pub lock: &'static str,
    /// The holder identity.
    pub client: String,
    /// The worker told.
    pub row: usize,
    /// The hold's token (0: not known, a grant whose answer was lost).
    pub token: i64,
    /// The hold surely lasted until then: its grant's invocation, or its last answered heartbeat.
    pub confirmed: f64,
    /// When the client was told (`lost` event, 410, its events stream or hold stream ending).
    pub told: f64,
    /// The sidecar it was told by, if the contract promises notice within 1 s there.
    pub promised_by: Option<usize>,
}

/// The history of one run, shared by every worker and the fault loop.
#[derive(Debug, Default)]
pub struct History {
    ops: Mutex<Vec<Op>>,
    notices: Mutex<Vec<Notice>>,
}

impl History {
    /// A history of locks whose `maxHolders` are `limits` at its start.
    pub fn new(limits: &[(&'static str, u32)]) -> Self {
        let at = now();
        let h = History::default();
        for (lock, limit) in limits {
            h.settings(lock, OpKind::Settle, *limit, at, at);
        }
        h
    }

    /// Records an answered or ambiguous operation.
    pub fn push(&self, op: Op) {
        self.ops.lock().unwrap().push(op);
    }

    /// Records that a client was told its hold ended.
    pub fn told(&self, notice: Notice) {
        self.notices.lock().unwrap().push(notice);
    }

    /// Records a settings operation on `lock`.
    fn settings(&self, lock: &'static str, kind: OpKind, limit: u32, call: f64, ret: f64) {
        self.push(Op {
            lock,
            client: String::new(),
            row: usize::MAX,
            kind,
            api: "settings",
            mode: None,
            granted: None,
            permits: None,
            outcome: Outcome::Ok,
            token: 0,
            limit,
            call,
            ret: Some(ret),
        });
    }

    /// Records the fault loop's change of `lock`'s `maxHolders`: it began with the patch (`at`)
    /// and was seen in etcd at `until`; grants decided under the old value may still be stamped
    /// [`DECISION_SLACK`] later.
    pub fn limit_changed(&self, lock: &'static str, f: &Fault) {
        let limit = f.kind.max_holders().expect("a change of maxHolders");
        self.settings(lock, OpKind::Limit, limit, f.at, f.until);
        self.settings(lock, OpKind::Settle, limit, f.until, f.until + DECISION_SLACK);
    }

    /// Every operation, the hold ends included, in call order; `rows` workers ran.
    pub fn ops(&self, faults: &[Fault], rows: usize) -> Vec<Op> {
        let mut ops = self.ops.lock().unwrap().clone();
        for op in &mut ops {
            op.row = op.row.min(2 * rows);
        }
        ops.extend(ends(&self.notices.lock().unwrap(), faults, rows));
        ops.sort_by(|a, b| a.call.total_cmp(&b.call));
        ops
    }
}

/// How long the sidecar `sidecar` was stopped by the fault loop within `from..to`.
fn stopped(sidecar: usize, from: f64, to: f64, faults: &[Fault]) -> f64 {
    (faults.iter())
        .filter(|f| matches!(f.kind, Kind::Pause | Kind::ReleasePause) && f.target == sidecar)
        .map(|f| (f.until.min(to) - f.at.max(from)).max(0.0))
        .sum()
}

/// One `end` op per hold that clients were told ended: several workers sharing a holder id may
/// each be told. It ended after every confirmation and before the first notice; where that
/// notice was promised within 1 s, at most 1 s before it, less the time its sidecar was stopped.
fn ends(notices: &[Notice], faults: &[Fault], rows: usize) -> Vec<Op> {
    let mut holds: BTreeMap<(&str, &str, i64), Vec<&Notice>> = BTreeMap::new();
    for n in notices {
        holds.entry((n.lock, &n.client, n.token)).or_default().push(n);
    }
    holds
        .into_values()
        .map(|told| {
            let first = told.iter().min_by(|a, b| a.told.total_cmp(&b.told)).unwrap();
            let confirmed = told.iter().map(|n| n.confirmed).fold(f64::MIN, f64::max);
            let promised = first.promised_by.map_or(f64::MIN, |s| {
                first.told - 1.0 - stopped(s, confirmed, first.told, faults)
            });
            Op {
                lock: first.lock,
                client: first.client.clone(),
                row: rows + first.row,
                kind: OpKind::End,
                api: "lost",
                mode: None,
                granted: None,
                permits: None,
                outcome: Outcome::Ok,
                token: first.token,
                limit: 0,
                call: confirmed.max(promised).min(first.told),
                ret: Some(first.told),
            }
        })
        .collect()
}
