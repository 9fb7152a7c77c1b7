//! Releases sent again (issue #40, finding 3): the hedge (`src/lock/etcd/mod.rs`) sends a release
//! once more when its first copy goes unanswered for 500 ms. If that first copy was applied
//! and only its answer was late, the copy sent again finds the key gone. Only a *receipt*
//! tells that from a hold that ended otherwise (its lease, an administrator, the operator):
//! the release's transaction, as it deletes the key, puts the key's create revision at
//! `/podlock/v1/queue/{ns}/.released/{lock}/{lease}`, bound to the lease; a copy that finds the
//! key gone reads it in the same transaction (`src/lock/txn/handoff.rs`, `txn/multi_lock.rs`).
//!
//! The receipt lies at a slot of its lock and lease that no other release of the sidecar in
//! flight uses (`src/lock/engine/receipts.rs`): the smallest free one, so a receipt is written
//! over only by a release that started after the one that put it was answered. It goes with
//! its lease, so a release whose session ended before its answer answers `lost` (the sidecar
//! then starts a new session in any case). One receipt per lock and lease, as first built
//! ([`Bug::ReceiptPerLease`]), let another holder id of the same pod overwrite it within the
//! hedge: a release that succeeded was answered `lost` (issue #54, F5). (A multi-lock release
//! takes one slot, the smallest free in each of its locks; the engine takes each lock's own.)

use crate::model::Protocol;
use crate::runs::{HOLDS, Run, spec};
use crate::spec::{Bug, ClientSpec as C, Spec};
use crate::state::{Broken, Phase, Rev, State};

/// A release receipt: the key a release of a session deleted in a lock, at its slot, bound to
/// the session's lease (`/podlock/v1/queue/{ns}/.released/{lock}/{lease}/{slot}` in the
/// engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Receipt {
    /// The pod whose sidecar released.
    pub pod: u8,
    /// Its session (lease): the receipt goes with the lease.
    pub session: u8,
    /// Its slot.
    pub slot: u8,
    /// The create revision of the key the release deleted.
    pub ticket: Rev,
}

/// Safety: a release answers `released` only if its own copy deleted its key (never for a hold
/// that ended otherwise), and answers `lost` for a key its own copy deleted only when its
/// receipt could not last: its lease ended.
pub const ANSWERS: &str = "answers: a release answers what its own copy did";

/// Reached: a copy sent again answered `released` for its first copy's deletion.
pub const RESENT_OWN: &str = "a resent release finds its own deletion";

impl Protocol {
    /// The first copy of `c`'s release is applied: hands the lock on or deletes its keys, and
    /// with them writes the receipts at `slot` ([`Protocol::receipt_slot`]). Returns whether it
    /// deleted every key of the hold.
    pub(crate) fn release_copy(
        &self,
        s: &mut State,
        c: u8,
        (ticket, session, slot): (Rev, u8, u8),
        chain: &[Rev],
    ) -> bool {
        let own = self.hand_on(s, c, ticket, chain) || self.delete_all(s, c, ticket);
        if own && self.spec.resent_releases {
            let pod = self.owners[c as usize];
            for l in self.spec.clients[c as usize].locks() {
                let receipts = &mut s.locks[l as usize].receipts;
                receipts.retain(|r| (r.pod, r.session, r.slot) != (pod, session, slot));
                receipts.push(Receipt {
                    pod,
                    session,
                    slot,
                    ticket,
                });
                receipts.sort_unstable_by_key(|r| (r.pod, r.session, r.slot));
            }
        }
        own
    }

    /// The slot of a release of `c` now: the smallest that no other release of its sidecar
    /// still waiting for its answer uses in any of its locks (0 with [`Bug::ReceiptPerLease`]).
    pub(crate) fn receipt_slot(&self, s: &State, c: u8) -> u8 {
        if !self.spec.resent_releases || self.spec.bug == Some(Bug::ReceiptPerLease) {
            return 0;
        }
        let pod = self.owners[c as usize];
        let shares = |d: usize| {
            let mine = self.spec.clients[c as usize].locks();
            d != c as usize
                && self.owners[d] == pod
                && mine
                    .into_iter()
                    .any(|l| self.spec.clients[d].locks().any(|x| x == l))
        };
        let taken: Vec<u8> = (s.clients.iter().enumerate())
            .filter(|&(d, _)| shares(d))
            .filter_map(|(_, client)| match client.phase {
                Phase::Releasing { slot, .. } => Some(slot),
                _ => None,
            })
            .collect();
        (0..).find(|n| !taken.contains(n)).expect("a free slot")
    }

    /// The copy sent again answers `c`'s release: its keys are gone (the first copy deleted
    /// them, or something else had), so it answers by the receipts at its slot, which must name
    /// `ticket` in every lock of the hold. The answer is judged against what the first copy did.
    pub(crate) fn resend(&self, s: &mut State, c: u8, phase: Phase) {
        let Phase::Releasing {
            ticket,
            session,
            own,
            slot,
        } = phase
        else {
            unreachable!("no release to answer");
        };
        let pod = self.owners[c as usize];
        let receipted = |l: u8| {
            s.locks[l as usize].receipts.contains(&Receipt {
                pod,
                session,
                slot,
                ticket,
            })
        };
        let released = match self.spec.bug {
            Some(Bug::ReceiptIgnored) => false,
            Some(Bug::GoneIsReleased) => true,
            _ => self.spec.clients[c as usize].locks().all(receipted),
        };
        let p = &s.pods[pod as usize];
        let lasted = p.lease && p.session == session;
        if released && !own || !released && own && lasted {
            s.broken.get_or_insert(Broken::ReleaseAnswer);
        }
        s.resent_own |= released && own;
        s.clients[c as usize].phase = Phase::Idle;
    }

    /// The phase after a release whose first copy did `own`: its answer lost, waiting for the
    /// copy sent again, in a run with resent releases; else done.
    pub(crate) fn after_release(&self, (ticket, session, slot): (Rev, u8, u8), own: bool) -> Phase {
        match self.spec.resent_releases {
            true => Phase::Releasing {
                ticket,
                session,
                own,
                slot,
            },
            false => Phase::Idle,
        }
    }
}

/// The runs of resent releases: a mutex with two clients in one pod (two holder ids of one
/// sidecar, each release with a receipt slot of its own) and one in another, direct handoff, a
/// fault and an administrator's force release.
pub fn runs() -> Vec<Run> {
    let resent = |name, bug| Spec {
        resent_releases: true,
        releases: 1,
        bug,
        ..spec(
            name,
            vec![1],
            vec![vec![]],
            vec![C::new(0, 0).acquires(2), C::new(1, 0), C::new(0, 0).connection()],
        )
    };
    vec![
        Run {
            spec: resent("resent releases", None),
            about: "every release's answer lost after its first copy applied, the copy sent again \
                    answering by the release receipt; two clients of one pod, each release at a receipt slot of its own; a fault \
                    and a force release end holds otherwise",
            expect: HOLDS,
        },
        Run {
            spec: resent("bug: one receipt per lock and lease", Some(Bug::ReceiptPerLease)),
            about: "the two holder ids of one pod share one receipt (the engine before issue \
                    #54's F5): one's release, applied and waiting for its answer, has its receipt \
                    overwritten by the other's, and is answered lost",
            expect: crate::runs::Expect::Finds(ANSWERS),
        },
        Run {
            spec: resent("bug: release receipt ignored", Some(Bug::ReceiptIgnored)),
            about: "the copy sent again answers lost whenever the key is gone (finding 3)",
            expect: crate::runs::Expect::Finds(ANSWERS),
        },
        Run {
            spec: resent("bug: a gone key counts as released", Some(Bug::GoneIsReleased)),
            about: "the copy sent again answers released whenever the key is gone: a hold ended \
                    by its lease or an administrator is called released",
            expect: crate::runs::Expect::Finds(ANSWERS),
        },
    ]
}
