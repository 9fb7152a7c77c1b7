//! The checker proper: what the workers' holds, the store's log of accepted writes and the
//! injected faults say about safety and progress. Pure functions, tested below on histories of
//! a broken lock.
//!
//! Safety, in the terms a correct client sees: a hold lasts from its grant until its client
//! sends release or learns that it is lost. When a hold is granted while earlier ones still
//! last and fill the lock's `maxHolders` in force (one, for the mutex), enough of those must
//! have been lost (their leases ended: their sidecars were paused or cut off from etcd), their
//! clients told within [`LOST_NOTICE`] of the later grant (or of their sidecar running again);
//! and tokens must rise in grant order ([`overlap`](super::overlap)). Any other overlap means
//! the lock granted a hold that was not free: that is how an accepted write would come to lie
//! inside another's hold. The store's log must show the mutex's accepted writes in strictly
//! rising token order, each from a hold a worker was granted, each counted once. A write made
//! after its hold was lost or superseded must be rejected by fencing, or counted as stale.

use super::faults::Fault;
use super::overlap::{Limits, LockStats, check_lock};
use super::recovery;
use super::worker::HoldRecord;
use super::{COUNTER, POOL, POOL_SLOTS};
use crate::common::store::AcceptedWrite;

/// How late a client may learn that its hold was lost, after the next grant (or after its
/// sidecar ran again): the API's promise, "within 1 s of the hold ending".
pub const LOST_NOTICE: f64 = 1.0;

/// The verdict on one run.
#[derive(Debug, Default)]
pub struct Analysis {
    /// Per lock that was held: its grants, losses and most holders at once.
    pub locks: Vec<(&'static str, LockStats)>,
    /// For each hold that a later grant overlapped, explained by its loss: how long after that
    /// grant (or its sidecar resuming) its client was told.
    pub notice_lags: Vec<f64>,
    /// Everything that breaks safety, in words.
    pub violations: Vec<String>,
    /// Writes accepted by the store (the mutex's).
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
    /// it; for a change of the semaphore's `maxHolders`, to its next grant (`None`: never).
    pub recoveries: Vec<(Fault, Option<f64>)>,
    /// The longest time between two accepted writes, and when it began.
    pub longest_stall: (f64, f64),
}

/// Checks one run.
pub fn analyze(holds: &[HoldRecord], writes: &[AcceptedWrite], faults: &[Fault]) -> Analysis {
    let mut a = Analysis {
        accepted: writes.len(),
        ..Analysis::default()
    };
    let limits = [
        (COUNTER, Limits::fixed(1)),
        (POOL, Limits::changed_by(POOL_SLOTS, faults)),
    ];
    for (lock, limits) in limits {
        let of_lock: Vec<&HoldRecord> = holds.iter().filter(|h| h.lock == lock).collect();
        check_lock(&of_lock, &limits, faults, &mut a);
    }
    let counter: Vec<HoldRecord> = (holds.iter()).filter(|h| h.lock == COUNTER).cloned().collect();
    check_writes(&counter, writes, &mut a);
    a.recoveries = (faults.iter())
        .map(|f| (*f, recovery::after(f, holds, writes)))
        .collect();
    a.longest_stall = writes
        .windows(2)
        .map(|w| (w[1].at - w[0].at, w[0].at))
        .fold((0.0, 0.0), |m, g| if g.0 > m.0 { g } else { m });
    a
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
    use super::super::faults::Kind;
    use super::super::worker::WriteRecord;
    use super::*;

    /// A hold of the mutex, granted by its sidecar just as it arrived, and written.
    fn hold(token: i64, granted: f64, ended: f64, lost: Option<f64>, status: u16) -> HoldRecord {
        HoldRecord {
            lock: COUNTER,
            worker: token as usize % 3,
            sidecar: token as usize % 3,
            token,
            permits: 1,
            acquired: granted,
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

    /// A hold of the semaphore: no write.
    fn slot(token: i64, granted: f64, ended: f64, lost: Option<f64>) -> HoldRecord {
        HoldRecord {
            lock: POOL,
            write: None,
            ..hold(token, granted, ended, lost, 0)
        }
    }

    /// A change of the semaphore's `maxHolders` to `kind`'s, by a command run over `at..at + 0.05`.
    fn change(kind: Kind, at: f64) -> Fault {
        Fault {
            kind,
            target: 0,
            at,
            until: at + 0.05,
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
    fn a_grant_answered_after_its_key_was_ended_must_be_told_lost_in_time() {
        // Token 10 was decided first, but its answer (and stamp) came after token 12's grant:
        // its key had been ended meanwhile. Its client must hear of the loss in time.
        let answered_late = |told: f64| {
            let mut late = hold(10, 0.3, told, Some(told), 409);
            late.acquired = 0.25;
            let holds = [hold(12, 0.2, 0.6, None, 200), late];
            analyze(&holds, &[write(0.21, 12, 1)], &[])
        };
        let a = answered_late(0.5);
        assert!(a.violations.is_empty(), "{:?}", a.violations);
        assert_eq!(answered_late(1.5).violations.len(), 2, "overlap and token order");
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

    #[test]
    fn a_semaphore_fills_its_slots_and_no_more() {
        // Two holders at once in a semaphore of 2: fine. A third beside them: caught.
        let two = [
            slot(10, 0.0, 1.0, None),
            slot(11, 0.5, 1.5, None),
            slot(12, 1.6, 2.0, None),
        ];
        let a = analyze(&two, &[], &[]);
        assert!(a.violations.is_empty(), "{:?}", a.violations);
        assert_eq!(a.locks[0].1.peaks.get(&2), Some(&2));
        let three = [
            slot(10, 0.0, 1.0, None),
            slot(11, 0.5, 1.5, None),
            slot(12, 0.9, 2.0, None),
        ];
        assert_eq!(analyze(&three, &[], &[]).violations.len(), 1);
    }

    #[test]
    fn a_weighted_hold_counts_its_permits() {
        // A hold of both slots of the semaphore of 2 beside a hold of one: caught, though only
        // two holds overlap. After it alone: fine, and the peak is its 2 permits.
        let whole = |token, granted, ended| HoldRecord {
            permits: 2,
            ..slot(token, granted, ended, None)
        };
        let beside = [slot(10, 0.0, 1.0, None), whole(11, 0.5, 1.5)];
        let a = analyze(&beside, &[], &[]);
        assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
        assert!(a.violations[0].contains("2 permits"), "{:?}", a.violations);
        let after = [slot(10, 0.0, 1.0, None), whole(11, 1.1, 1.5)];
        let a = analyze(&after, &[], &[]);
        assert!(a.violations.is_empty(), "{:?}", a.violations);
        assert_eq!(a.locks[0].1.peaks.get(&2), Some(&2));
    }

    #[test]
    fn a_semaphore_over_its_lowered_limit_is_caught() {
        // maxHolders 2 -> 1 at 1.0 while 10 and 11 hold: they may stay (no violation). Token 12,
        // granted at 2.0 beside 10 after 11 left, fits the old limit but not the one in force.
        let holds = [
            slot(10, 0.0, 3.0, None),
            slot(11, 0.5, 1.5, None),
            slot(12, 2.0, 2.5, None),
        ];
        let lowered = [change(Kind::PoolLowered, 1.0)];
        let a = analyze(&holds, &[], &lowered);
        assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
        assert!(
            a.violations[0].contains("beyond maxHolders 1"),
            "{:?}",
            a.violations
        );
        // Without the lowering, or raised back before it: fine.
        assert!(analyze(&holds, &[], &[]).violations.is_empty());
        let raised = [lowered[0], change(Kind::PoolRaised, 1.8)];
        assert!(analyze(&holds, &[], &raised).violations.is_empty());
        // A grant stamped just after the lowering may have been decided before it.
        let holds = [slot(10, 0.0, 3.0, None), slot(12, 1.1, 2.5, None)];
        assert!(analyze(&holds, &[], &lowered).violations.is_empty());
    }

    #[test]
    fn a_lost_slot_must_be_told_in_time_when_its_room_was_given_away() {
        // 10 lost its lease; 12 was granted beside 10 and 11 at 1.0, so 10's slot was given
        // away: its client must hear within 1 s of that grant.
        let told = |at: f64| {
            let holds = [
                slot(10, 0.0, at, Some(at)),
                slot(11, 0.5, 3.0, None),
                slot(12, 1.0, 3.0, None),
            ];
            analyze(&holds, &[], &[])
        };
        assert!(told(1.9).violations.is_empty(), "{:?}", told(1.9).violations);
        assert_eq!(told(2.1).violations.len(), 1);
        // With a free slot for 12, a late notice to 10 gave no one its room: not a violation.
        let holds = [slot(10, 0.0, 2.5, Some(2.5)), slot(12, 1.0, 3.0, None)];
        assert!(analyze(&holds, &[], &[]).violations.is_empty());
    }

    #[test]
    fn tokens_are_ordered_by_when_the_sidecars_granted_them() {
        // 11 was granted before 12 but its answer arrived after 12's: in order.
        let mut late = slot(11, 0.30, 0.5, None);
        late.acquired = 0.10;
        let holds = [slot(10, 0.0, 0.05, None), late.clone(), slot(12, 0.2, 0.6, None)];
        assert!(analyze(&holds, &[], &[]).violations.is_empty());
        // A token that goes down: 11 granted after 12, in a semaphore as in a mutex.
        late.acquired = 0.25;
        let a = analyze(
            &[slot(10, 0.0, 0.05, None), late, slot(12, 0.2, 0.6, None)],
            &[],
            &[],
        );
        assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
        assert!(a.violations[0].contains("token 11 granted"), "{:?}", a.violations);
    }
}
