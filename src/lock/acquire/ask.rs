//! What an acquire may ask of its locks: a mode, a number of permits, and a rejoin of a hold its
//! holder id already has. Each refusal says which field to change and how.

use crate::lock::engine::hold::Hold;
use crate::lock::engine::max_hold::MaxHold;
use crate::lock::error::LockError;
use crate::lock::messages::AcquireRequest;
use crate::lock::protocol::entry::Mode;
use crate::lock::protocol::names::LockId;
use crate::lock::txn::settings::{Declared, Settings, TTL};

/// The request field that asks for permits.
const PERMITS_FIELD: &str = "permits";

/// Checks what `permits` an acquire asks for, before any lock is read: at least 1, and more
/// than 1 only on an exclusive acquire of a single lock. A shared hold takes no slots of a
/// semaphore (shared holds need `maxHolders` 1), and a multi-lock acquire's one key per lock
/// would need each lock's permits: both are refused rather than changed.
pub(super) fn check_permits_asked(req: &AcquireRequest) -> Result<(), LockError> {
    let why = match req.permits {
        0 => "must be at least 1: ask for 1 up to the lock's maxHolders, or leave permits out for 1",
        1 => return Ok(()),
        _ if req.mode == Mode::Shared => {
            "applies to exclusive holds of a semaphore only: a shared hold takes no slots; leave \
             permits out, or acquire without mode shared"
        }
        _ if !req.with.is_empty() => {
            "is not supported on a multi-lock acquire (with): leave permits out, or acquire the \
             weighted lock alone"
        }
        _ => return Ok(()),
    };
    Err(LockError::Invalid(format!(
        "{PERMITS_FIELD} {} {why}",
        req.permits
    )))
}

/// Checks `permits` against the lock's settings: a hold may take at most all of its slots.
/// Refused rather than capped: a job that asked for 4 and got 3 would overrun what it planned.
pub(super) fn check_permits(lock: &LockId, permits: u32, s: Settings) -> Result<(), LockError> {
    if permits > s.max_holders {
        return Err(above_permits(lock, permits, s));
    }
    Ok(())
}

/// The refusal of `permits` on a lock with settings `s` that has fewer slots: when asked, or
/// when `maxHolders` is lowered below them while the request waits (it can then never be let
/// in, and would hold up every request behind it).
pub(super) fn above_permits(lock: &LockId, permits: u32, s: Settings) -> LockError {
    LockError::AbovePermits {
        lock: lock.clone(),
        asked: permits,
        limit: s.max_holders,
    }
}

/// Whether an acquire by a holder id that already holds may be answered with that hold: only
/// an acquire in the same mode, for the same permits, of the same locks (a single lock is not a
/// set it holds as part of), with neither side bound to a connection (a connection's hold is
/// its own, see the contract's "Holder identity").
pub(super) fn check_rejoin(req: &AcquireRequest, hold: &Hold) -> Result<(), LockError> {
    if req.with.is_empty() && !hold.terms.set.is_empty() {
        let names: Vec<&str> = hold.terms.set.iter().map(|(l, _)| l.name.as_str()).collect();
        return Err(LockError::HolderInUse {
            lock: req.lock.clone(),
            holder: req.holder_id.clone(),
            why: format!(
                "; it holds it as part of [{}]: acquire that set, or release it first",
                names.join(", ")
            ),
        });
    }
    if req.connection_bound || hold.terms.connection_bound {
        let why = if hold.terms.connection_bound {
            "; that hold is bound to another connection (POST .../hold)"
        } else {
            "; a hold bound to a connection (POST .../hold) cannot take over a held holder id"
        };
        return Err(LockError::HolderInUse {
            lock: req.lock.clone(),
            holder: req.holder_id.clone(),
            why: why.into(),
        });
    }
    if req.mode != hold.terms.mode {
        return Err(LockError::ModeConflict {
            lock: req.lock.clone(),
            holder: req.holder_id.clone(),
            held: hold.terms.mode,
            asked: req.mode,
        });
    }
    if req.permits != hold.terms.permits {
        return Err(LockError::HolderInUse {
            lock: req.lock.clone(),
            holder: req.holder_id.clone(),
            why: format!(
                "; it holds {} permits, and this acquire asks for {}: release it first to hold with \
                 another number of permits",
                hold.terms.permits, req.permits
            ),
        });
    }
    Ok(())
}

/// Shared holds need a reader-writer lock (`maxHolders` 1): in a semaphore every hold already
/// shares, up to its slots.
pub(super) fn check_mode(lock: &LockId, mode: Mode, s: Settings) -> Result<(), LockError> {
    if mode == Mode::Shared && s.max_holders > 1 {
        return Err(LockError::Invalid(format!(
            "mode shared needs a lock with maxHolders 1 (a reader-writer lock); {} is a semaphore \
             of {}: acquire it without a mode",
            lock, s.max_holders
        )));
    }
    Ok(())
}

/// What `req` asks, checked against the lock's settings `s`: its mode and permits, and the
/// maximum hold time and TTL its entry records.
pub(super) fn checked(req: &AcquireRequest, s: Settings) -> Result<(MaxHold, u32), LockError> {
    check_mode(&req.lock, req.mode, s)?;
    check_permits(&req.lock, req.permits, s)?;
    let max_hold = MaxHold::of(req, &[(&req.lock, s.max_hold_seconds)])?;
    let ttl = TTL.check(req.ttl_seconds.unwrap_or(s.ttl_seconds))?;
    Ok((max_hold, ttl))
}

/// What a multi-lock acquire `req` asks of its `locks`, checked against their settings
/// `declared`: its mode on each, and its maximum hold time within every lock's.
pub(super) fn checked_set(
    req: &AcquireRequest,
    locks: &[LockId],
    declared: &[Declared],
) -> Result<MaxHold, LockError> {
    for (lock, d) in locks.iter().zip(declared) {
        check_mode(lock, req.mode, d.settings)?;
    }
    let limits: Vec<(&LockId, u32)> = (locks.iter().zip(declared))
        .map(|(l, d)| (l, d.settings.max_hold_seconds))
        .collect();
    MaxHold::of(req, &limits)
}

/// The most locks one request may take: enough for the sets users ask for, few enough that
/// its transactions stay far below etcd's limit of operations per transaction.
pub const MAX_SET: usize = 8;

/// The locks of a multi-lock request, in its order (`lock` first), checked: distinct, of one
/// namespace, at most [`MAX_SET`].
pub(super) fn check_set(req: &AcquireRequest) -> Result<Vec<LockId>, LockError> {
    let locks: Vec<LockId> = std::iter::once(&req.lock).chain(&req.with).cloned().collect();
    if locks.len() > MAX_SET {
        return Err(LockError::Invalid(format!(
            "with names {} locks besides {}; a multi-lock acquire takes at most {MAX_SET} locks in all",
            req.with.len(),
            req.lock.name
        )));
    }
    for (i, lock) in locks.iter().enumerate() {
        if lock.namespace != req.lock.namespace {
            return Err(LockError::Invalid(format!(
                "with: {lock} is in another namespace; a multi-lock acquire takes locks of {} only",
                req.lock.namespace
            )));
        }
        if locks[..i].contains(lock) {
            return Err(LockError::Invalid(format!(
                "with: lock {} is named twice; name each lock of the set once",
                lock.name
            )));
        }
    }
    Ok(locks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn request(permits: u32, mode: Mode, with: &[&str]) -> AcquireRequest {
        let lock = |n: &str| LockId::new("default", n).expect("a lock name");
        AcquireRequest {
            lock: lock("jobs"),
            holder_id: "h".into(),
            wait: Duration::ZERO,
            ttl_seconds: None,
            heartbeat_timeout_seconds: None,
            max_hold_seconds: None,
            deadline_warning_seconds: None,
            container: None,
            mode,
            permits,
            connection_bound: false,
            with: with.iter().map(|n| lock(n)).collect(),
        }
    }

    fn refusal(req: &AcquireRequest) -> String {
        check_permits_asked(req).expect_err("refused").to_string()
    }

    #[test]
    fn permits_are_refused_where_they_cannot_apply() {
        assert!(check_permits_asked(&request(2, Mode::Exclusive, &[])).is_ok());
        assert!(check_permits_asked(&request(1, Mode::Shared, &["b"])).is_ok());
        let zero = refusal(&request(0, Mode::Exclusive, &[]));
        assert!(zero.starts_with("permits 0 must be at least 1"), "{zero}");
        let shared = refusal(&request(2, Mode::Shared, &[]));
        assert!(
            shared.contains("permits 2 applies to exclusive holds"),
            "{shared}"
        );
        let set = refusal(&request(2, Mode::Exclusive, &["b"]));
        assert!(set.contains("multi-lock acquire"), "{set}");
    }

    #[test]
    fn permits_above_max_holders_are_refused_with_the_limit() {
        let s = |max_holders| Settings {
            max_holders,
            ..Settings::default()
        };
        let lock = LockId::new("default", "jobs").expect("a lock name");
        assert!(check_permits(&lock, 3, s(3)).is_ok());
        let above = check_permits(&lock, 4, s(3)).expect_err("refused");
        assert!(matches!(
            above,
            LockError::AbovePermits {
                asked: 4,
                limit: 3,
                ..
            }
        ));
    }

    /// The request's own lock is `jobs`.
    #[test]
    fn a_set_is_distinct_locks_of_one_namespace_at_most_eight() {
        let set = |with: &[&str]| request(1, Mode::Exclusive, with);
        let names = |r: &AcquireRequest| {
            check_set(r)
                .unwrap()
                .iter()
                .map(|l| l.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(&set(&["c", "b"])),
            ["jobs", "c", "b"],
            "the request's order"
        );
        assert!(check_set(&set(&["b", "jobs"])).is_err());
        assert!(check_set(&set(&["b", "b"])).is_err());
        assert!(check_set(&set(&["1", "2", "3", "4", "5", "6", "7"])).is_ok());
        assert!(check_set(&set(&["1", "2", "3", "4", "5", "6", "7", "8"])).is_err());
        let mut other = set(&["b"]);
        other.with[0].namespace = "elsewhere".into();
        assert!(check_set(&other).is_err());
    }
}
