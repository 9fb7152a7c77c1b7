//! etcd rebuilt under the locks: wiped and started again empty, or restored from a snapshot
//! taken earlier, and the operator's answer. It publishes a lock's settings again under a token
//! epoch chosen by the operator's own rule (`podlock::lock::protocol::epoch`), and a bump
//! removes the lock's queue in the same transaction; it mirrors the queue's holders into the status; the sidecars' orphan sweep
//! removes keys no acquire tracks (a restore brings back keys of acquires long over).

use podlock::lock::protocol::epoch;

use crate::model::{Action, Protocol};
use crate::props::{FENCING, FLOOR, VIEWS, WINDOW};
use crate::runs::{Expect, HOLDS, Run, spec};
use crate::spec::ClientSpec as C;
use crate::spec::{Bug, EpochRule, Rebuild, Spec};
use crate::state::{Key, Lock, Rev, Snapshot, State, Status, Token};

impl Protocol {
    /// The steps of etcd's rebuild and of the operator's answer possible now.
    pub fn rebuild_steps(&self, s: &State, out: &mut Vec<Action>) {
        let r = s.rebuilt.as_deref().expect("a run that rebuilds etcd");
        if r.left > 0 {
            out.push(match (self.spec.rebuild, &r.snapshot) {
                (Some(Rebuild::Wipe), _) => Action::Wipe,
                (_, None) => Action::Snapshot,
                (Some(Rebuild::WipeThenRestore), Some(_)) if r.left == 2 => Action::Wipe,
                (_, Some(_)) => Action::Restore,
            });
        }
        for (l, (lock, status)) in s.locks.iter().zip(&r.status).enumerate() {
            let l = l as u8;
            // After the wipe: a wipe while the DistributedLock is gone, or before its new
            // object's first publish, leaves nothing to remember its tokens by (etcd and the
            // status both lost), which no rule can help (docs/design.md, Fencing).
            if self.spec.recreate && !r.recreated && r.left == 0 && lock.modrev != 0 {
                out.push(Action::Recreate(l));
            }
            let epoch = self.epoch_for(lock, status, s.etcd);
            if lock.modrev == 0 || status.unreconciled || epoch != lock.epoch {
                out.push(Action::Republish(l, None));
            }
            if lock.modrev == 0 {
                let cached = (s.clients.iter()).map(|c| c.cache.modrev);
                let coincide = cached.enumerate().filter(|&(_, r)| r > s.etcd);
                out.extend(coincide.map(|(c, _)| Action::Republish(l, Some(c as u8))));
            }
            if self.spec.status_lag && behind(lock, status) {
                out.push(Action::Mirror(l));
            }
            let untracked = lock.queue.iter().filter(|k| !self.tracked(s, l, k));
            out.extend(untracked.map(|k| Action::Sweep(l, k.create)));
        }
        if self.spec.two_publishers {
            self.other_steps(s, out);
        }
    }

    /// Takes the rebuild step `action`.
    pub fn rebuild_step(&self, s: &mut State, action: Action) {
        match action {
            Action::Wipe => {
                s.rebuilt().left -= 1;
                for lock in &mut s.locks {
                    (lock.modrev, lock.epoch, lock.queue, lock.retired) = (0, 0, vec![], false);
                }
                s.pods.iter_mut().for_each(|p| p.lease = false);
                s.etcd = 0;
                watches_break(s);
            }
            Action::Snapshot => s.rebuilt().snapshot = Some(snapshot(s)),
            Action::Restore => self.restore(s),
            Action::Republish(l, coincide) => self.publish_by(s, 0, l, coincide),
            Action::Mirror(l) => {
                let lock = s.locks[l as usize].clone();
                mirror(&lock, &mut s.rebuilt().status[l as usize]);
            }
            Action::OtherPublish => self.publish_by(s, 1, 0, None),
            Action::OtherMirror => {
                let lock = s.locks[0].clone();
                mirror(&lock, &mut s.rebuilt().other);
            }
            Action::Sweep(l, create) => drop(s.delete(l, create)),
            Action::Recreate(l) => self.recreate(s, l),
            _ => unreachable!("{action:?} is no rebuild step"),
        }
    }

    /// The epoch the operator's rule publishes `lock` (whose status is `status`) under, etcd
    /// being at revision `etcd`.
    pub fn epoch_for(&self, lock: &Lock, status: &Status, etcd: Rev) -> u8 {
        // etcd has neither the settings nor an epoch kept at the lock's removal.
        let gone = lock.modrev == 0 && !lock.retired;
        let went_back = (lock.epoch, etcd) < status.token;
        match self.spec.epoch_rule {
            EpochRule::Off => lock.epoch,
            EpochRule::StatusToken if (gone && status.token != (0, 0)) || (!gone && went_back) => {
                status.token.0 + 1
            }
            EpochRule::StatusToken if gone => 0,
            EpochRule::StatusToken => lock.epoch,
            // A DistributedLock created anew knows no epoch: the one etcd has, else 0 (a new lock).
            EpochRule::WriteAhead => {
                let found = (!gone).then_some(u32::from(lock.epoch));
                let choice = epoch::choose(status.known(), found, (i64::from(etcd), status.returned));
                u8::try_from(choice.expect("few epochs").epoch).expect("a model's epoch")
            }
        }
    }

    /// The reconcile of lock `l` by the operator of cluster `c`: the epoch its rule chooses is
    /// written into its status first, then the settings (with the queue removed) into etcd,
    /// if the publisher rule lets it ([`Protocol::may_publish`]).
    pub(crate) fn publish_by(&self, s: &mut State, c: u8, l: u8, coincide: Option<u8>) {
        let status = *s.rebuilt().status_of(c, l);
        let lock = &s.locks[l as usize];
        let epoch = self.epoch_for(lock, &status, s.etcd);
        let renew = lock.modrev != 0 && epoch != lock.epoch;
        let publish = (lock.modrev == 0 || renew) && self.may_publish(lock, c, renew);
        let r = s.rebuilt();
        // An operator that knows the tokens fell has reconciled: the window is over.
        r.reused &= !renew;
        let status = r.status_of(c, l);
        (status.unreconciled, status.returned) = (false, false);
        if !publish {
            return;
        }
        (status.epoch, status.fresh) = (status.epoch.max(epoch), false);
        let rev = match coincide {
            Some(c) => {
                s.etcd = s.clients[c as usize].cache.modrev;
                s.etcd
            }
            None => s.next_rev(),
        };
        self.note_published(s.rebuilt(), c, epoch);
        let lock = &mut s.locks[l as usize];
        (lock.modrev, lock.epoch, lock.retired, lock.publisher) = (rev, epoch, false, c);
        if self.spec.bug != Some(Bug::BumpKeepsQueue) {
            lock.queue.clear();
        }
    }

    /// etcd comes back with the snapshot's settings and queues, and the leases it had that
    /// are still their pods' sessions (a key on any other lease is gone: no one keeps it
    /// alive); its revision is the snapshot's, or above every earlier one if bumped.
    fn restore(&self, s: &mut State) {
        let r = s.rebuilt();
        let snap = r.snapshot.take().expect("a snapshot");
        r.left -= 1;
        r.status.iter_mut().for_each(|st| st.unreconciled = true);
        for (p, pod) in s.pods.iter_mut().enumerate() {
            pod.lease &= snap.leases[p] == Some(pod.session);
        }
        let live = |s: &State, k: &Key| {
            let pod = &s.pods[self.owners[k.owner as usize] as usize];
            pod.lease && pod.session == k.session
        };
        let noticed = self.spec.bug != Some(Bug::ReturnedUndetected);
        for (l, (max, modrev, epoch, queue, retired)) in snap.locks.into_iter().enumerate() {
            let queue: Vec<Key> = queue.into_iter().filter(|k| live(s, k)).collect();
            // The operator's watch saw every key of the queue before the restore: one it had
            // seen end (any other) came back.
            let before = &s.locks[l].queue;
            let back = queue.iter().any(|k| !before.iter().any(|b| b.create == k.create));
            s.rebuilt.as_deref_mut().expect("rebuilt").status[l].returned = back && noticed;
            let lock = &mut s.locks[l];
            (lock.max, lock.modrev, lock.epoch, lock.queue) = (max, modrev, epoch, queue);
            lock.retired = retired;
        }
        s.etcd = match self.spec.rebuild {
            Some(Rebuild::Restore { bump_revision: true } | Rebuild::WipeThenRestore) => Rev::MAX,
            _ => snap.etcd,
        };
        watches_break(s);
    }

    /// The DistributedLock of lock `l` deleted and created again: its settings and queue
    /// removed in one transaction that keeps its epoch (with [`Bug::DeleteForgetsEpoch`], the
    /// epoch goes too), and an empty status.
    fn recreate(&self, s: &mut State, l: u8) {
        let forget = self.spec.bug == Some(Bug::DeleteForgetsEpoch);
        let lock = &mut s.locks[l as usize];
        (lock.modrev, lock.queue) = (0, vec![]);
        lock.retired = lock.epoch > 0 && !forget;
        if forget {
            lock.epoch = 0;
        }
        let r = s.rebuilt();
        r.recreated = true;
        r.status[l as usize] = Status {
            fresh: true,
            ..Status::default()
        };
    }

    /// Whether `key`'s owner still tracks it: an acquire or hold of it, or a removal.
    fn tracked(&self, s: &State, l: u8, key: &Key) -> bool {
        let owner = &s.clients[key.owner as usize];
        self.spec.clients[key.owner as usize].lock == l
            && (owner.ticket() == Some(key.create) || owner.removals.contains(&key.create))
    }
}

/// What a snapshot of etcd holds now.
fn snapshot(s: &State) -> Snapshot {
    Snapshot {
        locks: (s.locks.iter())
            .map(|l| (l.max, l.modrev, l.epoch, l.queue.clone(), l.retired))
            .collect(),
        leases: s.pods.iter().map(|p| p.lease.then_some(p.session)).collect(),
        etcd: s.etcd,
    }
}

/// The highest token among the lock's holders as the operator reads them (the first
/// `maxHolders` keys: the rebuild runs have exclusive holders only).
fn mirrored(lock: &Lock) -> Token {
    let holders = lock.queue.iter().take(lock.max as usize);
    holders.map(Key::token).max().unwrap_or((0, 0))
}

/// Whether a mirror of `lock` would raise `status`: a holder's token above it, or settings in
/// etcd under an epoch above its own (another cluster's).
pub(crate) fn behind(lock: &Lock, status: &Status) -> bool {
    mirrored(lock) > status.token || (lock.modrev != 0 && lock.epoch > status.epoch)
}

/// The operator mirrors `lock` into `status`: its holders' highest token, and the settings'
/// epoch (never lowering either).
fn mirror(lock: &Lock, status: &mut Status) {
    status.token = status.token.max(mirrored(lock));
    if lock.modrev != 0 {
        status.epoch = status.epoch.max(lock.epoch);
    }
}

/// etcd went away under every watch: each waiter reads again.
fn watches_break(s: &mut State) {
    for c in &mut s.clients {
        if let crate::state::Phase::Waiting(w) = &mut c.phase {
            w.at = 0;
        }
    }
}

/// A run `name` in which etcd is rebuilt (`rebuild`) under a lock two pods take in turn, the
/// operator choosing epochs by `epoch_rule`, its status behind etcd if `status_lag`.
pub(crate) fn rebuilt(
    name: &'static str,
    rebuild: Rebuild,
    epoch_rule: EpochRule,
    status_lag: bool,
    bug: Option<Bug>,
) -> Spec {
    Spec {
        rebuild: Some(rebuild),
        epoch_rule,
        status_lag,
        bug,
        faults: 0,
        ..spec(
            name,
            vec![1],
            vec![vec![]],
            vec![C::new(0, 0).acquires(2), C::new(1, 0)],
        )
    }
}

/// etcd wiped, or restored from an earlier snapshot, under a lock two pods take in turn, and
/// the operator publishing the lock again (docs/operations.md, "Backup and restore"); then the
/// rule's parts taken away, each of which the checker must find missing.
pub fn runs() -> Vec<Run> {
    let (wipe, bumped) = (Rebuild::Wipe, Rebuild::Restore { bump_revision: true });
    let restore = Rebuild::Restore { bump_revision: false };
    let older = Rebuild::WipeThenRestore;
    let rule = EpochRule::WriteAhead;
    vec![
        Run {
            spec: rebuilt("etcd wiped", wipe, rule, true, None),
            about: "etcd wiped and started again empty; the operator publishes the lock again \
                    under a new epoch (its status behind etcd)",
            expect: HOLDS,
        },
        Run {
            spec: rebuilt("etcd restored with --bump-revision", bumped, rule, true, None),
            about: "etcd restored from an earlier snapshot, its revisions bumped past every earlier \
                    one: the keys of holds released after the snapshot come back, and the \
                    operator, which had seen them end, moves the lock to a new epoch (finding 2 \
                    of the edges review); until its reconcile the views name them",
            expect: HOLDS,
        },
        Run {
            spec: rebuilt(
                "bug: returned keys undetected",
                bumped,
                rule,
                true,
                Some(Bug::ReturnedUndetected),
            ),
            about: "the same, the operator not noticing the keys that came back (the engine before \
                    finding 2's fix): every view names a released hold until the orphan sweep",
            expect: Expect::Fails(&[VIEWS]),
        },
        Run {
            spec: rebuilt("etcd wiped, then restored from before", older, rule, true, None),
            about: "etcd wiped (the operator moves the lock to epoch 1), then restored with \
                    --bump-revision from a snapshot taken before the wipe: the settings come back \
                    under epoch 0 (#54 F11). A sidecar that saw epoch 1 answers 503 until the \
                    operator publishes the lock anew; one that has not may grant under epoch 0 \
                    until then, below earlier tokens (the restore window)",
            expect: Expect::Fails(&[WINDOW]),
        },
        Run {
            spec: rebuilt("bug: no epoch floor", older, rule, true, Some(Bug::NoEpochFloor)),
            about: "the same, a sidecar taking settings under a lower epoch than it saw (the \
                    engine before F11's fix): it grants below its own earlier tokens",
            expect: Expect::Finds(FLOOR),
        },
        Run {
            spec: rebuilt(
                "etcd restored without --bump-revision",
                restore,
                rule,
                false,
                None,
            ),
            about: "etcd restored from an earlier snapshot without a bump: the operator, its status \
                    current, sees the revision went back and bumps the epoch; grants before it \
                    reconciles can go below earlier tokens (the views name released holds brought \
                    back until then too: the restore window)",
            expect: Expect::Fails(&[WINDOW]),
        },
        Run {
            spec: rebuilt(
                "etcd restored without --bump-revision, status behind",
                restore,
                rule,
                true,
                None,
            ),
            about: "the same, with the operator's status behind etcd: grants made after the snapshot \
                    that never reached the status go undetected",
            expect: Expect::Fails(&[FENCING, WINDOW]),
        },
        Run {
            spec: Spec {
                recreate: true,
                ..rebuilt(
                    "etcd wiped, lock deleted and created again",
                    wipe,
                    rule,
                    true,
                    None,
                )
            },
            about: "etcd wiped, then the DistributedLock deleted and created again: its removal \
                    keeps its epoch in etcd, the new object's status is empty, and the operator \
                    publishes it under the kept epoch",
            expect: HOLDS,
        },
        Run {
            spec: Spec {
                recreate: true,
                ..rebuilt(
                    "bug: deletion forgets the epoch",
                    wipe,
                    rule,
                    true,
                    Some(Bug::DeleteForgetsEpoch),
                )
            },
            about: "the removal takes the epoch with the settings (finding 1 of the edges review): \
                    the lock created again after a wipe moved it to epoch 1 is published under 0",
            expect: Expect::Finds(FENCING),
        },
        Run {
            spec: rebuilt("bug: no epoch", wipe, EpochRule::Off, true, None),
            about: "the lock published again after a wipe with the epoch it had (none)",
            expect: Expect::Finds(FENCING),
        },
        Run {
            spec: rebuilt(
                "bug: epoch from the status token",
                wipe,
                EpochRule::StatusToken,
                true,
                None,
            ),
            about: "the new epoch taken from status.fencingToken alone, which lags etcd",
            expect: Expect::Finds(FENCING),
        },
        Run {
            spec: rebuilt(
                "bug: guard by revision",
                wipe,
                rule,
                true,
                Some(Bug::GuardByRevision),
            ),
            about: "the enqueue's guard compares the settings' mod revision, which the new etcd can repeat",
            expect: Expect::Finds(FENCING),
        },
        Run {
            spec: rebuilt("bug: restore not detected", restore, EpochRule::Off, false, None),
            about: "the operator does not compare etcd's revision with status.fencingToken",
            expect: Expect::Finds(FENCING),
        },
        Run {
            spec: rebuilt(
                "bug: bump keeps the queue",
                restore,
                rule,
                false,
                Some(Bug::BumpKeepsQueue),
            ),
            about: "the epoch bumped, but keys enqueued under the old one left in the queue",
            expect: Expect::Finds(FENCING),
        },
    ]
}
