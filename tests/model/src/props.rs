//! What the model checks. Safety properties are Stateright `always` properties; `sometimes`
//! properties show that the interesting states are reached at all. The liveness properties
//! are checked by [`crate::liveness`] on the whole state graph (see there why).

use stateright::Property;

use crate::decide::{admissible, decide, live_holders, named};
use crate::model::Protocol;
use crate::state::{Broken, Phase, Record, State};

/// Safety: a grant never makes more holders than the `maxHolders` in force.
pub const LIMIT: &str = "limit: no grant beyond the maxHolders in force";
/// Safety: shared and exclusive holders never hold together.
pub const MODES: &str = "modes: no exclusive holder beside a shared one";
/// Safety: fencing tokens rise in grant order, across etcd wipes and restores (once the
/// operator has reconciled a restored etcd).
pub const FENCING: &str = "fencing: tokens rise in grant order, across etcd wipes and restores";
/// Safety: no grant between a restore and the operator's reconcile of it goes below an
/// earlier token.
pub const WINDOW: &str = "restore window: tokens rise before the operator reconciles a restored etcd";
/// Safety: a sidecar that has seen a lock's settings under a token epoch grants nothing under
/// a lower one (issue #54, F11), etcd restored from an older snapshot included.
pub const FLOOR: &str = "epoch floor: no grant under an epoch below one its sidecar has seen";
/// Safety: no grant goes below an earlier token while a lock's epoch is one published again by
/// a cluster whose status had not learned it ([`crate::publishers`]).
pub const REUSE: &str = "cross-cluster window: tokens rise under an epoch a lagging cluster published again";
/// A `sometimes` property of the runs that rebuild etcd.
pub const REGRANTED: &str = "a grant after etcd's rebuild";
/// A `sometimes` property of the runs that delete and create a lock again.
pub const RECREATED: &str = "a grant under a kept epoch after the lock was created again";
/// Safety: a client that believes it holds has its key in place, or can learn it is gone.
pub const BELIEF: &str = "belief: a holder's key is in place, or it learns it is gone";

/// Safety: the holders every view names (status, `GET`, the holder Service, the fence check,
/// a force release: one rule, [`named`]) are exactly the clients that hold: each key named is
/// a holder's, a waiter's its next read lets in (or a release handed the grant), or a key its
/// sidecar is removing; and every holder whose key is in place is named, but for the moment
/// between a grant decided and its record when a lowered `maxHolders` left it outside the
/// rule's window (a fence check then refuses it: never the wrong way round), and a holder
/// about to learn it lost (a key of its multi-lock set is gone).
pub const VIEWS: &str = "views: the holders every view names are the clients that hold";

/// Reached: a release wrote the grant of the key behind it (direct handoff).
const HANDED: &str = "a grant handed on by a release";

/// Reached: a semaphore's holder handed its slot to the key behind it.
const HANDED_SLOT: &str = "a semaphore's slot handed on by a release";

/// Reached: an administrator's force release ended a hold its client believed it had.
const RELEASED: &str = "a holder released by an administrator";

/// The Stateright properties.
pub fn properties() -> Vec<Property<Protocol>> {
    vec![
        Property::always(LIMIT, |_, s: &State| s.broken != Some(Broken::Limit)),
        Property::always(FENCING, |_, s: &State| s.broken != Some(Broken::TokenOrder)),
        Property::always(WINDOW, |_, s: &State| {
            !s.rebuilt.as_ref().is_some_and(|r| r.window_broken)
        }),
        Property::always(FLOOR, |_, s: &State| {
            !s.rebuilt.as_ref().is_some_and(|r| r.floor_broken)
        }),
        Property::always(REUSE, |_, s: &State| {
            !s.rebuilt.as_ref().is_some_and(|r| r.reuse_broken)
        }),
        Property::always(MODES, |m, s: &State| {
            (0..s.locks.len() as u8).all(|l| modes_apart(m, s, l))
        }),
        Property::always(VIEWS, |m, s: &State| {
            (0..s.locks.len() as u8).all(|l| views_true(m, s, l))
        }),
        Property::always(BELIEF, |m, s: &State| {
            (0..s.clients.len() as u8).all(|c| believes_truly(m, s, c))
        }),
        Property::sometimes("shared holders together", |m, s: &State| together(m, s, true)),
        Property::sometimes("exclusive holders together", |m, s| together(m, s, false)),
        Property::sometimes("holders beyond a lowered maxHolders", |m, s: &State| {
            (s.locks.iter().enumerate()).any(|(l, lock)| m.taken(s, l as u8) > lock.max.into())
        }),
        Property::sometimes("a holder outlives its key", |m, s: &State| {
            (0..s.clients.len() as u8).any(|c| outlived(m, s, c))
        }),
        Property::sometimes("a holder id meets its own old key", |_, s: &State| {
            (s.clients.iter()).any(|c| matches!(c.phase, Phase::Requeue { .. }))
        }),
        Property::sometimes("a key recorded on behalf", |_, s: &State| {
            (s.locks.iter().flat_map(|l| &l.queue)).any(|k| k.record == Record::Behalf)
        }),
        Property::sometimes(RELEASED, |_, s: &State| s.released_holder),
        Property::sometimes(HANDED, |_, s: &State| {
            (s.locks.iter().flat_map(|l| &l.queue)).any(|k| k.record == Record::Handed)
        }),
        Property::sometimes(HANDED_SLOT, |_, s: &State| {
            (s.locks.iter()).any(|l| l.max > 1 && l.queue.iter().any(|k| k.record == Record::Handed))
        }),
        Property::always(crate::clusters::OWN, |_, s: &State| {
            s.broken != Some(Broken::LiveRevoked)
        }),
        Property::sometimes(crate::clusters::REVOKED, |_, s: &State| s.revoked),
        Property::sometimes(crate::multi::HELD, crate::multi::held),
        Property::sometimes(REGRANTED, |_, s: &State| {
            s.rebuilt.as_ref().is_some_and(|r| r.granted_after)
        }),
        Property::sometimes(RECREATED, |_, s: &State| {
            s.rebuilt.as_ref().is_some_and(|r| r.granted_recreated)
        }),
        Property::sometimes(LANDED, |_, s: &State| s.late_landed),
        Property::always(crate::resend::ANSWERS, |_, s: &State| {
            s.broken != Some(Broken::ReleaseAnswer)
        }),
        Property::sometimes(crate::resend::RESENT_OWN, |_, s: &State| s.resent_own),
        Property::always(crate::deadline::OWN_HOLD, |_, s: &State| {
            s.broken != Some(Broken::DeadlineOther)
        }),
        Property::sometimes(crate::deadline::BY_SIDECAR, |_, s: &State| s.deadline_ended.0),
        Property::sometimes(crate::deadline::BY_OPERATOR, |_, s: &State| s.deadline_ended.1),
        Property::always(crate::yielding::KEPT, |_, s: &State| crate::yielding::kept(s)),
        Property::sometimes(crate::yielding::YIELDED, |_, s: &State| s.yields.yielded),
        Property::sometimes(crate::permits::WEIGHTED, crate::permits::weighted),
        Property::sometimes(crate::permits::NOT_PASSED, crate::permits::not_passed),
    ]
}

/// Example: a late copy of an enqueue put its key back after it had left the queue.
pub const LANDED: &str = "a late copy of an enqueue lands";

/// The `sometimes` properties a configuration must reach, by its features.
pub fn examples(model: &Protocol) -> Vec<&'static str> {
    let spec = &model.spec;
    // A key vanishes under its holder only by a fault, a force release, a deadline or etcd's
    // rebuild.
    let vanish = spec.faults > 0 || spec.releases > 0 || spec.deadlines > 0 || spec.rebuild.is_some();
    let mut out: Vec<&'static str> = vanish
        .then_some("a holder outlives its key")
        .into_iter()
        .collect();
    let max = |l: usize| {
        spec.changes[l]
            .iter()
            .chain([&spec.max_holders[l]])
            .copied()
            .max()
    };
    let count = |l: usize, shared: bool| {
        (spec.clients.iter())
            .filter(|c| c.lock as usize == l && c.shared == shared)
            .count()
    };
    let locks = 0..spec.max_holders.len();
    if locks.clone().any(|l| count(l, true) >= 2) {
        out.push("shared holders together");
    }
    if locks.clone().any(|l| count(l, false) >= 2 && max(l) >= Some(2)) {
        out.push("exclusive holders together");
    }
    let lowered = |l: usize| {
        let seq: Vec<_> = [spec.max_holders[l]]
            .into_iter()
            .chain(spec.changes[l].iter().copied())
            .collect();
        seq.windows(2).any(|w| w[1] < w[0]) && count(l, false) >= 2
    };
    if locks.clone().any(lowered) {
        out.push("holders beyond a lowered maxHolders");
    }
    if (spec.clients.iter()).any(|c| c.acquires > 1 && c.heartbeat && !c.connection) {
        out.push("a holder id meets its own old key");
    }
    if spec.on_behalf != crate::spec::OnBehalf::Off {
        out.push("a key recorded on behalf");
    }
    if spec.releases > 0 {
        out.push(RELEASED);
    }
    if spec.late_copies {
        out.push(LANDED);
    }
    if spec.resent_releases {
        out.push(crate::resend::RESENT_OWN);
    }
    // Grants are handed on among single-lock writers only.
    let single = |l: usize| {
        let writer = |c: &&crate::spec::ClientSpec| c.lock as usize == l && !c.shared && c.also.is_none();
        spec.clients.iter().filter(writer).count()
    };
    let mutex = |l: usize| spec.max_holders[l] == 1 && single(l) >= 2;
    if spec.handoff != crate::spec::Handoff::Off && locks.clone().any(mutex) {
        out.push(HANDED);
    }
    let semaphore = |l: usize| spec.max_holders[l] > 1 && spec.changes[l].is_empty() && count(l, false) >= 3;
    if spec.handoff != crate::spec::Handoff::Off && locks.clone().any(semaphore) {
        out.push(HANDED_SLOT);
    }
    if spec.rebuild.is_some() {
        out.push(REGRANTED);
    }
    if spec.recreate {
        out.push(RECREATED);
    }
    if !spec.clusters.is_empty() {
        out.push(crate::clusters::REVOKED);
    }
    if spec.clients.iter().any(|c| c.also.is_some()) {
        out.push(crate::multi::HELD);
    }
    if spec.clients.iter().any(|c| c.deadline) {
        out.push(crate::deadline::BY_SIDECAR);
    }
    if spec.deadlines > 0 {
        out.push(crate::deadline::BY_OPERATOR);
    }
    if spec.yields > 0 {
        out.push(crate::yielding::YIELDED);
    }
    if spec.clients.iter().any(|c| c.permits > 1) {
        out.extend([crate::permits::WEIGHTED, crate::permits::NOT_PASSED]);
    }
    out
}

fn together(m: &Protocol, s: &State, shared: bool) -> bool {
    (0..s.locks.len() as u8).any(|l| {
        let of_mode = live_holders(m, s, l).filter(|&c| m.spec.clients[c as usize].shared == shared);
        of_mode.count() >= 2
    })
}

fn modes_apart(m: &Protocol, s: &State, lock: u8) -> bool {
    let shared: Vec<_> = live_holders(m, s, lock)
        .map(|c| m.spec.clients[c as usize].shared)
        .collect();
    !(shared.contains(&true) && shared.contains(&false))
}

fn views_true(m: &Protocol, s: &State, lock: u8) -> bool {
    let l = &s.locks[lock as usize];
    if l.modrev == 0 {
        return true; // undeclared: every view answers no holders
    }
    let named = named(m, s, lock);
    // Between a restore that brought keys back and the operator's reconcile of it, the views
    // name a brought-back key although nobody holds it, and may miss a holder behind it (the
    // restore window; the reconcile moves the lock to a new epoch, which ends them all).
    let window = (s.rebuilt.as_ref()).is_some_and(|r| {
        let status = &r.status[lock as usize];
        status.unreconciled && status.returned
    });
    if window {
        return true;
    }
    let sound = named.iter().all(|k| {
        let owner = &s.clients[k.owner as usize];
        // A key handed its grant holds: its waiter learns it from the write if that is still
        // news to it (it wakes on it), or else from its next read, if its read takes a handed
        // grant (issue #54, F10: a read after a broken watch, or after the settings changed).
        let handed = k.record == Record::Handed;
        let lets_in = |news: bool| {
            (handed && (news || m.reads_handed())) || decide(m, s, (lock, k.create), l.max).is_ok()
        };
        match owner.phase {
            Phase::Holding { ticket, .. } if ticket == k.create => true,
            Phase::Waiting(ref w) if w.ticket == k.create => lets_in(k.modrev > w.at),
            Phase::Reading { ticket } if ticket == k.create => lets_in(false),
            Phase::Requeue { old } if old == k.create => true,
            _ => owner.removals.contains(&k.create),
        }
    });
    // A holder a key of whose hold is gone (a multi-lock set's other key) is about to learn
    // it lost: it may go unnamed.
    let complete = live_holders(m, s, lock).all(|c| {
        let Phase::Holding { ticket, recorded, .. } = s.clients[c as usize].phase else {
            return true;
        };
        let key = s.key(lock, ticket).expect("a live holder's key");
        let window = !recorded && key.record == Record::No;
        named.iter().any(|k| k.create == ticket) || window || outlived(m, s, c)
    });
    sound && complete
}

fn believes_truly(m: &Protocol, s: &State, c: u8) -> bool {
    !m.alive(s, c) || !holding(s, c) || !outlived(m, s, c) || m.learns(s, c)
}

fn holding(s: &State, c: u8) -> bool {
    matches!(s.clients[c as usize].phase, Phase::Holding { .. })
}

/// Whether `c` believes it holds but a key of its hold is gone.
fn outlived(m: &Protocol, s: &State, c: u8) -> bool {
    let mut locks = m.spec.clients[c as usize].locks();
    match s.clients[c as usize].phase {
        Phase::Holding { ticket, .. } => locks.any(|lock| s.key(lock, ticket).is_none()),
        _ => false,
    }
}

/// Whether `c` is in an acquire: enqueueing, waiting or reading its position.
fn waiting(s: &State, c: u8) -> bool {
    let phase = &s.clients[c as usize].phase;
    !matches!(
        phase,
        Phase::Idle | Phase::Holding { .. } | Phase::Releasing { .. }
    )
}

/// A liveness property, per client: from every reachable state where the premise holds, a
/// state where the goal holds is reachable by good steps alone.
pub struct Liveness {
    /// Its name.
    pub name: &'static str,
    /// Whether holders may leave on the way (else the goal must come without a release).
    pub leaving: bool,
    /// When it must come.
    pub premise: fn(&Protocol, &State, u8) -> bool,
    /// What must come.
    pub goal: fn(&Protocol, &State, u8) -> bool,
}

/// Liveness: a waiter is granted once the holders ahead leave (or learns its key is gone).
pub const GRANTED: &str = "granted: a waiter is let in once the holders ahead leave";
/// Liveness: a waiter the rule admits is let in without waiting for anyone else to leave: no
/// wake-up is lost.
pub const ADMITTED: &str = "admitted: a waiter the rule admits is let in without another release";
/// Liveness: a holder whose key is gone learns it.
pub const TOLD: &str = "told: a holder whose key is gone learns it";
/// Liveness: no key is left behind: every queue can drain.
pub const DRAINS: &str = "drains: once clients stop, every queue empties";

/// The liveness properties.
pub fn liveness() -> Vec<Liveness> {
    vec![
        Liveness {
            name: GRANTED,
            leaving: true,
            premise: |m, s, c| m.alive(s, c) && waiting(s, c),
            goal: |_, s, c| !waiting(s, c),
        },
        Liveness {
            name: ADMITTED,
            leaving: false,
            premise: |m, s, c| m.alive(s, c) && admissible(m, s, c),
            goal: |_, s, c| !waiting(s, c),
        },
        Liveness {
            name: TOLD,
            leaving: true,
            premise: |m, s, c| m.alive(s, c) && outlived(m, s, c),
            goal: |_, s, c| !holding(s, c),
        },
        Liveness {
            name: DRAINS,
            leaving: true,
            premise: |_, _, c| c == 0,
            goal: |m, s, _| {
                let idle = (0..s.clients.len() as u8)
                    .all(|c| !m.alive(s, c) || s.clients[c as usize].phase == Phase::Idle);
                idle && s.locks.iter().all(|l| l.queue.is_empty())
            },
        },
    ]
}
