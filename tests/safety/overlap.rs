//! Exclusion, per lock: no hold is granted while the holds that still last leave too few of the
//! lock's `maxHolders` in force for its permits, unless enough of them were lost and their
//! clients told within [`LOST_NOTICE`]; and fencing tokens rise in the order the lock made its
//! grants. Holds are weighed by their permits (one each but a weighted worker's).
//!
//! A lowered `maxHolders` applies to new grants only: holders already in may stay, so the
//! permits are counted at each grant, against the limit that grant was decided under.

use std::collections::{BTreeMap, HashSet};
use std::iter::once;

use super::check::{Analysis, LOST_NOTICE};
use super::faults::{Fault, Kind};
use super::worker::HoldRecord;

/// How long after the read that decided it a grant may be stamped (its `acquiredAt`): the read's
/// answer reaches the sidecar, which may then record the grant in etcd first. A grant stamped
/// this long after a change of `maxHolders` was written was surely decided under the new value.
pub const DECISION_SLACK: f64 = 0.5;

/// A lock's `maxHolders` over a run.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Its value from the start.
    initial: u32,
    /// Each change: (from, until, new value), written by a command that ran from `from` to
    /// `until` (the write itself is somewhere in between).
    changes: Vec<(f64, f64, u32)>,
}

impl Limits {
    /// A limit that never changes.
    pub fn fixed(limit: u32) -> Self {
        Limits {
            initial: limit,
            changes: vec![],
        }
    }

    /// `initial`, changed by every fault that sets `maxHolders`.
    pub fn changed_by(initial: u32, faults: &[Fault]) -> Self {
        let mut changes: Vec<_> = (faults.iter())
            .filter_map(|f| Some((f.at, f.until, f.kind.max_holders()?)))
            .collect();
        changes.sort_by(|x, y| x.0.total_cmp(&y.0));
        Limits { initial, changes }
    }

    /// The largest limit that may have decided a grant stamped at `t`: each value counts from
    /// when its change may have been written until the next change surely was, plus
    /// [`DECISION_SLACK`].
    pub fn allowed(&self, t: f64) -> u32 {
        let from = once(f64::NEG_INFINITY).chain(self.changes.iter().map(|c| c.0));
        let until = (self.changes.iter().map(|c| c.1 + DECISION_SLACK)).chain(once(f64::INFINITY));
        let value = once(self.initial).chain(self.changes.iter().map(|c| c.2));
        (from.zip(until).zip(value))
            .filter(|((from, until), _)| *from <= t && t < *until)
            .map(|(_, v)| v)
            .max()
            .unwrap_or(self.initial)
    }
}

/// What the overlap check saw of one lock.
#[derive(Debug, Clone, Default)]
pub struct LockStats {
    /// Holds granted.
    pub grants: usize,
    /// Of them, holds of more than one permit (a weighted worker's).
    pub weighted: usize,
    /// Holds whose clients learned that they were lost.
    pub lost: usize,
    /// For each limit in force at some grant: the most permits that lasted at such a grant, its
    /// own included, those of holds lost and told in time left out.
    pub peaks: BTreeMap<u32, usize>,
}

/// When a client whose sidecar was stopped could first be told anything: a stopped sidecar
/// tells no one, so its notices count from when it ran again, if that is after `from`.
fn resumed(h: &HoldRecord, faults: &[Fault], from: f64) -> f64 {
    (faults.iter())
        .filter(|f| matches!(f.kind, Kind::Pause | Kind::ReleasePause) && f.target == h.sidecar)
        .filter(|f| f.at < h.ended && f.until > h.granted)
        .map(|f| f.until)
        .fold(from, f64::max)
}

/// Checks `holds`, all of one lock's, against its `limits`; adds what it saw to `a.locks`.
pub fn check_lock(holds: &[&HoldRecord], limits: &Limits, faults: &[Fault], a: &mut Analysis) {
    let mut by_grant = holds.to_vec();
    by_grant.sort_by(|x, y| x.granted.total_cmp(&y.granted));
    let mut stats = LockStats {
        grants: holds.len(),
        weighted: holds.iter().filter(|h| h.permits > 1).count(),
        lost: holds.iter().filter(|h| h.lost.is_some()).count(),
        ..LockStats::default()
    };
    let mut lagged = HashSet::new();
    for (i, g) in by_grant.iter().enumerate() {
        let lasting: Vec<&HoldRecord> = (by_grant[..i].iter().copied())
            .filter(|h| h.ended > g.granted)
            .collect();
        let allowed = limits.allowed(g.acquired);
        let taken = permits(lasting.iter().copied()) + g.permits as usize;
        let over = taken.saturating_sub(allowed as usize);
        // Each lost hold's lag counts from the first grant it could have made room for.
        let lag = |h: &HoldRecord| h.ended - resumed(h, faults, g.granted);
        // The new grant may itself be the lost one: decided while its key was admitted (etcd's
        // log proves that) and answered after the key was ended, its client told soon after.
        let told = lasting
            .iter()
            .copied()
            .filter(|h| h.lost.is_some() && lag(h) <= LOST_NOTICE);
        let arrived_lost = (lost_on_arrival(g, faults)).then_some(*g);
        let timely = permits(told.chain(arrived_lost));
        if over > 0 {
            for h in lasting.iter().filter(|h| h.lost.is_some()) {
                if lagged.insert(h.token) {
                    a.notice_lags.push(lag(h).max(0.0));
                }
            }
        }
        if timely < over {
            a.violations.push(overfull(g, &lasting, allowed, &lag));
        }
        let peak = stats.peaks.entry(allowed).or_default();
        *peak = (*peak).max(taken - timely.min(over));
    }
    check_token_order(holds, faults, a);
    if let Some(h) = holds.first() {
        a.locks.push((h.lock, stats));
    }
}

/// How many slots `holds` take together.
fn permits<'a>(holds: impl Iterator<Item = &'a HoldRecord>) -> usize {
    holds.map(|h| h.permits as usize).sum()
}

/// The words for a grant made while `lasting` holds filled the lock's `allowed` slots.
fn overfull(
    g: &HoldRecord,
    lasting: &[&HoldRecord],
    allowed: u32,
    lag: &dyn Fn(&HoldRecord) -> f64,
) -> String {
    let others: Vec<String> = (lasting.iter())
        .map(|h| match h.lost {
            None => format!("{} (worker {}, never lost)", h.token, h.worker),
            Some(_) => format!(
                "{} (worker {}, told lost {:.3} s later)",
                h.token,
                h.worker,
                lag(h)
            ),
        })
        .collect();
    format!(
        "{} token {} (worker {}, {} permits) granted at {:.3} while {} held {} permits, beyond \
         maxHolders {allowed}: {}",
        g.lock,
        g.token,
        g.worker,
        g.permits,
        g.granted,
        lasting.len(),
        permits(lasting.iter().copied()),
        others.join(", ")
    )
}

/// Whether `g`'s client was told its hold was lost within [`LOST_NOTICE`] of the grant's
/// arrival: a grant its sidecar decided while its key was admitted, but answered (and stamped)
/// only after the key had been ended, as when an operator ends a pod's keys one by one while
/// its sidecar is slow. Such a hold lasts in etcd before any later grant; only its answer is
/// late, and its client hears of the loss as of any other.
fn lost_on_arrival(g: &HoldRecord, faults: &[Fault]) -> bool {
    g.lost.is_some() && g.ended - resumed(g, faults, g.granted) <= LOST_NOTICE
}

/// Tokens must rise in grant order: a grant with a lower token than an earlier grant's means
/// the lock handed out grants out of queue order (as it did when `maxHolders` changed under
/// queued waiters), and a fenced resource would then refuse a rightful holder. Grants are
/// ordered by when their sidecars made them; two made in the same millisecond are not ordered.
/// A grant lost on arrival ([`lost_on_arrival`]) has no rightful write to lose.
fn check_token_order(holds: &[&HoldRecord], faults: &[Fault], a: &mut Analysis) {
    let mut by_grant = holds.to_vec();
    by_grant.sort_by(|x, y| (x.acquired.total_cmp(&y.acquired)).then(x.token.cmp(&y.token)));
    let mut highest: Option<&HoldRecord> = None;
    for h in by_grant {
        match highest {
            Some(_) if lost_on_arrival(h, faults) => {}
            Some(top) if h.token <= top.token => a.violations.push(format!(
                "{} token {} granted at {:.3} after token {} was granted at {:.3}",
                h.lock, h.token, h.acquired, top.token, top.acquired
            )),
            _ => highest = Some(h),
        }
    }
}
