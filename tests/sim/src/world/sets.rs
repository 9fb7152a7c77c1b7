//! Multi-lock sets (`AcquireRequest::with`, `src/lock/acquire/multi.rs`, docs/api.md "Several
//! locks at once"): a quarter of the acquires take the lock they picked with one or two other
//! locks of the world, in a drawn order, so that sets overlap in every order. The checkers
//! count each lock of a granted set as a hold of that lock (limit, modes, fencing), and a set's
//! grant as all or nothing: it names every lock asked for, each with the token of the one
//! place its keys share. No deadlock: every acquire, sets included, is answered within its
//! wait plus the answer bound (`check.rs`).

use super::shared::Shared;
use super::{LOCKS, NAMESPACE, World};
use crate::rng::Rng;
use podlock::lock::{AcquireRequest, Grant, LockId, Mode, Token};

/// Makes `req`, an acquire of `LOCKS[lock]`, a set a quarter of the time: with one or two of
/// the other locks, exclusive (a semaphore in a set refuses `shared`), one permit of each.
pub fn widen(rng: &mut Rng, req: &mut AcquireRequest, lock: usize) {
    if !rng.one_in(4) {
        return;
    }
    let mut others: Vec<usize> = (0..LOCKS.len()).filter(|&i| i != lock).collect();
    if rng.one_in(2) {
        others.swap(0, 1);
    }
    let n = rng.between(1, others.len() as u64) as usize;
    req.with = (others[..n].iter())
        .map(|&i| LockId::new(NAMESPACE, LOCKS[i].name).expect("a valid name"))
        .collect();
    req.mode = Mode::Exclusive;
    req.permits = 1;
}

/// The indexes in `LOCKS` of the locks `req` takes, its own first.
pub fn locks_of(req: &AcquireRequest) -> Vec<usize> {
    let names = std::iter::once(&req.lock).chain(&req.with);
    names.map(|l| index(&l.name)).collect()
}

/// The names of `locks` (indexes in `LOCKS`), joined by `+`.
pub fn names(locks: &[usize]) -> String {
    let names: Vec<&str> = locks.iter().map(|&i| LOCKS[i].name).collect();
    names.join("+")
}

/// The index in `LOCKS` of the lock named `name`.
fn index(name: &str) -> usize {
    (LOCKS.iter().position(|l| l.name == name)).expect("a lock of the world")
}

/// Each lock of grant `g` as a grant of that lock alone, with its index in `LOCKS`.
fn members(g: &Grant) -> Vec<(usize, Grant)> {
    if g.locks.is_empty() {
        return vec![(index(&g.lock.name), g.clone())];
    }
    (g.locks.iter())
        .map(|m| {
            let mut one = g.clone();
            one.lock = LockId::new(NAMESPACE, &m.lock).expect("a valid name");
            one.fencing_token = m.fencing_token;
            one.locks = Vec::new();
            (index(&m.lock), one)
        })
        .collect()
}

/// Checks `g`, answered to `holder` for an acquire of the locks `asked`: all or nothing (it
/// names exactly those locks, their tokens of one queue place), then each lock's hold as a
/// hold of that lock.
pub fn granted(s: &mut Shared, holder: &str, asked: &[usize], g: &Grant) -> Result<(), String> {
    let members = members(g);
    let mut named: Vec<usize> = members.iter().map(|(i, _)| *i).collect();
    let mut wanted = asked.to_vec();
    named.sort();
    wanted.sort();
    s.check.checks += 1;
    if named != wanted {
        return Err(format!(
            "set: {holder} asked for {wanted:?} and was granted {named:?} (token {})",
            g.fencing_token
        ));
    }
    let revision = |m: &Grant| Token::from_raw(m.fencing_token).revision();
    if let Some((_, m)) = (members.iter()).find(|(_, m)| revision(m) != revision(g)) {
        return Err(format!(
            "set: {holder}'s grant names {} token {} beside {} token {}: not one place",
            m.lock.name, m.fencing_token, g.lock.name, g.fencing_token
        ));
    }
    for (i, m) in &members {
        let (max, window) = (s.max_holders[*i], s.returned[*i]);
        s.check.granted(&s.etcd, holder, m, (max, window))?;
    }
    Ok(())
}

impl World {
    /// `holder` was answered that its release of `g` (a single lock or a whole set) was done.
    pub fn released_grant(&self, holder: &str, g: &Grant) {
        for (_, m) in members(g) {
            self.released(holder, &m.lock.name, m.fencing_token);
        }
    }
}
