//! A maximum hold time (`maxHoldSeconds`, docs/api.md): a hold that asked for one ends at its
//! deadline. Time is "at any moment" in the model, so a deadline is a hold ended at any moment:
//! by its sidecar (the monitor ends it as lost, then removes its key in the background, as for
//! a missed heartbeat), or by the operator, which ends a hold its sidecar did not end by then (a
//! sidecar gone, hung, or cut off): like a force release, in two steps, a read of the lock that
//! picks a key holding by the one rule whose entry has a maximum hold time, then, any time
//! later, its deletion guarded by that key's create revision. The guard matters because the
//! same holder id may meanwhile have released and acquired again under the same key name,
//! without a deadline, or with one of its own not yet due ([`Bug::DeadlineByName`] deletes by
//! name instead, and ends that later hold).

use crate::decide::named;
use crate::model::{Action, Protocol};
use crate::runs::{Expect, HOLDS, Run, spec};
use crate::spec::{Bug, ClientSpec as C, Spec};
use crate::state::{Broken, Phase, State};

/// Safety: the operator's deadline release ends only the hold whose deadline it read.
pub const OWN_HOLD: &str = "deadline: the operator's deadline release ends only the hold it read as due";
/// Reached: a sidecar ended a hold at its deadline.
pub const BY_SIDECAR: &str = "a hold ended at its deadline by its sidecar";
/// Reached: the operator ended a hold at its deadline that its client believed it had.
pub const BY_OPERATOR: &str = "a believed hold ended at its deadline by the operator";

impl Protocol {
    /// Whether `c`'s current acquire asks for a maximum hold time: only its first does (a
    /// later one of the same holder id asks for none).
    pub fn timed(&self, s: &State, c: u8) -> bool {
        let spec = &self.spec.clients[c as usize];
        spec.deadline && s.clients[c as usize].left + 1 == spec.acquires
    }

    /// The operator's deadline steps possible now: a read that picks a timed holder of a lock
    /// (or one asked to yield, whose deadline is the request's: [`crate::yielding`]), or the
    /// deletion of the one it picked.
    pub fn deadline_steps(&self, s: &State, out: &mut Vec<Action>) {
        if s.deadline.is_some() {
            return out.push(Action::DeadlineDelete);
        }
        if s.deadlines == 0 {
            return;
        }
        for l in 0..s.locks.len() as u8 {
            let due = named(self, s, l).into_iter().filter(|k| k.timed || k.yielding);
            out.extend(due.map(|k| Action::DeadlineRead(l, k.create)));
        }
    }

    /// Takes the operator's deadline step `action`.
    pub fn deadline_step(&self, s: &mut State, action: Action) {
        match action {
            Action::DeadlineRead(l, create) => {
                let key = s.key(l, create).expect("a key just named");
                s.deadline = Some((l, create, key.name()));
                s.deadlines -= 1;
            }
            Action::DeadlineDelete => {
                let (l, create, name) = s.deadline.take().expect("a deadline read");
                let target = match self.spec.bug {
                    Some(Bug::DeadlineByName) => s.named(l, name).map(|k| k.create),
                    _ => Some(create),
                };
                let Some(target) = target else { return };
                let believed = (s.clients.iter())
                    .any(|c| matches!(c.phase, Phase::Holding { ticket, .. } if ticket == target));
                if s.delete(l, target) && believed {
                    s.deadline_ended.1 = true;
                }
                if target != create {
                    s.broken.get_or_insert(Broken::DeadlineOther);
                }
            }
            _ => unreachable!("{action:?} is no deadline step"),
        }
    }
}

/// A mutex whose holders ask for maximum hold times: a holder id acquiring twice through
/// `/acquire` (a deadline on its first hold only, and its second key under the same name), a
/// holder on a connection with a deadline, and one without; a fault; the operator ends one
/// hold at its deadline.
fn holders(name: &'static str, bug: Option<Bug>) -> Spec {
    Spec {
        deadlines: 1,
        bug,
        ..spec(
            name,
            vec![1],
            vec![vec![]],
            vec![
                C::new(0, 0).acquires(2).deadline(),
                C::new(1, 0).connection().deadline(),
                C::new(2, 0),
            ],
        )
    }
}

/// The runs of maximum hold times.
pub fn runs() -> Vec<Run> {
    vec![
        Run {
            spec: holders("deadlines", None),
            about: "holds with a maximum hold time, ended at any moment by their sidecar (lost, \
                    the key removed in the background) or by the operator (a read of a timed \
                    holder, then its key deleted guarded by create revision), beside a fault",
            expect: HOLDS,
        },
        Run {
            spec: holders("bug: deadline release by key name", Some(Bug::DeadlineByName)),
            about: "the operator's deadline release deletes whatever key has the name it read: \
                    the holder id's later hold, acquired again under the same key, is ended",
            expect: Expect::Finds(OWN_HOLD),
        },
    ]
}
