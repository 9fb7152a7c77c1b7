//! A lock published by two clusters' operators over one etcd (docs/operator.md, "Locks shared
//! by several clusters"), wiped twice: the edges review's finding 6. One cluster publishes the
//! settings, and each operator chooses the epoch from its own status, which only its own API
//! server keeps; the other cluster's status learns an epoch when that operator mirrors it.
//! An operator whose status is behind can therefore publish an epoch again after a second
//! wipe, and the tokens it hands out fall below earlier ones: no rule closes that without a
//! store both clusters share that survives the wipe. What the engine does is end it as soon as
//! an operator that knows reconciles: fencing outranks the publisher rule, so the operator
//! whose status says the tokens fell publishes a new epoch over the other cluster's settings
//! ([`Bug::PublisherOverFencing`] takes that away, and the checker finds it).

use crate::model::{Action, Protocol};
use crate::props::{FENCING, REUSE};
use crate::rebuild::{behind, rebuilt};
use crate::runs::{Expect, Run};
use crate::spec::{Bug, EpochRule, Rebuild, Spec};
use crate::state::{Lock, Rebuilt, State, Status};

impl Rebuilt {
    /// The status of lock `l` in cluster `c`'s API server (the second cluster keeps lock 0's).
    pub fn status_of(&mut self, c: u8, l: u8) -> &mut Status {
        match c {
            0 => &mut self.status[l as usize],
            _ => &mut self.other,
        }
    }
}

impl Protocol {
    /// The second cluster's operator steps possible now: its reconcile and its mirror.
    pub fn other_steps(&self, s: &State, out: &mut Vec<Action>) {
        let r = s.rebuilt.as_deref().expect("a run that rebuilds etcd");
        let lock = &s.locks[0];
        if lock.modrev == 0 || self.epoch_for(lock, &r.other, s.etcd) != lock.epoch {
            out.push(Action::OtherPublish);
        }
        if behind(lock, &r.other) {
            out.push(Action::OtherMirror);
        }
    }

    /// Whether the operator of cluster `c` may write `lock`'s settings: none are in etcd, or it
    /// published them, or its status says their tokens fall below ones handed out (`renew`).
    pub(crate) fn may_publish(&self, lock: &Lock, c: u8, renew: bool) -> bool {
        let fencing_first = self.spec.bug != Some(Bug::PublisherOverFencing);
        lock.modrev == 0 || lock.publisher == c || (renew && fencing_first)
    }

    /// Notes that cluster `c` published `epoch`: an epoch another cluster published first
    /// opens the window in which tokens may fall ([`Rebuilt::reused`]).
    pub(crate) fn note_published(&self, r: &mut Rebuilt, c: u8, epoch: u8) {
        let (highest, by) = r.highest;
        r.reused = self.spec.two_publishers && epoch <= highest && by != c;
        if epoch > highest {
            r.highest = (epoch, c);
        }
    }
}

/// A mutex of two pods' clients, published by the operators of two clusters, each with its
/// status lagging; etcd wiped twice.
fn published_twice(name: &'static str, bug: Option<Bug>) -> Spec {
    Spec {
        two_publishers: true,
        ..rebuilt(name, Rebuild::Wipe, EpochRule::WriteAhead, true, bug)
    }
}

/// The runs of a lock two clusters publish.
pub fn runs() -> Vec<Run> {
    vec![
        Run {
            spec: published_twice("two clusters publish, etcd wiped twice", None),
            about: "either cluster publishes after each wipe; a cluster whose status had not \
                    mirrored the other's epoch publishes it again, and its grants can fall below \
                    earlier tokens until an operator that knows reconciles and moves the lock \
                    to a new epoch (the cross-cluster window, finding 6)",
            expect: Expect::Fails(&[REUSE]),
        },
        Run {
            spec: published_twice(
                "bug: the publisher rule over fencing",
                Some(Bug::PublisherOverFencing),
            ),
            about: "the operator that knows the tokens fell leaves the other cluster's settings \
                    alone (the engine before finding 6's fix): they fall for good",
            expect: Expect::Finds(FENCING),
        },
    ]
}
