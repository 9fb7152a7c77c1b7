//! Progress after a fault: how long the lock a fault hit took to move on.

use super::faults::Fault;
use super::worker::HoldRecord;
use super::{COUNTER, POOL};
use crate::common::store::AcceptedWrite;

/// How long after `f` the lock it hit made progress: a change of the semaphore's `maxHolders`,
/// its next grant; any other fault, the first accepted write of a hold granted after it (after
/// a rebuilt etcd came back), or the grant of one whose worker the run stalls on purpose before
/// its write (past its maximum hold time, one in 8 tokens: `Worker::outstays`): the lock moved
/// on, and the stall after the grant is the run's own doing, not the lock's.
pub fn after(f: &Fault, holds: &[HoldRecord], writes: &[AcceptedWrite]) -> Option<f64> {
    if f.kind.max_holders().is_some() {
        let next = holds.iter().filter(|h| h.lock == POOL && h.granted > f.at);
        return next.map(|h| h.granted - f.at).reduce(f64::min);
    }
    let from = f.recovery_from();
    let later = |w: &&AcceptedWrite| {
        holds
            .iter()
            .any(|h| h.lock == COUNTER && h.token == w.token && h.granted > from)
    };
    let written = (writes.iter().filter(|w| w.at > from).find(later)).map(|w| w.at);
    let stalled = holds
        .iter()
        .filter(|h| h.lock == COUNTER && h.granted > from)
        .filter(|h| h.write.is_some_and(|w| w.paused))
        .map(|h| h.granted);
    (written.into_iter().chain(stalled))
        .reduce(f64::min)
        .map(|at| at - from)
}

#[cfg(test)]
mod tests {
    use super::super::faults::Kind;
    use super::super::worker::WriteRecord;
    use super::*;

    /// A hold of the mutex granted at `granted`, whose write was sent just after: `paused`, a
    /// write the worker made after stalling on purpose.
    fn hold(token: i64, granted: f64, status: u16, paused: bool) -> HoldRecord {
        HoldRecord {
            lock: COUNTER,
            worker: 0,
            sidecar: 0,
            token,
            permits: 1,
            acquired: granted,
            granted,
            ended: granted + 1.0,
            lost: (status != 200).then_some(granted + 1.0),
            write: Some(WriteRecord {
                sent: granted + 0.001,
                status,
                paused,
            }),
        }
    }

    /// The session-35 run's case: 2.04 s after a pause past the TTL, the next grant went to a
    /// worker that the run stalls past its maximum hold time on purpose (one in 8 tokens): its
    /// write came after its hold ended, rejected, and the grant after it wrote at 3.18 s. The
    /// lock moved on at 2.04 s; the stall after is the run's own doing.
    #[test]
    fn a_later_grant_stalled_on_purpose_is_progress_at_its_grant() {
        let pause = Fault {
            kind: Kind::Pause,
            target: 0,
            at: 0.0,
            until: 3.0,
        };
        let holds = [hold(472, 2.04, 409, true), hold(477, 3.09, 200, false)];
        let writes = [AcceptedWrite {
            at: 3.18,
            token: 477,
            value: 1,
        }];
        assert_eq!(after(&pause, &holds, &writes), Some(2.04));
        // A later grant that wrote, or none stalled: its accepted write is the progress.
        let wrote = [hold(472, 2.04, 200, false)];
        let writes = [AcceptedWrite {
            at: 2.1,
            token: 472,
            value: 1,
        }];
        let progress = after(&pause, &wrote, &writes).unwrap();
        assert!((progress - 2.1).abs() < 1e-9, "{progress}");
    }
}
