//! The one-screen summary of a run.

use std::time::Duration;

use super::check::{Analysis, LOST_NOTICE};
use super::faults::Kind;
use super::history::Op;
use super::linearizability::{Verdict, run_dir, tally};
use super::{COUNTER, POOL, SIDECARS, TTL, WORKERS};

/// The one-screen summary of a run that took `elapsed` seconds from `start`.
pub fn report(
    a: &Analysis,
    start: f64,
    elapsed: f64,
    state: &serde_json::Value,
    drained: &Result<Duration, String>,
) -> String {
    let mut out = format!(
        "safety: {elapsed:.0} s, TTL {} s, {} workers on {SIDECARS} sidecars, 3-member etcd\n  faults:",
        TTL.as_secs(),
        WORKERS.len()
    );
    for (i, k) in Kind::CYCLE.iter().enumerate() {
        let n = a.recoveries.iter().filter(|(f, _)| f.kind == *k).count();
        out += &format!("{} {n} x {}", if i == 0 { "" } else { "," }, k.name());
    }
    out += &holds(a);
    out += &format!(
        "\n  writes: {} accepted in token order, counter {} (store accepted {}); {} not made \
         (lost before writing)\n  stale writes: {} rejected by fencing ({} of paused holders), \
         {} accepted before the successor wrote",
        a.accepted,
        state["value"],
        state["accepted"],
        a.unwritten,
        a.rejected,
        a.rejected_paused,
        a.stale_accepted,
    );
    out += &recoveries(a);
    out += &format!(
        "\n  longest stall between accepted writes {:.2} s ({:.1} s in); queue empty after the \
         clients left: {}",
        a.longest_stall.0,
        a.longest_stall.1 - start,
        drained
            .as_ref()
            .map_or_else(|e| format!("no ({e})"), |d| format!("yes, in {d:.1?}"))
    );
    out
}

/// The holds of each lock, the most permits held at once under each limit, and the lost notices.
fn holds(a: &Analysis) -> String {
    let mut out = String::new();
    for (lock, s) in &a.locks {
        let peaks: Vec<String> = (s.peaks.iter())
            .map(|(limit, n)| format!("{n} while maxHolders {limit}"))
            .collect();
        out += &format!(
            "\n  {lock}: {} holds granted ({} of several permits), {} lost; most permits held at a \
             grant: {}",
            s.grants,
            s.weighted,
            s.lost,
            peaks.join(", ")
        );
    }
    let max_lag = a.notice_lags.iter().copied().fold(0.0, f64::max);
    out + &format!(
        "\n  {} holds overlapped by a later grant beyond the limit after being lost, their \
         clients told within {max_lag:.2} s of it (limit {LOST_NOTICE} s)\n  violations: {}",
        a.notice_lags.len(),
        a.violations.len()
    )
}

/// For each fault kind, how long the lock it hit took to make progress again, and the longest
/// its injection took (a deletion waits for the operator's finalizer, a restart for the member
/// to serve): where a run's time went.
fn recoveries(a: &Analysis) -> String {
    let mut out = "\n  fault -> first accepted write of a later grant (maxHolders changes: next grant); the \
         longest injection:"
        .to_string();
    for k in Kind::CYCLE {
        let mut times: Vec<f64> = (a.recoveries.iter())
            .filter(|(f, _)| f.kind == k)
            .map(|(_, t)| t.unwrap_or(f64::INFINITY))
            .collect();
        times.sort_by(f64::total_cmp);
        let (Some(max), Some(median)) = (times.last(), times.get(times.len().saturating_sub(1) / 2)) else {
            continue;
        };
        let injected = (a.recoveries.iter())
            .filter(|(f, _)| f.kind == k)
            .map(|(f, _)| f.until - f.at)
            .fold(0.0, f64::max);
        out += &format!(
            "\n    {:<44} max {max:.2} s, median {median:.2} s over {} (limit {:.1} s); injected in {injected:.1} s",
            k.name(),
            times.len(),
            k.recovery_limit().as_secs_f64()
        );
    }
    out
}

/// Porcupine's verdict on each lock's history, and its operations by API: answered and done,
/// refused, and never answered (ambiguous), with the modes asked for.
pub fn histories(ops: &[Op], v: &Verdict) -> String {
    let mut out = format!(
        "  linearizability (Porcupine, {} operations checked in {:.1} s): {}",
        ops.len(),
        v.seconds,
        v.result
    );
    let tally = tally(ops);
    for lock in &v.locks {
        out += &format!("\n    {}: {} ({} operations)", lock.lock, lock.result, lock.ops);
        for ((_, api), t) in tally.iter().filter(|((l, _), _)| *l == lock.lock) {
            let modes = if t.modes.is_empty() {
                String::new()
            } else {
                format!(", {}", t.modes.join(" and "))
            };
            out += &format!(
                "\n      {api:<10} {} ok, {} failed, {} ambiguous{modes}",
                t.ok, t.failed, t.ambiguous
            );
        }
    }
    let dir = run_dir();
    out += &format!("\n  history: {}", dir.join("history.json").display());
    if let Some(html) = &v.visualization {
        out += &format!("\n  violation shown in {html}");
    }
    out
}

/// For each fault after which its lock made no progress within the limit, that lock's
/// operations from 3 s before it to 2 s past the limit, one per line (seconds from `start`):
/// what a failed run leaves to find out why, when its history file is on another machine.
pub fn slow_recoveries(a: &Analysis, ops: &[Op], start: f64) -> String {
    let mut out = String::new();
    for (f, took) in &a.recoveries {
        let limit = f.kind.recovery_limit().as_secs_f64();
        if took.is_some_and(|t| t <= limit) {
            continue;
        }
        let lock = if f.kind.max_holders().is_some() {
            POOL
        } else {
            COUNTER
        };
        let (from, to) = (f.at - 3.0, f.recovery_from() + limit + 2.0);
        out += &format!(
            "\n  {lock}'s operations around the {} at {:.3}:",
            f.kind.name(),
            f.at - start
        );
        let (near, earlier) = around(ops, lock, (from, to));
        for o in near {
            let ret = o.ret.map_or("-".into(), |r| format!("{:.3}", r - start));
            out += &format!(
                "\n    {:.3} .. {ret:>7}  row {:>2} {:<9} {:?} {:?} token {}",
                o.call - start,
                o.row,
                o.api,
                o.kind,
                o.outcome,
                o.token
            );
        }
        if earlier > 0 {
            out += &format!(
                "\n    (and {earlier} operations called before {:.3} that were never answered)",
                from - start
            );
        }
    }
    out
}

/// `lock`'s operations over `from..to`: those running then, in order, and how many that never
/// answered were called before `from` (such an operation may act at any time after its call,
/// but listed one by one they would bury the operations around the fault).
fn around<'a>(ops: &'a [Op], lock: &str, (from, to): (f64, f64)) -> (Vec<&'a Op>, usize) {
    let of_lock = || ops.iter().filter(move |o| o.lock == lock);
    let running = |o: &&Op| o.call <= to && o.ret.map_or(o.call >= from, |r| r >= from);
    let earlier = of_lock().filter(|o| o.ret.is_none() && o.call < from).count();
    (of_lock().filter(running).collect(), earlier)
}

/// How many holds each multi-lock worker had, by its set (`pool+counter`), from its slot.
pub fn sets(slots: &[std::sync::Arc<super::worker::Slot>]) -> Vec<(String, usize)> {
    (WORKERS.iter().zip(slots))
        .filter(|(w, _)| !w.with.is_empty())
        .map(|(w, s)| {
            let holds = s.holds.lock().unwrap();
            let n = holds.iter().filter(|h| h.lock == w.lock).count();
            (format!("{}+{}", w.lock, w.with.join("+")), n)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{OpKind, Outcome};

    fn op(call: f64, ret: Option<f64>) -> Op {
        Op {
            lock: COUNTER,
            client: "w0".into(),
            row: 0,
            kind: OpKind::Acquire,
            api: "acquire",
            mode: None,
            granted: None,
            permits: None,
            outcome: if ret.is_some() {
                Outcome::Ok
            } else {
                Outcome::Unknown
            },
            token: 0,
            limit: 0,
            call,
            ret,
        }
    }

    /// Finding 10 of the edges review: the operations "around" a slow fault listed every
    /// operation of the whole run that was never answered, burying the ones near the fault.
    #[test]
    fn operations_never_answered_before_the_window_are_counted_not_listed() {
        let ops = [
            op(1.0, None),
            op(2.0, None),
            op(9.5, Some(10.5)),
            op(10.2, None),
            op(20.0, None),
        ];
        let (near, earlier) = around(&ops, COUNTER, (10.0, 15.0));
        let calls: Vec<f64> = near.iter().map(|o| o.call).collect();
        assert_eq!((calls, earlier), (vec![9.5, 10.2], 2));
    }
}
