//! The checker proper: what the workers' holds, the store's log of accepted writes and the
//! injected faults say about safety and progress. Pure functions, tested below on histories of
//! a broken lock.
//!
//! Safety, in the terms a correct client sees: a hold lasts from its grant until its client
//! sends release or learns that it is lost. When a hold is granted while an earlier one still
//! lasts, the earlier one must have been lost (its lease ended: its sidecar was paused or cut
//! off from etcd), its client must have been told within [`LOST_NOTICE`] of the later grant (or
//! of its sidecar running again), and its token must be the lower one. Any other overlap means
//! the lock granted a hold that was not free: that is how an accepted write would come to lie
//! inside another's hold. The store's log must show the accepted writes in strictly rising
//! token order, each from a hold a worker was granted, each counted once. A write made after
//! its hold was lost or superseded must be rejected by fencing, or counted as stale.

use super::faults::{Fault, Kind};
use super::worker::HoldRecord;
use crate::common::store::AcceptedWrite;

/// How late a client may learn that its hold was lost, after the next grant (or after its
/// sidecar ran again): the API's promise, "within 1 s of the hold ending".
pub const LOST_NOTICE: f64 = 1.0;

/// The verdict on one run.
#[derive(Debug, Default)]
pub struct Analysis {
    /// Holds granted.
    pub grants: usize,
    /// Holds whose clients learned that they were lost.
    pub lost: usize,
    /// For each hold that a later grant overlapped, explained by its loss: how long after that
    /// grant (or its sidecar resuming) its client was told.
    pub notice_lags: Vec<f64>,
    /// Everything that breaks safety, in words.
    pub violations: Vec<String>,
    /// Writes accepted by the store.
    pub accepted: usize,
    /// Writes rejected by fencing (stale tokens).
    pub rejected: usize,
    /// Of those, writes of paused holders.
    pub rejected_paused: usize,
    /// Accepted writes made after their hold ended or was superseded (before the successor
    /// wrote, so fencing let them in, in token order).
    pub stale_accepted: usize,
    /// Holds lost before their client wrote: correct clients did not write.
    pub unwritten: usize,
    /// Each fault, and the time from it to the first accepted write of a hold granted after
    /// it (`None`: never).
    pub recoveries: Vec<(Fault, Option<f64>)>,
    /// The longest time between two accepted writes, and when it began.
    pub longest_stall: (f64, f64),
}

/// Checks one run.
pub fn analyze(holds: &[HoldRecord], writes: &[AcceptedWrite], faults: &[Fault]) -> Analysis {
    let mut a = Analysis {
        grants: holds.len(),
        lost: holds.iter().filter(|h| h.lost.is_some()).count(),
        accepted: writes.len(),
        ..Analysis::default()
    };
    check_overlaps(holds, faults, &mut a);
    check_token_order(holds, &mut a);
    check_writes(holds, writes, &mut a);
    a.recoveries = faults
        .iter()
        .map(|f| {
            let next = writes
                .iter()
                .find(|w| w.at > f.at && holds.iter().any(|h| h.token == w.token && h.granted > f.at));
            (*f, next.map(|w| w.at - f.at))
        })
        .collect();
    a.longest_stall = writes
        .windows(2)
        .map(|w| (w[1].at - w[0].at, w[0].at))
        .fold((0.0, 0.0), |m, g| if g.0 > m.0 { g } else { m });
    a
}

/// Holds that a later grant overlapped: explained by a timely lost notice, or violations.
fn check_overlaps(holds: &[HoldRecord], faults: &[Fault], a: &mut Analysis) {
    let mut by_grant: Vec<&HoldRecord> = holds.iter().collect();
    by_grant.sort_by(|x, y| x.granted.total_cmp(&y.granted));
    for (i, h) in by_grant.iter().enumerate() {
        let later = by_grant[i + 1..]
            .iter()
            .take_while(|n| n.granted < h.ended)
            .collect::<Vec<_>>();
        let Some(first) = later.first() else { continue };
        for n in &later {
            if n.token < h.token {
                a.violations.push(format!(
                    "token {} granted at {:.3} after token {} (granted {:.3}, still held)",
                    n.token, n.granted, h.token, h.granted
                ));
            }
        }
        let Some(_) = h.lost else {
            a.violations.push(format!(
                "token {} (worker {}, {:.3}..{:.3}, never lost) overlapped by token {} granted at {:.3}",
                h.token, h.worker, h.granted, h.ended, first.token, first.granted
            ));
            continue;
        };
        // A stopped sidecar cannot tell anyone anything: count from when it ran again.
        let resumed = faults
            .iter()
            .filter(|f| matches!(f.kind, Kind::Pause | Kind::ReleasePause) && f.target == h.worker)
            .filter(|f| f.at < h.ended && f.until > h.granted)
            .map(|f| f.until)
            .fold(first.granted, f64::max);
        let lag = h.ended - resumed;
        if lag > LOST_NOTICE {
            a.violations.push(format!(
                "token {} (worker {}) told it was lost {lag:.3} s after token {} was granted",
                h.token, h.worker, first.token
            ));
        }
        a.notice_lags.push(lag.max(0.0));
    }
}

/// Tokens must rise in grant order: a grant with a lower token than an earlier grant's means
/// the lock handed out grants out of queue order (as it did when `maxHolders` changed under
/// queued waiters), and a fenced resource would then refuse a rightful holder.
fn check_token_order(holds: &[HoldRecord], a: &mut Analysis) {
    let mut by_grant: Vec<&HoldRecord> = holds.iter().collect();
    by_grant.sort_by(|x, y| x.granted.total_cmp(&y.granted));
    let mut highest: Option<&HoldRecord> = None;
    for h in by_grant {
        match highest {
            Some(top) if h.token <= top.token => a.violations.push(format!(
                "token {} granted at {:.3} after token {} was granted at {:.3}",
                h.token, h.granted, top.token, top.granted
            )),
            _ => highest = Some(h),
        }
    }
}

/// The store's log against the workers' writes.
fn check_writes(holds: &[HoldRecord], writes: &[AcceptedWrite], a: &mut Analysis) {
    for (i, w) in writes.iter().enumerate() {
        if w.value != i as u64 + 1 {
            a.violations.push(format!(
                "accepted write {} (token {}) left the counter at {}: an increment lost or duplicated",
                i + 1,
                w.token,
                w.value
            ));
        }
        if i > 0 && w.token <= writes[i - 1].token {
            a.violations.push(format!(
                "accepted token {} after token {}",
                w.token,
                writes[i - 1].token
            ));
        }
        let mine: Vec<&HoldRecord> = holds
            .iter()
            .filter(|h| h.token == w.token && h.write.is_some_and(|w| w.status == 200))
            .collect();
        let [h] = mine[..] else {
            a.violations.push(format!(
                "accepted token {} matches {} acknowledged writes, not one",
                w.token,
                mine.len()
            ));
            continue;
        };
        let superseded = holds.iter().any(|n| n.token > h.token && n.granted < w.at);
        if superseded || h.write.is_some_and(|w| w.sent > h.ended) {
            a.stale_accepted += 1;
        }
    }
    let acknowledged = holds
        .iter()
        .filter(|h| h.write.is_some_and(|w| w.status == 200))
        .count();
    if acknowledged != writes.len() {
        a.violations.push(format!(
            "workers saw {acknowledged} writes accepted, the store logged {}",
            writes.len()
        ));
    }
    let rejected = |paused: bool| {
        holds
            .iter()
            .filter(|h| h.write.is_some_and(|w| w.status == 409 && (w.paused || !paused)))
            .count()
    };
    (a.rejected, a.rejected_paused) = (rejected(false), rejected(true));
    a.unwritten = holds.iter().filter(|h| h.write.is_none()).count();
}

#[cfg(test)]
mod tests {
    use super::super::worker::WriteRecord;
    use super::*;

    fn hold(token: i64, granted: f64, ended: f64, lost: Option<f64>, status: u16) -> HoldRecord {
        HoldRecord {
            worker: token as usize % 3,
            token,
            granted,
            ended,
            lost,
            write: Some(WriteRecord {
                sent: granted + 0.001,
                status,
                paused: false,
            }),
        }
    }

    fn write(at: f64, token: i64, value: u64) -> AcceptedWrite {
        AcceptedWrite { at, token, value }
    }

    #[test]
    fn handoffs_in_turn_pass() {
        let holds = [hold(10, 0.0, 0.1, None, 200), hold(12, 0.11, 0.2, None, 200)];
        let writes = [write(0.01, 10, 1), write(0.12, 12, 2)];
        let a = analyze(&holds, &writes, &[]);
        assert!(a.violations.is_empty(), "{:?}", a.violations);
        assert_eq!((a.accepted, a.stale_accepted), (2, 0));
    }

    #[test]
    fn a_grant_while_another_holds_is_caught() {
        // A broken lock: token 12 granted while token 10's client still holds and never hears
        // otherwise; both writes land, in token order, so fencing alone would not notice.
        let holds = [hold(10, 0.0, 0.3, None, 200), hold(12, 0.1, 0.2, None, 200)];
        let writes = [write(0.05, 10, 1), write(0.15, 12, 2)];
        let a = analyze(&holds, &writes, &[]);
        assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
    }

    #[test]
    fn a_lost_hold_must_be_told_in_time() {
        let told = |at: f64| {
            let holds = [hold(10, 0.0, at, Some(at), 409), hold(12, 0.5, 0.6, None, 200)];
            analyze(&holds, &[write(0.51, 12, 1)], &[])
        };
        let a = told(0.7);
        assert!(a.violations.is_empty(), "{:?}", a.violations);
        assert_eq!(a.notice_lags.len(), 1);
        assert_eq!(told(1.6).violations.len(), 1);
    }

    #[test]
    fn a_release_answered_released_after_a_later_grant_is_caught() {
        // The bug of a release that answered 200 for a hold whose lease had ended while its
        // sidecar was paused: the client counts its hold until it sent the release (0.5), and
        // token 12 was granted at 0.3.
        let holds = [hold(10, 0.0, 0.5, None, 200), hold(12, 0.3, 0.6, None, 200)];
        let a = analyze(&holds, &[write(0.01, 10, 1), write(0.31, 12, 2)], &[]);
        assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
        // Told lost (410) on that release instead: explained, and told in time.
        let holds = [hold(10, 0.0, 0.5, Some(0.5), 200), hold(12, 0.3, 0.6, None, 200)];
        let a = analyze(&holds, &[write(0.01, 10, 1), write(0.31, 12, 2)], &[]);
        assert!(a.violations.is_empty(), "{:?}", a.violations);
    }

    #[test]
    fn grants_out_of_token_order_are_caught() {
        // After a raise of maxHolders, a late contender (13) was granted before an earlier
        // waiter (11), which got its lower token afterwards.
        let holds = [hold(13, 0.0, 0.1, None, 200), hold(11, 0.2, 0.3, None, 409)];
        let a = analyze(&holds, &[write(0.01, 13, 1)], &[]);
        assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
    }

    #[test]
    fn a_lost_or_stale_write_is_caught_or_counted() {
        let holds = [hold(10, 0.0, 0.1, None, 200), hold(12, 0.2, 0.3, None, 200)];
        // A write logged with the wrong counter value: an increment went missing.
        let a = analyze(&holds, &[write(0.05, 10, 1), write(0.25, 12, 3)], &[]);
        assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
        // A lost hold's write that landed after the next grant, before the successor wrote.
        let holds = [hold(10, 0.0, 0.3, Some(0.3), 200), hold(12, 0.2, 0.4, None, 200)];
        let a = analyze(&holds, &[write(0.25, 10, 1), write(0.35, 12, 2)], &[]);
        assert!(a.violations.is_empty(), "{:?}", a.violations);
        assert_eq!(a.stale_accepted, 1);
    }
}
