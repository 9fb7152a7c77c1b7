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
use crate::runs::{HOLDS, Run, spec};
use crate::spec::{Bug, ClientSpec as C, Spec};
use crate::state::{Cached, Key, Phase, Record, Rev, State, Wait};

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
        self.place_multi(s, c, ticket);
    }

    /// The multi-lock position read: its keys, the settings and the keys ahead in every lock,
    /// in one transaction. A key gone fails the acquire (the others are removed in the
    /// background).
    pub fn read_multi(&self, s: &mut State, c: u8, ticket: Rev) {
        let mut locks = self.spec.clients[c as usize].locks();
        if locks.any(|l| s.key(l, ticket).is_none()) {
            let me = &mut s.clients[c as usize];
            me.phase = Phase::Idle;
            me.removals.push(ticket);
            me.removals.sort_unstable();
            return;
        }
        let stale = self.stale(s, c);
        if !stale.is_empty() {
            stale.into_iter().for_each(|l| self.take_settings(s, c, l));
            s.clients[c as usize].phase = Phase::Reading { ticket };
            return;
        }
        self.place_multi(s, c, ticket);
    }

    /// Acts on where a read placed `ticket` in every lock: holds if admitted on all, else
    /// waits on what the rule says to watch in each lock where it is not.
    fn place_multi(&self, s: &mut State, c: u8, ticket: Rev) {
        let spec = self.spec.clients[c as usize];
        let mut wakes = vec![];
        for l in spec.locks() {
            match decide(self, s, (l, ticket), self.cached(s, c, l).max) {
                Ok(()) if self.spec.bug == Some(Bug::MultiRecordsEarly) => self.record_in(s, l, ticket),
                Ok(()) => {}
                Err(wait) => wakes.extend(wait.wakes),
            }
        }
        if wakes.is_empty() {
            spec.locks().for_each(|l| check_grant(self, s, (c, l), ticket));
            return hold(self, s, c, ticket, vec![]);
        }
        let at = s.etcd;
        s.clients[c as usize].phase = Phase::Waiting(Wait {
            ticket,
            at,
            wakes,
            behind: None,
        });
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

    fn record_in(&self, s: &mut State, lock: u8, ticket: Rev) {
        let rev = s.next_rev();
        let key = s.key_mut(lock, ticket).expect("in place");
        (key.record, key.modrev, key.next) = (Record::Own, rev, vec![]);
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
    let mut clients = vec![C::new(0, 0).and(1), C::new(1, 1).and(0), C::new(2, 0).acquires(2)];
    clients.extend(fourth.then(|| C::new(3, 0)));
    Spec {
        bug,
        ..spec(name, max.to_vec(), vec![vec![], vec![]], clients)
    }
}

/// The runs of multi-lock acquires.
pub fn runs() -> Vec<Run> {
    vec![
        Run {
            spec: crossed("multi-lock", [1, 1], None, true),
            about: "two clients take two mutexes as one, in opposite orders, two more take one \
                    of them alone (direct handoff among them), a fault",
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
                ..crossed("multi-lock, force release", [2, 1], None, false)
            },
            about: "the same locks, an administrator's force release besides the fault: it may \
                    end a set's key in one lock (the set then loses both) but never picks a set \
                    key that holds nothing yet",
            expect: HOLDS,
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
