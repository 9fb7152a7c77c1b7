//! The configurations checked, and what each must come to.

use crate::props::{ADMITTED, BELIEF, DRAINS, FENCING, GRANTED, LIMIT, MODES, VIEWS};
use crate::spec::{Bug, ClientSpec as C, EpochRule, Handoff, OnBehalf, Spec};

/// What a run must come to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Over the whole state space, exactly these properties fail (none: the protocol holds
    /// here), and every example state of the run's features is reached.
    Fails(&'static [&'static str]),
    /// The checker finds a counterexample to this property (it stops at the first).
    Finds(&'static str),
}

/// Every property holds.
pub(crate) const HOLDS: Expect = Expect::Fails(&[]);

/// One configuration and its expected outcome.
pub struct Run {
    /// The configuration.
    pub spec: Spec,
    /// What it explores, for the report.
    pub about: &'static str,
    /// What it must come to.
    pub expect: Expect,
}

pub(crate) fn spec(name: &'static str, max_holders: Vec<u8>, changes: Vec<Vec<u8>>, clients: Vec<C>) -> Spec {
    Spec {
        name,
        pods: clients.iter().map(|c| c.pod + 1).max().unwrap_or(0),
        max_holders,
        changes,
        clients,
        faults: 1,
        releases: 0,
        deadlines: 0,
        yields: 0,
        lock_deletion: false,
        on_behalf: OnBehalf::Off,
        bug: None,
        rebuild: None,
        recreate: false,
        epoch_rule: EpochRule::WriteAhead,
        late_copies: false,
        resent_releases: false,
        late_records: false,
        status_lag: false,
        two_publishers: false,
        handoff: Handoff::Exclusive,
        clusters: vec![],
    }
}

/// The protocol as it is, on the configurations CI checks.
fn protocol() -> Vec<Run> {
    let late = |name, bug, clients| Spec {
        late_copies: true,
        bug,
        ..spec(name, vec![1], vec![vec![2]], clients)
    };
    let pair = vec![C::new(0, 0).acquires(2), C::new(1, 0)];
    vec![
        Run {
            spec: late(
                "late copies",
                None,
                vec![C::new(0, 0).acquires(2).heartbeat(), C::new(1, 0)],
            ),
            about: "each client's first enqueue applied once more, late (a copy the hedge sent), \
                    after its key left the queue (the same holder id acquiring again meanwhile), \
                    maxHolders raised to 2, a fault: the sidecar's guard removes the copy's key \
                    (src/lock/life/late.rs)",
            expect: HOLDS,
        },
        Run {
            spec: late("bug: late copy unguarded", Some(Bug::LateCopyUnguarded), pair),
            about: "the same with no guard: the copy's key, on a live lease, holds the lock with no \
                    acquire behind it, and the next waiter waits for the orphan sweep",
            expect: Expect::Fails(&[GRANTED, ADMITTED, DRAINS, VIEWS]),
        },
        Run {
            spec: spec(
                "reader-writer",
                vec![1],
                vec![vec![2, 1]],
                vec![
                    C::new(0, 0),
                    C::new(1, 0).shared(),
                    C::new(2, 0).shared().connection(),
                ],
            ),
            about: "maxHolders 1 raised to 2 and lowered again while a writer and two readers queue",
            expect: HOLDS,
        },
        Run {
            spec: spec(
                "semaphore",
                vec![2],
                vec![vec![1, 2]],
                vec![C::new(0, 0), C::new(1, 0), C::new(2, 0)],
            ),
            about: "maxHolders 2 lowered to 1 and raised again while three clients contend",
            expect: HOLDS,
        },
        Run {
            spec: Spec {
                bug: Some(Bug::ReadIgnoresHanded),
                ..spec(
                    "bug: semaphore, a read ignores a handed grant",
                    vec![2],
                    vec![vec![1]],
                    vec![C::new(0, 0), C::new(1, 0), C::new(2, 0)],
                )
            },
            about: "a waiter's position read ignores the grant a release handed its key (the \
                    engine before issue #54's F10): after a handoff and then a lowering to 1, it \
                    waits while every view names it a holder",
            expect: Expect::Finds(VIEWS),
        },
        Run {
            spec: Spec {
                lock_deletion: true,
                ..spec(
                    "holder ids",
                    vec![1],
                    vec![vec![]],
                    vec![
                        C::new(0, 0).heartbeat().acquires(2),
                        C::new(1, 0).connection().acquires(2),
                        C::new(2, 0),
                    ],
                )
            },
            about: "a holder id acquired again before its old key is removed, a new id per connection; the lock deleted",
            expect: HOLDS,
        },
        Run {
            spec: Spec {
                lock_deletion: true,
                ..spec(
                    "two locks",
                    vec![1, 2],
                    vec![vec![2], vec![1]],
                    vec![C::new(0, 0), C::new(1, 0).shared(), C::new(0, 1)],
                )
            },
            about: "a pod with a key in each lock (a lease's end deletes both at once), both locks' \
                    maxHolders changed, a fault",
            expect: HOLDS,
        },
        Run {
            spec: Spec {
                releases: 1,
                ..spec(
                    "force release, semaphore",
                    vec![2],
                    vec![vec![1]],
                    vec![C::new(0, 0), C::new(1, 0), C::new(2, 0).connection()],
                )
            },
            about: "an administrator's force release (the operator reads a holder, then deletes \
                    its key guarded by create revision) besides a fault, maxHolders 2 lowered to 1",
            expect: HOLDS,
        },
        Run {
            spec: Spec {
                releases: 1,
                ..spec(
                    "force release, reader-writer",
                    vec![1],
                    vec![vec![2]],
                    vec![
                        C::new(0, 0),
                        C::new(1, 0).shared(),
                        C::new(2, 0).shared().heartbeat(),
                    ],
                )
            },
            about: "the same among a writer and readers, maxHolders 1 raised to 2",
            expect: HOLDS,
        },
    ]
}

/// Recording the grant of a key ahead whose owner left it unrecorded: as the rejected
/// `record_for` did, and with the owner's forfeit. A semaphore lowered, and a reader-writer lock
/// raised to 2 and lowered again.
fn on_behalf() -> Vec<Run> {
    let three = vec![C::new(0, 0), C::new(1, 0), C::new(2, 0)];
    let semaphore = |name, on_behalf| Spec {
        on_behalf,
        ..spec(name, vec![2], vec![vec![1]], three.clone())
    };
    let readers = vec![C::new(0, 0), C::new(1, 0).shared(), C::new(2, 0).shared()];
    let reader_writer = |name, on_behalf| Spec {
        on_behalf,
        ..spec(name, vec![1], vec![vec![2, 1]], readers.clone())
    };
    vec![
        Run {
            spec: semaphore("on behalf, semaphore", OnBehalf::Plain),
            about: "a waiter records the grant ahead its owner left unrecorded (what queue::record_for did before the model rejected it)",
            expect: Expect::Fails(&[LIMIT, FENCING]),
        },
        Run {
            spec: reader_writer("on behalf, reader-writer", OnBehalf::Plain),
            about: "the same among readers",
            expect: Expect::Fails(&[FENCING]),
        },
        Run {
            spec: semaphore("on behalf with forfeit, semaphore", OnBehalf::Forfeit),
            about: "the same, and an owner that finds its key recorded for it gives it up (and its place)",
            expect: Expect::Fails(&[ADMITTED]),
        },
        Run {
            spec: reader_writer("on behalf with forfeit, reader-writer", OnBehalf::Forfeit),
            about: "the same among readers",
            expect: HOLDS,
        },
    ]
}

/// Direct handoff (docs/design.md): a release writes the grant of the key behind it.
/// The design the engine runs, the reader-run design the model rejects, and the handoff's
/// guards taken away, each of which the checker must find missing.
fn handoff() -> Vec<Run> {
    let three = || vec![C::new(0, 0).acquires(2), C::new(1, 0), C::new(2, 0)];
    let readers = vec![
        C::new(0, 0),
        C::new(1, 0),
        C::new(2, 0).shared(),
        C::new(3, 0).shared(),
    ];
    let bug = |name, bug, max, changes| Spec {
        bug: Some(bug),
        ..spec(name, vec![max], vec![changes], three())
    };
    vec![
        Run {
            spec: spec("handoff, mutex", vec![1], vec![vec![2, 1]], three()),
            about: "releases hand a mutex on along the chain of keys behind them; maxHolders \
                    raised to 2 and lowered again under them, a fault",
            expect: HOLDS,
        },
        Run {
            spec: spec("handoff, semaphore", vec![2], vec![vec![]], three()),
            about: "a semaphore's holders hand their slots on to the keys behind them, a fault",
            expect: HOLDS,
        },
        Run {
            spec: Spec {
                handoff: Handoff::ReaderRun,
                ..spec("handoff to a run of readers", vec![1], vec![vec![]], readers)
            },
            about: "a writer's release grants every reader behind it at once (rejected: the \
                    readers learn their grants in any order, so tokens fall)",
            expect: Expect::Fails(&[FENCING]),
        },
        Run {
            spec: bug("bug: handoff unguarded", Bug::HandoffUnguarded, 2, vec![1]),
            about: "a holder granted under maxHolders 2 hands its slot on after it is lowered \
                    to 1 (no guard on the settings)",
            expect: Expect::Finds(LIMIT),
        },
        Run {
            spec: bug(
                "bug: a handed grant counts as recorded",
                Bug::HandedCountsAsGranted,
                1,
                vec![2],
            ),
            about: "a key behind a handed grant is let in before its owner learns of it",
            expect: Expect::Finds(FENCING),
        },
    ]
}

/// Known bugs, each of which the checker must find.
fn bugs() -> Vec<Run> {
    let bug = |name, bug, max: u8, changes: Vec<u8>, clients| Spec {
        bug: Some(bug),
        ..spec(name, vec![max], vec![changes], clients)
    };
    let three = || vec![C::new(0, 0), C::new(1, 0), C::new(2, 0)];
    vec![
        Run {
            spec: bug(
                "bug: grant past ungranted keys",
                Bug::GrantPastUngranted,
                1,
                vec![2],
                three(),
            ),
            about: "keys ahead count as granted before they record it",
            expect: Expect::Finds(FENCING),
        },
        Run {
            spec: bug(
                "bug: modes ignored",
                Bug::IgnoreModes,
                1,
                vec![2],
                vec![C::new(0, 0).shared(), C::new(1, 0), C::new(2, 0).shared()],
            ),
            about: "keys queued as shared count as exclusive after maxHolders is raised",
            expect: Expect::Finds(MODES),
        },
        Run {
            spec: bug("bug: stale limit", Bug::StaleLimit, 2, vec![1], three()),
            about: "a waiter decides by the maxHolders it read before a lowering",
            expect: Expect::Finds(LIMIT),
        },
        Run {
            spec: bug("bug: no key watch", Bug::NoKeyWatch, 1, vec![], three()),
            about: "a hold does not watch its key, only its session",
            expect: Expect::Finds(BELIEF),
        },
        Run {
            spec: bug(
                "bug: lost wake-up",
                Bug::PredecessorDeletionOnly,
                2,
                vec![],
                vec![C::new(0, 0), C::new(1, 0), C::new(2, 0), C::new(3, 0)],
            ),
            about: "a waiter watches its predecessor in a semaphore for deletion only",
            expect: Expect::Finds(ADMITTED),
        },
        Run {
            spec: bug(
                "bug: views by position",
                Bug::ViewsByPosition,
                2,
                vec![1],
                three(),
            ),
            about: "status, GET and a force release count holders by position (the rule before \
                    the one rule of who holds): a hold granted before maxHolders 2 was lowered \
                    to 1 goes unnamed",
            expect: Expect::Finds(VIEWS),
        },
    ]
}

/// Every run, in order.
pub fn runs() -> Vec<Run> {
    let more = [
        crate::multi::runs(),
        crate::clusters::runs(),
        crate::resend::runs(),
        crate::publishers::runs(),
        crate::deadline::runs(),
        crate::yielding::runs(),
        crate::permits::runs(),
    ];
    [protocol(), handoff(), on_behalf(), bugs(), crate::rebuild::runs()]
        .into_iter()
        .chain(more)
        .flatten()
        .collect()
}
