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
//! The owner's record of its grant (`acquiredAt`) is a put of its own entry, which would erase
//! a request written before it: hence a request only once the grant is recorded, as a key
//! records once ([`Bug::YieldBeforeRecord`] asks earlier: the record erases the request, the
//! holder is never told and never ended). A release's handoff writes only a key untouched
//! since its enqueue, so never one asked to yield.
//!
//! "A key records once" holds for etcd only if a copy of the record cannot land twice: the
//! hedge sends a request again after 500 ms, and a retry follows an answer lost, so a copy of
//! the record can reach etcd after the first one landed and the operator wrote its request
//! (issue #54, F2). The record is therefore guarded by the entry's version being at most 2 (its
//! enqueue and, perhaps, a handoff's write: no more is ever written before the record, and a
//! request is written only after it), and a set's record by its keys' mod revisions being their
//! create revisions: a late copy lands at most over the record alone, putting it again, and
//! never over a request ([`Protocol::late_record`]). [`Bug::RecordByCreateOnly`] guards it by
//! create revision only, as before: the late copy erases the request.

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

impl Protocol {
    /// Notes, in a run with late records, that a copy of `c`'s grant record of `ticket` may
    /// still reach etcd. Its guard lets it land only while its keys' mod revision is `alone`
    /// (the record was the one write since the enqueue, and nothing was written since); never
    /// when `None`.
    pub(crate) fn send_record_copy(&self, s: &mut State, c: u8, ticket: Rev, alone: Option<Rev>) {
        if self.spec.late_records {
            s.clients[c as usize].record_copy = Some((ticket, alone.unwrap_or(0)));
        }
    }

    /// A late copy of `c`'s grant record reaches etcd: the same put of every key of its hold,
    /// guarded by their create revision and (but with [`Bug::RecordByCreateOnly`]) by their
    /// versions: it lands only over the record alone; all or nothing, as one transaction.
    pub(crate) fn late_record(&self, s: &mut State, c: u8) {
        let (ticket, alone) = s.clients[c as usize]
            .record_copy
            .take()
            .expect("a copy in flight");
        let by_create = self.spec.bug == Some(Bug::RecordByCreateOnly);
        let locks = || self.spec.clients[c as usize].locks();
        let applies = locks().all(|l| s.key(l, ticket).is_some_and(|k| by_create || k.modrev == alone));
        if applies {
            locks().for_each(|l| self.record_in(s, l, ticket));
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

/// A mutex of two holders, each acquiring once, every grant record of which may land once
/// more, late; one yield request, ended at its deadline if not released; a fault.
fn late_records(name: &'static str, bug: Option<Bug>) -> Spec {
    Spec {
        late_records: true,
        clients: vec![C::new(0, 0), C::new(1, 0)],
        pods: 2,
        ..holders(name, bug)
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
            spec: late_records("yield requests, late records", None),
            about: "two holders, each grant record applied once more, late (a copy the hedge \
                    sent): guarded by the entry's version (at most its enqueue and a handoff), the \
                    copy lands at most over the record alone, so a yield request written in \
                    between stays (issue #54, F2)",
            expect: HOLDS,
        },
        Run {
            spec: late_records(
                "bug: a yield request erased by a late record",
                Some(Bug::RecordByCreateOnly),
            ),
            about: "the record guarded by its key's create revision only (the engine before \
                    F2): its late copy erases the yield request, and the hold is never ended",
            expect: Expect::Finds(KEPT),
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
