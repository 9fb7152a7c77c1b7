//! The world around the clients: leases that end, pods that die, and the operator, which
//! revokes holds, deletes and declares locks and changes their `maxHolders`; an
//! administrator's force release, which the operator reads and applies in two steps; and, in
//! the runs that rebuild it, etcd wiped or restored and the operator publishing the locks again
//! (see [`crate::rebuild`]); a late copy of an enqueue landing (see [`crate::late`]).

use crate::decide::named;
use crate::late::Late;
use crate::model::{Action, Protocol};
use crate::state::{Phase, State};

impl Protocol {
    /// The world's steps possible now.
    pub fn world_steps(&self, s: &State, out: &mut Vec<Action>) {
        let faults = s.faults > 0;
        for (p, pod) in s.pods.iter().enumerate() {
            let p = p as u8;
            if pod.crashed && pod.lease {
                out.push(Action::Expire(p));
            }
            if !pod.crashed && faults {
                out.push(Action::Crash(p));
                if pod.lease {
                    out.push(Action::EndLease(p));
                }
            }
        }
        for (l, lock) in s.locks.iter().enumerate() {
            let l = l as u8;
            if faults {
                out.extend(lock.queue.iter().map(|k| Action::DeleteKey(l, k.create)));
            }
            let declared = lock.modrev != 0;
            if declared && faults && self.spec.lock_deletion {
                out.push(Action::DeleteLock(l));
            }
            if !declared && self.spec.rebuild.is_none() {
                out.push(Action::Declare(l));
            }
            if declared && (lock.changes as usize) < self.spec.changes[l as usize].len() {
                out.push(Action::SetMax(l));
            }
            if declared && s.releases > 0 && s.release.is_none() {
                out.extend(named(self, s, l).iter().map(|k| Action::ReleaseRead(l, k.create)));
            }
        }
        if s.release.is_some() {
            out.push(Action::ReleaseDelete);
        }
        self.deadline_steps(s, out);
        self.yield_steps(s, out);
        for (c, client) in s.clients.iter().enumerate() {
            if let Late::InFlight(_) = client.late {
                out.push(Action::LateCopy(c as u8));
            }
            if client.record_copy.is_some() {
                out.push(Action::LateRecord(c as u8));
            }
        }
        if self.spec.rebuild.is_some() {
            self.rebuild_steps(s, out);
        }
        self.revocations(s, out);
    }

    /// Takes the world's step `action`.
    pub fn world_step(&self, s: &mut State, action: Action) {
        match action {
            Action::Expire(p) => s.end_lease(p, &self.owners),
            Action::EndLease(p) => {
                s.faults -= 1;
                s.end_lease(p, &self.owners);
            }
            Action::Crash(p) => {
                s.faults -= 1;
                s.pods[p as usize].crashed = true;
            }
            Action::DeleteKey(l, create) => {
                s.faults -= 1;
                s.delete(l, create);
            }
            Action::DeleteLock(l) => {
                s.faults -= 1;
                let lock = &mut s.locks[l as usize];
                (lock.modrev, lock.queue) = (0, vec![]);
            }
            Action::Declare(l) => s.locks[l as usize].modrev = s.next_rev(),
            Action::SetMax(l) => {
                let rev = s.next_rev();
                let lock = &mut s.locks[l as usize];
                lock.max = self.spec.changes[l as usize][lock.changes as usize];
                lock.changes += 1;
                lock.modrev = rev;
            }
            Action::ReleaseRead(l, create) => {
                s.releases -= 1;
                s.release = Some((l, create));
            }
            Action::ReleaseDelete => {
                let (l, create) = s.release.take().expect("a release read");
                let believed = (s.clients.iter().enumerate()).any(|(c, client)| {
                    self.spec.clients[c].locks().any(|x| x == l)
                        && matches!(client.phase, Phase::Holding { ticket, .. } if ticket == create)
                });
                if s.delete(l, create) && believed {
                    s.released_holder = true;
                }
            }
            Action::DeadlineRead(..) | Action::DeadlineDelete => self.deadline_step(s, action),
            Action::YieldRead(..) | Action::YieldWrite => self.yield_step(s, action),
            Action::Revoke(_, p) => self.revoke(s, p),
            Action::LateCopy(c) => self.late_copy(s, c),
            Action::LateRecord(c) => self.late_record(s, c),
            Action::Client(..) => unreachable!("a client's step"),
            _ => self.rebuild_step(s, action),
        }
    }
}
