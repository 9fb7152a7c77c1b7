//! Please yield (`podlock.io/yield`, docs/operator.md): an administrator asks a holder to
//! release by a deadline, and the holder is told ahead of its end.
//!
//! The operator reads the lock, picks a key holding by the one rule ([`named`]) whose grant is
//! recorded, then, any time later, writes the request into that key's entry, guarded by the
//! mod revision it read: a compare-and-swap, so it keeps whatever the entry says (a failed
//! guard makes it read again). The write changes the key's mod revision only: its create revision (its
//! place and its token) and its lease stay. The holder's sidecar sees the write on its key's
//! watch and tells the app, which may release at any moment, as always. At the deadline the
//! operator ends a hold whose entry still carries the request, as it ends one past its
//! maximum hold time ([`crate::deadline`]: a read, then a deletion guarded by create revision).
//!
//! The owner's record of its grant (`acquiredAt`) is a plain put of its own entry, which would
//! erase a request written before it: hence a request only once the grant is recorded, as a
//! key records once ([`Bug::YieldBeforeRecord`] asks earlier: the record erases the request,
//! the holder is never told and never ended). A release's handoff writes only a key untouched
//! since its enqueue, so never one asked to yield.

use crate::decide::named;
use crate::model::{Action, Protocol};
use crate::runs::{Expect, HOLDS, Run, spec};
use crate::spec::{Bug, ClientSpec as C, Spec};
use crate::state::{Record, Rev, State};

/// Safety: a yield request stays in the entry it was written to for as long as that key lives.
pub const KEPT: &str = "yield: a request written into a holder's entry stays there while the key lives";
/// Reached: a holder asked to yield released before its deadline.
pub const YIELDED: &str = "a holder asked to yield released in time";

/// The yield requests of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Yields {
    /// Requests the administrator may still make.
    pub left: u8,
    /// A request the operator has read a holder for but not yet written: the lock, and the
    /// create and mod revisions of the key it read.
    pub read: Option<(u8, Rev, Rev)>,
    /// The key a request was written to: the lock and its create revision.
    pub asked: Option<(u8, Rev)>,
    /// Whether a holder asked to yield released.
    pub yielded: bool,
}

impl Yields {
    /// Applies `f` to every revision it remembers (see `State::normalize`).
    pub fn each_rev(&mut self, f: &mut impl FnMut(&mut Rev)) {
        if let Some((_, create, modrev)) = &mut self.read {
            f(create);
            f(modrev);
        }
        if let Some((_, create)) = &mut self.asked {
            f(create);
        }
    }
}

impl Protocol {
    /// The operator's yield steps possible now: a read that picks a holder not yet asked, or
    /// the write of the request into the key it picked.
    pub fn yield_steps(&self, s: &State, out: &mut Vec<Action>) {
        if s.yields.read.is_some() {
            return out.push(Action::YieldWrite);
        }
        if s.yields.left == 0 {
            return;
        }
        for l in 0..s.locks.len() as u8 {
            let early = self.spec.bug == Some(Bug::YieldBeforeRecord);
            let recorded = |r: Record| early || matches!(r, Record::Own | Record::Behalf);
            let holders = (named(self, s, l).into_iter()).filter(|k| !k.yielding && recorded(k.record));
            out.extend(holders.map(|k| Action::YieldRead(l, k.create)));
        }
    }

    /// Takes the operator's yield step `action`.
    pub fn yield_step(&self, s: &mut State, action: Action) {
        match action {
            Action::YieldRead(l, create) => {
                let modrev = s.key(l, create).expect("a key just named").modrev;
                s.yields.read = Some((l, create, modrev));
            }
            Action::YieldWrite => {
                let (l, create, modrev) = s.yields.read.take().expect("a yield read");
                // Gone, or written since the read: the guard fails (the operator reads again).
                if s.key(l, create).is_none_or(|k| k.modrev != modrev) {
                    return;
                }
                let rev = s.next_rev();
                let key = s.key_mut(l, create).expect("just checked");
                (key.yielding, key.modrev) = (true, rev);
                s.yields.left -= 1;
                s.yields.asked = Some((l, create));
            }
            _ => unreachable!("{action:?} is no yield step"),
        }
    }

    /// Notes that `c`, holding key `ticket`, releases: in time, if the key was asked to yield.
    pub fn note_release(&self, s: &mut State, c: u8, ticket: Rev) {
        let lock = self.spec.clients[c as usize].lock;
        if s.key(lock, ticket).is_some_and(|k| k.yielding) {
            s.yields.yielded = true;
        }
    }
}

/// Whether every request written is still in its key's entry (or the key is gone).
pub fn kept(s: &State) -> bool {
    let Some((l, create)) = s.yields.asked else {
        return true;
    };
    s.key(l, create).is_none_or(|k| k.yielding)
}

/// A mutex: a holder id that acquires twice under the same key name, and another holder; one
/// yield request, ended at its deadline if not released; a fault.
fn holders(name: &'static str, bug: Option<Bug>) -> Spec {
    Spec {
        yields: 1,
        deadlines: 1,
        bug,
        ..spec(
            name,
            vec![1],
            vec![vec![]],
            vec![C::new(0, 0).acquires(2), C::new(1, 0), C::new(2, 0)],
        )
    }
}

/// The runs of yield requests.
pub fn runs() -> Vec<Run> {
    vec![
        Run {
            spec: holders("yield requests", None),
            about: "an administrator asks a holder to yield: the operator reads a holder, then \
                    writes the request into its recorded entry guarded by the mod revision it \
                    read; the holder releases in time or is ended at the deadline (a read, then a deletion guarded by create revision); direct \
                    handoff, a fault",
            expect: HOLDS,
        },
        Run {
            spec: holders(
                "bug: a yield request before the grant's record",
                Some(Bug::YieldBeforeRecord),
            ),
            about: "the operator asks a holder whose grant is not recorded yet: the record, a \
                    put of the owner's entry, erases the request",
            expect: Expect::Finds(KEPT),
        },
    ]
}
