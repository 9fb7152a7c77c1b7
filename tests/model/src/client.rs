//! A client's steps: the engine's acquire (`acquire.rs`, `queue.rs`, `wait.rs`), its hold
//! (`life/monitor.rs`, `life/ending.rs`) and the sidecar's background removals, one etcd request each.

use crate::decide::{decide, grant};
use crate::late::{Late, LateCopy};
use crate::model::{Action, Protocol, Step};
use crate::spec::{Bug, CHAIN, Handoff, OnBehalf};
use crate::state::{Cached, Client, Key, Lock, Name, Phase, Record, Rev, State, Wait};

impl Protocol {
    /// The steps `c` can take now.
    pub fn client_steps(&self, s: &State, c: u8, out: &mut Vec<Action>) {
        let (me, spec) = (&s.clients[c as usize], &self.spec.clients[c as usize]);
        let mut can = |step| out.push(Action::Client(c, step));
        for i in 0..me.removals.len() as u8 {
            can(Step::Removal(i));
        }
        match &me.phase {
            Phase::Idle if me.left > 0 => can(Step::Start),
            Phase::Idle => {}
            Phase::Enqueue => can(Step::Enqueue),
            Phase::Requeue { .. } => can(Step::Requeue),
            Phase::Reading { .. } => can(Step::Read),
            Phase::Waiting(w) if spec.also.is_some() => {
                self.set_steps(s, w, &mut can);
                can(Step::GiveUp);
            }
            Phase::Waiting(w) => {
                // A read woken by an event, or by a broken watch without one. A watch that
                // broke can lose the write that handed the key its grant: then it reads
                // without that event too (issue #54, F10).
                let woken = self.woken(s, c, w);
                can(if woken { Step::Wake } else { Step::Rewatch });
                let handed = s
                    .key(spec.lock, w.ticket)
                    .is_some_and(|k| k.record == Record::Handed);
                if woken && handed {
                    can(Step::Rewatch);
                }
                if w.behind.is_some() && self.spec.on_behalf != OnBehalf::Off {
                    can(Step::OnBehalf);
                }
                can(Step::GiveUp);
            }
            Phase::Holding {
                recorded,
                chain,
                ticket,
                ..
            } => {
                if !recorded {
                    can(Step::Record);
                }
                if chain.is_empty() && self.refills(s, c, *ticket) {
                    can(Step::Refill);
                }
                can(Step::Release);
                if self.learns(s, c) {
                    can(Step::Learn);
                }
                if spec.heartbeat && s.faults > 0 {
                    can(Step::HeartbeatMiss);
                }
                if self.timed(s, c) {
                    can(Step::Deadline);
                }
            }
            Phase::Releasing { .. } => can(Step::Resend),
        }
    }

    /// Whether something `c`'s wait `w` watches changed since its read: a watched key deleted
    /// (or written, if watched for any change, but for a grant handed to it, which lets nobody
    /// behind it in: the engine ignores that event), its own key deleted (or written: a grant
    /// handed on), or the settings key changed; in any of its locks.
    fn woken(&self, s: &State, c: u8, w: &Wait) -> bool {
        let counts =
            |k: &Key| k.record != Record::Handed || self.spec.bug == Some(Bug::HandedCountsAsGranted);
        let changed = |lock, create, any| match s.key(lock, create) {
            None => true,
            Some(k) => any && k.modrev > w.at && (create == w.ticket || counts(k)),
        };
        let settings = |l: &Lock| l.modrev == 0 || l.modrev > w.at;
        let own = |lock| changed(lock, w.ticket, self.spec.handoff != Handoff::Off);
        let mut locks = self.spec.clients[c as usize].locks();
        w.wakes
            .iter()
            .any(|&(lock, create, any)| changed(lock, create, any))
            || locks.any(|lock| own(lock) || settings(&s.locks[lock as usize]))
    }

    /// Whether the exclusive single-lock holder `c` of `ticket` would find keys behind it if it
    /// read them (with handoff on; a read that finds none changes nothing).
    fn refills(&self, s: &State, c: u8, ticket: Rev) -> bool {
        let spec = self.spec.clients[c as usize];
        let lock = &s.locks[spec.lock as usize];
        self.spec.handoff != Handoff::Off
            && !spec.shared
            && spec.also.is_none()
            && lock.queue.iter().any(|k| k.create > ticket)
    }

    /// The holder `c` of `ticket` reads the keys behind it: its chain from now on.
    fn refill(&self, s: &mut State, c: u8, ticket: Rev) {
        let lock = &s.locks[self.spec.clients[c as usize].lock as usize];
        let behind = lock.queue.iter().filter(|k| k.create > ticket);
        let behind: Vec<Rev> = behind.take(CHAIN).map(|k| k.create).collect();
        if let Phase::Holding { chain, .. } = &mut s.clients[c as usize].phase {
            *chain = behind;
        }
    }

    /// Whether the holder `c` can tell that its hold ended: its key is gone (its watch), or
    /// its session's lease is (its keepalives).
    pub fn learns(&self, s: &State, c: u8) -> bool {
        let Phase::Holding { ticket, session, .. } = s.clients[c as usize].phase else {
            return false;
        };
        let pod = &s.pods[self.owners[c as usize] as usize];
        let session_lost = !pod.lease || pod.session != session;
        let mut locks = self.spec.clients[c as usize].locks();
        let key_gone = locks.any(|lock| s.key(lock, ticket).is_none());
        session_lost || (key_gone && self.spec.bug != Some(Bug::NoKeyWatch))
    }

    /// Takes `step` for `c`.
    pub fn client_step(&self, s: &mut State, c: u8, step: Step) {
        let spec = self.spec.clients[c as usize];
        let me = &mut s.clients[c as usize];
        match (step, me.phase.clone()) {
            (Step::Removal(i), _) => {
                let old = me.removals.remove(i as usize);
                self.delete_all(s, c, old);
            }
            (Step::Start, _) => {
                me.left -= 1;
                me.holder += u8::from(spec.connection); // a new holder id per connection
                me.phase = Phase::Enqueue;
                self.enqueue(s, c); // with the settings it cached
            }
            (Step::Enqueue, _) => self.enqueue(s, c),
            (Step::Requeue, Phase::Requeue { old }) => {
                self.delete_all(s, c, old);
                s.clients[c as usize].phase = Phase::Enqueue;
            }
            (Step::Read, Phase::Reading { ticket }) => self.read(s, c, ticket),
            (Step::Refill, Phase::Holding { ticket, .. }) => self.refill(s, c, ticket),
            (Step::Resend, phase) => self.resend(s, c, phase),
            (Step::WakeLock(l) | Step::RewatchLock(l), Phase::Waiting(w)) => self.read_lock(s, c, w, l),
            (Step::SetRecord, Phase::Waiting(w)) => self.set_record(s, c, w),
            (_, Phase::Waiting(w)) => self.waiter_step(s, c, step, w),
            (
                _,
                Phase::Holding {
                    ticket,
                    session,
                    chain,
                    ..
                },
            ) => self.holder_step(s, c, step, (ticket, session), chain),
            (step, phase) => unreachable!("{step:?} in {phase:?}"),
        }
    }

    /// A waiter's step: woken (or not) it reads; it records the grant it waits behind; or its
    /// deadline passes (its connection closes).
    fn waiter_step(&self, s: &mut State, c: u8, step: Step, w: Wait) {
        let spec = self.spec.clients[c as usize];
        let handed = s.key(spec.lock, w.ticket).filter(|k| k.record == Record::Handed);
        let chain = handed.map(|k| k.next.clone());
        let me = &mut s.clients[c as usize];
        match step {
            // Its own key written by the release ahead: granted, with the chain in the entry.
            Step::Wake if let Some(chain) = chain => grant(self, s, (c, spec.lock), w.ticket, chain),
            Step::Wake | Step::Rewatch => self.read(s, c, w.ticket),
            Step::OnBehalf => {
                let settings = me.cache.modrev;
                me.phase = Phase::Reading { ticket: w.ticket };
                record_for(s, spec.lock, w.behind.expect("behind a grant"), settings);
            }
            Step::GiveUp if spec.connection => {
                me.phase = Phase::Idle;
                me.removals.push(w.ticket); // the dropped acquire's guard removes it
                me.removals.sort_unstable();
            }
            Step::GiveUp => {
                me.phase = Phase::Idle;
                self.delete_all(s, c, w.ticket); // leaves the queues before answering
            }
            _ => unreachable!("{step:?} while waiting"),
        }
    }

    /// A holder's step: it records its grant, releases, learns its hold ended, or misses its
    /// heartbeat or reaches its deadline (the sidecar ends the hold, then removes its key in
    /// the background).
    fn holder_step(&self, s: &mut State, c: u8, step: Step, (ticket, session): (Rev, u8), chain: Vec<Rev>) {
        let me = &mut s.clients[c as usize];
        match step {
            Step::Record => {
                me.phase = Phase::Holding {
                    ticket,
                    session,
                    recorded: true,
                    chain,
                };
                let lock = self.spec.clients[c as usize].lock;
                let untouched = s.key(lock, ticket).is_some_and(|k| k.modrev == k.create);
                self.record(s, c, ticket);
                // Its guard (version 2 at most) lets a copy put the record again only while
                // the record is the one write since the enqueue.
                let only_write = s.key(lock, ticket).map(|k| k.modrev).filter(|_| untouched);
                self.send_record_copy(s, c, ticket, only_write);
            }
            Step::Release => {
                self.note_release(s, c, ticket);
                let slot = self.receipt_slot(s, c);
                let own = self.release_copy(s, c, (ticket, session, slot), &chain);
                s.clients[c as usize].phase = self.after_release((ticket, session, slot), own);
            }
            Step::Learn => {
                me.phase = Phase::Idle;
                // A multi-lock hold that lost one key removes the others (in the background).
                if self.spec.clients[c as usize].also.is_some() {
                    me.removals.push(ticket);
                    me.removals.sort_unstable();
                }
            }
            Step::HeartbeatMiss | Step::Deadline => {
                me.phase = Phase::Idle;
                me.removals.push(ticket);
                me.removals.sort_unstable();
                if step == Step::HeartbeatMiss {
                    s.faults -= 1;
                } else {
                    s.deadline_ended.0 = true;
                }
            }
            _ => unreachable!("{step:?} while holding"),
        }
    }

    /// The enqueue transaction. Its lease gone, the sidecar starts a new session; the
    /// settings changed since cached, it takes them (a deleted lock ends the acquire); a key
    /// of the same holder id in the way is removed first; else the key goes in, and the same
    /// transaction's read of the keys ahead decides where it stands.
    fn enqueue(&self, s: &mut State, c: u8) {
        let (spec, pod) = (self.spec.clients[c as usize], self.owners[c as usize]);
        if spec.also.is_some() {
            return self.enqueue_multi(s, c);
        }
        let p = &mut s.pods[pod as usize];
        if !p.lease {
            (p.session, p.lease) = (p.session + 1, true);
            return;
        }
        let session = p.session;
        let l = &s.locks[spec.lock as usize];
        let me = &mut s.clients[c as usize];
        if !self.takes_epoch(me, l) {
            me.phase = Phase::Idle; // 503: the settings went back to an older epoch
            return;
        }
        if !self.guard_holds(&me.cache, l) {
            me.cache = Cached::of(l);
            if l.modrev == 0 {
                me.phase = Phase::Idle; // not found
            }
            return;
        }
        let (holder, max, epoch) = (me.holder, me.cache.max, me.cache.epoch);
        if (spec.shared && max > 1) || spec.permits > max {
            // Refused: shared holds need maxHolders 1, and a hold takes at most every slot.
            me.phase = Phase::Idle;
            return;
        }
        let mine = |k: &&Key| k.owner == c && k.session == session && k.holder == holder;
        if let Some(old) = l.queue.iter().find(mine) {
            me.phase = Phase::Requeue { old: old.create };
            return;
        }
        if me.late == Late::Unsent {
            let cache = me.cache;
            me.late = Late::InFlight(LateCopy {
                session,
                holder,
                cache,
            });
        }
        let ticket = s.next_rev();
        let key = Key {
            timed: self.timed(s, c),
            yielding: false,
            ..new_key((c, session, holder), epoch, ticket, spec.shared)
        };
        s.locks[spec.lock as usize].queue.push(key);
        self.place(s, c, ticket, max);
    }

    /// The position read: its own key, the settings and the keys ahead, in one transaction.
    /// Its own key handed a grant by a release, it holds with the chain that came with it,
    /// whatever the settings and the keys ahead say now (a grant made before a change).
    fn read(&self, s: &mut State, c: u8, ticket: Rev) {
        let lock = self.spec.clients[c as usize].lock;
        let l = &s.locks[lock as usize];
        let me = &mut s.clients[c as usize];
        let Some(key) = l.queue.iter().find(|k| k.create == ticket) else {
            me.phase = Phase::Idle; // its key vanished: the acquire fails
            return;
        };
        if self.reads_handed() && key.record == Record::Handed {
            let chain = key.next.clone();
            return grant(self, s, (c, lock), ticket, chain);
        }
        if self.spec.bug != Some(Bug::StaleLimit) && !self.guard_holds(&me.cache, l) {
            me.cache = Cached::of(l);
            me.phase = Phase::Reading { ticket }; // the settings changed: read again under them
            return;
        }
        if self.spec.on_behalf == OnBehalf::Forfeit && key.record == Record::Behalf {
            me.phase = Phase::Requeue { old: ticket };
            return;
        }
        let max = me.cache.max;
        self.place(s, c, ticket, max);
    }

    /// Whether the sidecar of `me` takes `lock`'s settings as etcd has them now, noting their
    /// epoch as seen: not if they are under a lower token epoch than it has seen the lock
    /// under (issue #54, F11: etcd restored from a snapshot older than that epoch; the
    /// operator publishes the lock anew), but with [`Bug::NoEpochFloor`]. A lock not found
    /// clears the floor, as the engine's cache forgets it.
    fn takes_epoch(&self, me: &mut Client, lock: &Lock) -> bool {
        if lock.modrev == 0 {
            me.seen = 0;
            return true;
        }
        if lock.epoch < me.seen && self.spec.bug != Some(Bug::NoEpochFloor) {
            return false;
        }
        me.seen = me.seen.max(lock.epoch);
        true
    }

    /// Whether a waiter's position read takes a grant handed to its key (but with
    /// [`Bug::ReadIgnoresHanded`]).
    pub fn reads_handed(&self) -> bool {
        self.spec.bug != Some(Bug::ReadIgnoresHanded)
    }

    /// Whether the settings `cached` are those of `lock` in etcd now, as the enqueue's guard
    /// and a waiter's read compare them: by mod revision and value (by mod revision alone
    /// with [`Bug::GuardByRevision`]). A lock that is not declared never matches.
    pub fn guard_holds(&self, cached: &Cached, lock: &Lock) -> bool {
        let by_value = self.spec.bug != Some(Bug::GuardByRevision);
        lock.modrev != 0 && cached.modrev == lock.modrev && (!by_value || *cached == Cached::of(lock))
    }

    /// Acts on where a read placed `ticket`: holds, waits, or leaves the queue refused (it asks
    /// for more permits than `maxHolders` now allows). The read also returns the keys behind
    /// it (a holder's chain).
    fn place(&self, s: &mut State, c: u8, ticket: Rev, max: u8) {
        let lock = self.spec.clients[c as usize].lock;
        match decide(self, s, (lock, ticket), max) {
            Ok(()) => {
                let behind = s.locks[lock as usize].queue.iter().filter(|k| k.create > ticket);
                let chain = match self.spec.handoff {
                    Handoff::Off => vec![],
                    _ => behind.take(CHAIN).map(|k| k.create).collect(),
                };
                grant(self, s, (c, lock), ticket, chain)
            }
            Err(Some(wait)) => s.clients[c as usize].phase = Phase::Waiting(wait),
            Err(None) => {
                s.clients[c as usize].phase = Phase::Idle;
                self.delete_all(s, c, ticket); // leaves the queue before answering
            }
        }
    }
}

/// A new queue key: its owner, session and holder id's generation, the epoch it records, its
/// create revision and its mode; no grant recorded.
pub fn new_key((owner, session, holder): Name, epoch: u8, create: Rev, shared: bool) -> Key {
    Key {
        owner,
        session,
        epoch,
        holder,
        create,
        modrev: create,
        shared,
        record: Record::No,
        next: vec![],
        timed: false,
        yielding: false,
    }
}

/// What `queue::record_for` did (removed from the engine): records the grant of the key named `name` if it is still unrecorded and
/// the settings still have the mod revision the waiter read (its read of the key and the
/// guarded write, which fails if the key changed in between, taken as one step).
fn record_for(s: &mut State, lock: u8, name: Name, settings: Rev) {
    let unchanged = s.locks[lock as usize].modrev == settings;
    if unchanged && s.named(lock, name).is_some_and(|k| k.record == Record::No) {
        let rev = s.next_rev();
        let key = s.named(lock, name).expect("in place");
        key.record = Record::Behalf;
        key.modrev = rev;
    }
}
