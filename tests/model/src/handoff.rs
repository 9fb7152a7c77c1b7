//! Direct handoff's release (see [`Handoff`]), by the engine's own rule
//! (`podlock::lock::protocol::handoff`): to whom a release may hand its grant ([`may_hand`]),
//! and the guards its transaction checks ([`GUARDS`]), each checked here against the state.
//! The bug runs change what the rule is given, or drop a guard; they never write a rule of
//! their own.

use podlock::lock::protocol::handoff::{GUARDS, Guard, Party, may_hand};
use podlock::lock::protocol::{Ask, Mode};

use crate::decide::check_limit;
use crate::model::Protocol;
use crate::spec::{Bug, Handoff};
use crate::state::{Key, Record, Rev, State};

impl Protocol {
    /// The release transaction of direct handoff: if `c` may hand on to the first key of its
    /// chain and every guard holds, deletes its key and writes the grant of that key (or, with
    /// [`Handoff::ReaderRun`], of the run of readers it starts), passing on the rest of the
    /// chain; returns whether it did (else the release is the plain guarded delete).
    pub(crate) fn hand_on(&self, s: &mut State, c: u8, ticket: Rev, chain: &[Rev]) -> bool {
        let lock = self.spec.clients[c as usize].lock;
        if self.spec.handoff == Handoff::Off || chain.is_empty() {
            return false;
        }
        let Some(first) = s.key(lock, chain[0]).cloned() else {
            return false;
        };
        let reader_run = self.reader_run(c, &first);
        let rule = reader_run || may_hand(self.party(c), self.successor(first.owner));
        if !rule
            || !GUARDS
                .iter()
                .all(|&g| self.guard_holds_at(s, (c, ticket), &first, g))
        {
            return false;
        }
        let run: Vec<Rev> = match reader_run {
            false => vec![first.create],
            true => (chain.iter())
                .map_while(|r| {
                    s.key(lock, *r)
                        .filter(|k| k.shared && untouched(k))
                        .map(|k| k.create)
                })
                .collect(),
        };
        let rest = if first.shared { vec![] } else { chain[1..].to_vec() };
        s.delete(lock, ticket);
        if !first.shared {
            // The grant is made here, under the limit in force.
            check_limit(self, s, lock, self.permits(first.owner));
        }
        let rev = s.next_rev();
        for create in run {
            let key = s.key_mut(lock, create).expect("untouched");
            (key.record, key.modrev, key.next) = (Record::Handed, rev, rest.clone());
        }
        true
    }

    /// Client `c`'s key as the handoff rule sees it.
    fn party(&self, c: u8) -> Party {
        let spec = self.spec.clients[c as usize];
        let mode = if spec.shared {
            Mode::Shared
        } else {
            Mode::Exclusive
        };
        Party {
            ask: Ask {
                mode,
                permits: u32::from(self.permits(c)),
            },
            set: spec.also.is_some(),
        }
    }

    /// The key of client `c` behind a holder, as the rule is given it: with
    /// [`Bug::HandoffIgnoresPermits`], as if it asked for one permit.
    fn successor(&self, c: u8) -> Party {
        let party = self.party(c);
        match self.spec.bug {
            Some(Bug::HandoffIgnoresPermits) => Party {
                ask: Ask::one(party.ask.mode),
                ..party
            },
            _ => party,
        }
    }

    /// The design the model rejects, [`Handoff::ReaderRun`]: a writer hands its grant to the
    /// run of readers behind it, which the rule refuses.
    fn reader_run(&self, c: u8, first: &Key) -> bool {
        let successor = self.party(first.owner);
        let writer = self.party(c);
        self.spec.handoff == Handoff::ReaderRun
            && first.shared
            && !successor.set
            && may_hand(
                writer,
                Party {
                    ask: Ask::one(Mode::Exclusive),
                    ..successor
                },
            )
    }

    /// Whether `guard` holds for the release of `c`'s key `ticket` handing on to `first`
    /// (the settings guard always, with [`Bug::HandoffUnguarded`]).
    fn guard_holds_at(&self, s: &State, (c, ticket): (u8, Rev), first: &Key, guard: Guard) -> bool {
        let spec = self.spec.clients[c as usize];
        match guard {
            Guard::HolderInPlace => s.key(spec.lock, ticket).is_some(),
            Guard::SettingsUnchanged => {
                let cached = s.clients[c as usize].cache;
                self.spec.bug == Some(Bug::HandoffUnguarded)
                    || self.guard_holds(&cached, &s.locks[spec.lock as usize])
            }
            Guard::SuccessorUntouched => untouched(first),
        }
    }
}

/// Whether `key` is untouched since its enqueue: not enqueued again, not granted.
fn untouched(key: &Key) -> bool {
    key.modrev == key.create
}
