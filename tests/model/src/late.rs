//! Late copies of an enqueue: a copy the hedge sent reaches etcd after the answer, and after
//! the key left the queue it puts the key back (`src/lock/life/late.rs` in the engine, whose guard
//! removes it).

use crate::client::new_key;
use crate::model::Protocol;
use crate::spec::Bug;
use crate::state::{Cached, Key, State};

/// Where the late copy of a client's first enqueue is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Late {
    /// Not sent yet: the first enqueue is to come.
    Unsent,
    /// On its way to etcd.
    InFlight(LateCopy),
    /// Applied (or refused), or none in this run.
    Spent,
}

/// A copy of an enqueue still on its way to etcd: the same transaction, guarded by the
/// settings its sender had cached, putting the same key if it is absent, on the same lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LateCopy {
    /// The key's name: the session (lease) and the holder id's generation.
    pub session: u8,
    pub holder: u8,
    /// The settings the guard compares against.
    pub cache: Cached,
}

impl Protocol {
    /// A late copy of client `c`'s first enqueue reaches etcd: the same guarded put-if-absent
    /// on the same lease. It puts the key back if the key left the queue meanwhile; the
    /// sidecar's guard, watching for it, removes it as a key no acquire tracks.
    pub(crate) fn late_copy(&self, s: &mut State, c: u8) {
        let Late::InFlight(copy) = std::mem::replace(&mut s.clients[c as usize].late, Late::Spent) else {
            unreachable!("no copy of client {c}'s enqueue in flight");
        };
        let (spec, pod) = (
            self.spec.clients[c as usize],
            &s.pods[self.owners[c as usize] as usize],
        );
        let lock = &s.locks[spec.lock as usize];
        let same_name = |k: &Key| k.owner == c && k.session == copy.session && k.holder == copy.holder;
        let lease = pod.lease && pod.session == copy.session;
        if !lease || !self.guard_holds(&copy.cache, lock) || lock.queue.iter().any(same_name) {
            return; // refused: the lease is gone, the settings changed, or the key is there
        }
        let create = s.next_rev();
        // The copy is of the first enqueue, which asks for a maximum hold time if any does.
        let key = Key {
            timed: spec.deadline,
            yielding: false,
            ..new_key(
                (c, copy.session, copy.holder),
                copy.cache.epoch,
                create,
                spec.shared,
            )
        };
        s.locks[spec.lock as usize].queue.push(key);
        s.late_landed = true;
        if self.spec.bug != Some(Bug::LateCopyUnguarded) {
            s.clients[c as usize].removals.push(create);
        }
    }
}
