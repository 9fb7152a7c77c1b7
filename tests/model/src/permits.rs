//! Weighted permits (`permits`, docs/api.md): a hold of a semaphore may take several of its
//! slots. The queue's rule (`podlock::lock::protocol`) admits an exclusive key once its permits
//! and those of the keys ahead of it fit in `maxHolders`, every key ahead granted: so grants
//! still follow the queue, and a request that does not fit is not passed by a smaller one
//! behind it (the fairness etcd's and Redisson's fair semaphores chose: no large request is
//! starved by a stream of small ones). A release hands its slot on only to a successor asking
//! no more permits than it held: the keys ahead of the successor are some of those that were
//! ahead of the holder when it was granted, so the successor fits where the holder did.
//!
//! The limit property ([`crate::props::LIMIT`]) weighs each holder by its permits; fencing
//! ([`crate::props::FENCING`]: tokens rise in grant order) is the queue order, which a smaller
//! request granted past a larger one breaks once the larger one is granted.

use crate::decide::live_holders;
use crate::model::Protocol;
use crate::props::{FENCING, LIMIT};
use crate::runs::{Expect, HOLDS, Run, spec};
use crate::spec::{Bug, ClientSpec as C, Spec};
use crate::state::{Phase, State};

/// Reached: a hold of several permits beside another hold.
pub const WEIGHTED: &str = "a hold of several permits beside another hold";
/// Reached: a request waits behind a larger one that does not fit, though it would fit itself.
pub const NOT_PASSED: &str = "a small request waits behind a large one that does not fit";

impl Protocol {
    /// How many permits `c`'s holds take.
    pub fn permits(&self, c: u8) -> u8 {
        self.spec.clients[c as usize].permits
    }

    /// The permits the holders of `lock` whose keys are in place take.
    pub fn taken(&self, s: &State, lock: u8) -> u32 {
        live_holders(self, s, lock)
            .map(|c| u32::from(self.permits(c)))
            .sum()
    }
}

/// Whether [`WEIGHTED`] is reached in `s`.
pub fn weighted(m: &Protocol, s: &State) -> bool {
    (0..s.locks.len() as u8).any(|l| {
        let holders: Vec<u8> = live_holders(m, s, l).collect();
        holders.len() >= 2 && holders.iter().any(|&c| m.permits(c) > 1)
    })
}

/// Whether [`NOT_PASSED`] is reached in `s`: in some lock, a waiting key whose permits do not
/// fit beside the holders', and behind it a waiting key whose permits would.
pub fn not_passed(m: &Protocol, s: &State) -> bool {
    let waits = |c: u8, key| matches!(&s.clients[c as usize].phase, Phase::Waiting(w) if w.ticket == key);
    (0..s.locks.len() as u8).any(|l| {
        let (taken, max) = (m.taken(s, l), u32::from(s.locks[l as usize].max));
        let fits = |c: u8| taken + u32::from(m.permits(c)) <= max;
        let waiting: Vec<u8> = (s.locks[l as usize].queue.iter())
            .filter(|k| waits(k.owner, k.create))
            .map(|k| k.owner)
            .collect();
        let first_too_large = waiting.iter().position(|&c| !fits(c));
        first_too_large.is_some_and(|i| waiting[i + 1..].iter().any(|&c| fits(c)))
    })
}

/// A semaphore of 3 whose clients ask for 2, 1 and 2 permits, lowered to 2 (below a hold of 2
/// and one of 1), a fault.
fn semaphore(name: &'static str, bug: Option<Bug>) -> Spec {
    let clients = vec![C::new(0, 0).permits(2), C::new(1, 0), C::new(2, 0).permits(2)];
    Spec {
        bug,
        ..spec(name, vec![3], vec![vec![2]], clients)
    }
}

/// The runs of weighted permits.
pub fn runs() -> Vec<Run> {
    let stream = vec![
        C::new(0, 0).permits(2),
        C::new(1, 0).acquires(2).heartbeat(),
        C::new(2, 0).permits(3),
    ];
    vec![
        Run {
            spec: semaphore("permits, semaphore", None),
            about: "a semaphore of 3 whose clients ask for 2, 1 and 2 permits, lowered to 2 under \
                    them, a fault: the holders' permits never exceed the maxHolders in force, a \
                    request that does not fit is not passed, slots handed on only to requests no \
                    larger",
            expect: HOLDS,
        },
        Run {
            spec: spec("permits, a whole semaphore", vec![3], vec![vec![1, 3]], stream),
            about: "requests of 2 and of all 3 permits beside a client of 1 that acquires twice \
                    (a stream of small requests), maxHolders lowered to 1 (below every waiting \
                    request of more) and raised again, a fault: a request of all the slots is \
                    let in once they are free",
            expect: HOLDS,
        },
        Run {
            spec: semaphore("bug: permits counted as one", Some(Bug::CountNotWeight)),
            about: "the rule counts keys, not their permits: a request of 2 is let in beside a \
                    hold of 2",
            expect: Expect::Finds(LIMIT),
        },
        Run {
            spec: semaphore(
                "bug: permits ignored by a handoff",
                Some(Bug::HandoffIgnoresPermits),
            ),
            about: "a hold of 1 hands its slot on to a request of 2 behind it",
            expect: Expect::Finds(LIMIT),
        },
        Run {
            spec: semaphore(
                "bug: permits let a smaller request pass",
                Some(Bug::SmallerPasses),
            ),
            about: "a request that fits beside the holders is let in past a waiting one ahead \
                    of it that does not: a large request could wait for ever",
            expect: Expect::Finds(FENCING),
        },
    ]
}
