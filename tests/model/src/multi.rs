//! Multi-lock acquires (docs/design.md, "Several locks at once"): a client that takes two
//! locks as one puts a key in each queue in one transaction, so both keys have one create
//! revision: one place in a single global order, and one fencing token for both. It holds once
//! the rule admits it on every lock, and records its grant (`acquiredAt`) on all its keys
//! together only then, so the keys behind it in either queue wait for it as for any grant not
//! yet recorded. It watches, in each lock where it is not admitted yet, what the rule says to
//! watch there. Its release and its giving up delete every key; no release hands it a grant
//! and it hands none on (direct handoff stays single-lock). A lost key of either lock ends the
//! hold.
//!
//! Why no cycle of waiters can form: a key waits only for keys with lower create revisions, in
//! every queue, and revisions are totally ordered. Waiting for all keys of a request at once
//! (rather than taking the locks one by one) is what makes that order global.

use crate::client::new_key;
use crate::decide::{check_grant, decide, hold};
use crate::model::Protocol;
use crate::model::Step;
use crate::runs::{HOLDS, Run, spec};
use crate::spec::{Bug, ClientSpec as C, Spec};
use crate::state::{Cached, Key, Phase, Record, Rev, State, Wait};

/// Where a multi-lock set's wait on one of its locks stands: the engine waits for its turn on
/// every lock at once, each lock read at a revision of its own (`multi::wait_set`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SetTurn {
    /// The lock.
    pub lock: u8,
    /// The revision of the last read of this lock.
    pub at: Rev,
    /// What that read found.
    pub turn: Turn,
}

/// What a set's last read of one lock found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Turn {
    /// Nothing yet: a read is due (after the enqueue, changed settings or a failed record).
    ToRead,
    /// Not admitted: it waits on what the rule said to watch there (the wait's `wakes` of this
    /// lock).
    Waits,
    /// Admitted, under these settings, which the set's record is guarded by.
    Admitted(Cached),
}

impl Protocol {
    /// The settings `c` cached of `lock`.
    fn cached(&self, s: &State, c: u8, lock: u8) -> Cached {
        let me = &s.clients[c as usize];
        match lock == self.spec.clients[c as usize].lock {
            true => me.cache,
            false => me.also_cache.expect("a multi-lock client"),
        }
    }

    /// Takes etcd's settings of `lock` into `c`'s cache.
    fn take_settings(&self, s: &mut State, c: u8, lock: u8) {
        let now = Cached::of(&s.locks[lock as usize]);
        let first = lock == self.spec.clients[c as usize].lock;
        let me = &mut s.clients[c as usize];
        match first {
            true => me.cache = now,
            false => me.also_cache = Some(now),
        }
    }

    /// The locks of `c` whose settings changed since it cached them (or that are not
    /// declared): the enqueue's and the read's guards, one per lock.
    fn stale(&self, s: &State, c: u8) -> Vec<u8> {
        (self.spec.clients[c as usize].locks())
            .filter(|&l| !self.guard_holds(&self.cached(s, c, l), &s.locks[l as usize]))
            .collect()
    }

    /// The multi-lock enqueue transaction: every lock's settings guard; a key of the same
    /// holder id in the way removed first; else a key in every queue, one revision for all.
    pub fn enqueue_multi(&self, s: &mut State, c: u8) {
        let (spec, pod) = (self.spec.clients[c as usize], self.owners[c as usize]);
        let p = &mut s.pods[pod as usize];
        if !p.lease {
            (p.session, p.lease) = (p.session + 1, true);
            return;
        }
        let session = p.session;
        let stale = self.stale(s, c);
        if !stale.is_empty() {
            for &l in &stale {
                self.take_settings(s, c, l);
            }
            if stale.iter().any(|&l| s.locks[l as usize].modrev == 0) {
                s.clients[c as usize].phase = Phase::Idle; // not found
            }
            return;
        }
        let holder = s.clients[c as usize].holder;
        let mine = |k: &&Key| k.owner == c && k.session == session && k.holder == holder;
        let old = spec
            .locks()
            .find_map(|l| s.locks[l as usize].queue.iter().find(mine).map(|k| k.create));
        if let Some(old) = old {
            s.clients[c as usize].phase = Phase::Requeue { old };
            return;
        }
        let ticket = s.next_rev();
        for l in spec.locks() {
            let epoch = self.cached(s, c, l).epoch;
            let key = new_key((c, session, holder), epoch, ticket, false);
            s.locks[l as usize].queue.push(key);
        }
        self.wait_set(s, c, ticket);
    }

    /// Waits for the set's turn on every lock, each read on its own ([`Protocol::read_lock`]),
    /// as the engine does after its enqueue (`multi::wait_set`).
    fn wait_set(&self, s: &mut State, c: u8, ticket: Rev) {
        let at = s.etcd;
        let turns = (self.spec.clients[c as usize].locks())
            .map(|lock| SetTurn {
                lock,
                at,
                turn: Turn::ToRead,
            })
            .collect();
        s.clients[c as usize].phase = Phase::Waiting(Wait {
            ticket,
            at,
            wakes: vec![],
            behind: None,
            turns,
        });
    }

    /// The steps of a set's wait: a read of each lock not admitted yet (woken by an event
    /// there, a due read, or a broken watch), and the record once admitted on every lock.
    pub fn set_steps(&self, s: &State, w: &Wait, can: &mut impl FnMut(Step)) {
        for t in w.turns.iter().filter(|t| !matches!(t.turn, Turn::Admitted(_))) {
            can(match self.woken_in(s, w, t) {
                true => Step::WakeLock(t.lock),
                false => Step::RewatchLock(t.lock),
            });
        }
        if w.turns.iter().all(|t| matches!(t.turn, Turn::Admitted(_))) {
            can(Step::SetRecord);
        }
    }

    /// Whether something the set's wait watches in `t`'s lock changed since it read that lock:
    /// a watched key deleted (or written, if watched for any change), its own key deleted, or
    /// the settings; or a read is due.
    fn woken_in(&self, s: &State, w: &Wait, t: &SetTurn) -> bool {
        let changed = |create, any: bool| match s.key(t.lock, create) {
            None => true,
            Some(k) => any && k.modrev > t.at,
        };
        let l = &s.locks[t.lock as usize];
        let watched = (w.wakes.iter()).any(|&(lock, create, any)| lock == t.lock && changed(create, any));
        t.turn == Turn::ToRead
            || watched
            || s.key(t.lock, w.ticket).is_none()
            || l.modrev == 0
            || l.modrev > t.at
    }

    /// The set's position read of one lock: its key, the settings and the keys ahead there, in
    /// one transaction. A key gone fails the acquire (the others are removed in the background);
    /// changed settings are taken and the lock read again; admitted, the set notes the settings
    /// its turn was decided under; else it watches what the rule says there.
    pub fn read_lock(&self, s: &mut State, c: u8, mut w: Wait, lock: u8) {
        let i = w
            .turns
            .iter()
            .position(|t| t.lock == lock)
            .expect("a lock of the set");
        w.wakes.retain(|&(l, _, _)| l != lock);
        w.turns[i] = SetTurn {
            lock,
            at: s.etcd,
            turn: Turn::ToRead,
        };
        let declared = s.locks[lock as usize].modrev != 0;
        if s.key(lock, w.ticket).is_none() || !declared {
            return self.fail_set(s, c, w.ticket);
        }
        let cached = self.cached(s, c, lock);
        if !self.guard_holds(&cached, &s.locks[lock as usize]) {
            self.take_settings(s, c, lock);
        } else {
            match decide(self, s, (lock, w.ticket), cached.max) {
                Ok(()) => {
                    if self.spec.bug == Some(Bug::MultiRecordsEarly) {
                        self.record_in(s, lock, w.ticket);
                    }
                    w.turns[i].turn = Turn::Admitted(cached);
                }
                Err(None) => unreachable!("a set's keys ask one permit, which every lock has"),
                Err(Some(wait)) => {
                    w.turns[i].turn = Turn::Waits;
                    w.wakes.extend(wait.wakes);
                }
            }
        }
        s.clients[c as usize].phase = Phase::Waiting(w);
    }

    /// The set's grant: `acquiredAt` on every key in one transaction, guarded by every key and
    /// by each lock's settings as its turn was decided (`set::record`). Only then does it hold.
    /// A key gone fails the acquire; changed settings send it back to every lock's read.
    pub fn set_record(&self, s: &mut State, c: u8, w: Wait) {
        let spec = self.spec.clients[c as usize];
        if spec.locks().any(|l| s.key(l, w.ticket).is_none()) {
            return self.fail_set(s, c, w.ticket);
        }
        let guarded = self.spec.bug != Some(Bug::SetRecordUnguarded);
        let unchanged = (w.turns.iter()).all(|t| match t.turn {
            Turn::Admitted(cached) => !guarded || self.guard_holds(&cached, &s.locks[t.lock as usize]),
            _ => unreachable!("recorded before admitted on {}", t.lock),
        });
        if !unchanged {
            spec.locks().for_each(|l| self.take_settings(s, c, l));
            return self.wait_set(s, c, w.ticket);
        }
        spec.locks().for_each(|l| check_grant(self, s, (c, l), w.ticket));
        spec.locks().for_each(|l| self.record_in(s, l, w.ticket));
        // Guarded by the keys' mod revisions being their create revisions: no copy lands after.
        self.send_record_copy(s, c, w.ticket, None);
        hold(self, s, c, w.ticket, vec![]);
        if let Phase::Holding { recorded, .. } = &mut s.clients[c as usize].phase {
            *recorded = true;
        }
    }

    /// The set's acquire fails: its keys are removed in the background.
    fn fail_set(&self, s: &mut State, c: u8, ticket: Rev) {
        let me = &mut s.clients[c as usize];
        me.phase = Phase::Idle;
        me.removals.push(ticket);
        me.removals.sort_unstable();
    }

    /// A holder's grant record (`acquiredAt`): on every key of its hold, in one transaction
    /// guarded by their create revisions (none written if one is gone: the hold is lost).
    pub fn record(&self, s: &mut State, c: u8, ticket: Rev) {
        let mut locks = self.spec.clients[c as usize].locks();
        if locks.all(|l| s.key(l, ticket).is_some()) {
            self.spec.clients[c as usize]
                .locks()
                .for_each(|l| self.record_in(s, l, ticket));
        }
    }

    pub(crate) fn record_in(&self, s: &mut State, lock: u8, ticket: Rev) {
        let rev = s.next_rev();
        let key = s.key_mut(lock, ticket).expect("in place");
        // A put of the owner's entry: whatever else was written into it is gone.
        (key.record, key.modrev, key.next, key.yielding) = (Record::Own, rev, vec![], false);
    }

    /// Deletes `c`'s keys of create revision `ticket` in every lock it takes, in one
    /// transaction (each guarded by create revision); returns whether every one was still there.
    pub fn delete_all(&self, s: &mut State, c: u8, ticket: Rev) -> bool {
        // Every key goes, whether or not one before it was there (no short cut).
        let deleted: Vec<bool> = self.spec.clients[c as usize]
            .locks()
            .map(|l| s.delete(l, ticket))
            .collect();
        deleted.into_iter().all(|d| d)
    }
}

/// Two locks: c0 takes both (lock 0 then 1), c1 both in the other order, c2 lock 0 alone
/// (twice), and with `fourth` c3 lock 0 alone too.
fn crossed(name: &'static str, max: [u8; 2], bug: Option<Bug>, fourth: bool) -> Spec {
    // With the fourth client the third acquires once: two single-lock writers still hand the
    // lock on, and the state space stays within CI's time.
    let third = C::new(2, 0).acquires(if fourth { 1 } else { 2 });
    let mut clients = vec![C::new(0, 0).and(1), C::new(1, 1).and(0), third];
    clients.extend(fourth.then(|| C::new(3, 0)));
    Spec {
        bug,
        ..spec(name, max.to_vec(), vec![vec![], vec![]], clients)
    }
}

/// The crossed sets on a semaphore of 2 (lock 0) lowered to 1, without the fourth client.
fn lowered(name: &'static str, bug: Option<Bug>) -> Spec {
    Spec {
        changes: vec![vec![1], vec![]],
        faults: 0,
        ..crossed(name, [2, 1], bug, false)
    }
}

/// The runs of multi-lock acquires.
pub fn runs() -> Vec<Run> {
    vec![
        Run {
            spec: Spec {
                faults: 0,
                ..crossed("multi-lock", [1, 1], None, true)
            },
            about: "two clients take two mutexes as one, in opposite orders, two more take one \
                    of them alone (direct handoff among them); no fault (the runs below have \
                    them)",
            expect: HOLDS,
        },
        Run {
            spec: crossed("multi-lock, semaphore", [2, 1], None, false),
            about: "lock 0 a semaphore of 2, without the fourth client: a multi-lock waiter \
                    admitted on it keeps its place while it waits for the mutex",
            expect: HOLDS,
        },
        Run {
            spec: Spec {
                lock_deletion: true,
                ..crossed("multi-lock, a lock deleted", [2, 1], None, false)
            },
            about: "lock 0 a semaphore of 2, the mutex deleted (and declared again) as the fault: \
                    a waiting set's key in the deleted lock goes with it, and its other key is \
                    removed in the background",
            expect: HOLDS,
        },
        Run {
            spec: Spec {
                releases: 1,
                faults: 0,
                ..crossed("multi-lock, force release", [2, 1], None, false)
            },
            about: "the same locks, an administrator's force release instead of the fault: it may \
                    end a set's key in one lock (the set then loses both) but never picks a set \
                    key that holds nothing yet",
            expect: HOLDS,
        },
        Run {
            spec: lowered("multi-lock, semaphore lowered", None),
            about: "lock 0 a semaphore of 2 lowered to 1 while sets wait: a set admitted on it \
                    under 2 records its grant only under the settings its turn was decided under",
            expect: HOLDS,
        },
        Run {
            spec: lowered("bug: multi-lock record unguarded", Some(Bug::SetRecordUnguarded)),
            about: "the same, the set's record not guarded by the settings: a set admitted on the \
                    semaphore under 2 holds after the lowering, beyond the new limit",
            expect: crate::runs::Expect::Finds(crate::props::LIMIT),
        },
        Run {
            spec: crossed(
                "bug: multi-lock records early",
                [2, 1],
                Some(Bug::MultiRecordsEarly),
                false,
            ),
            about: "a multi-lock waiter records its grant on a lock as soon as it is admitted \
                    there: a key behind it on the semaphore is let in first, with a higher token",
            expect: crate::runs::Expect::Finds(crate::props::FENCING),
        },
    ]
}

/// Reached: a client holds two locks as one.
pub const HELD: &str = "a client holds two locks as one";

/// Whether a multi-lock client holds.
pub fn held(m: &Protocol, s: &State) -> bool {
    (s.clients.iter().enumerate())
        .any(|(c, client)| m.spec.clients[c].also.is_some() && matches!(client.phase, Phase::Holding { .. }))
}
