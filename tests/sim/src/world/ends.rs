//! The liveness of ended holds: a hold the operator forced, asked to yield, or that asked for
//! a maximum hold time owes an end by a bound. At that moment its key (its token's revision on
//! its lease) must be gone from etcd (the operator's store always reaches etcd), unless etcd
//! was restored meanwhile (a restore brings keys back, and may take back the request), and its
//! client, if it was told it holds, must have been told its hold ended (released, or `lost`),
//! unless its pod died.

use super::World;
use super::check::QUEUE_PREFIX;
use crate::etcd::Etcd;
use podlock::lock::{Grant, QueueEntry, Token};
use podlock::operator::deadline::GRACE;
use std::time::Duration;
use tokio::time::{Instant, sleep_until};

/// How long past a yield request's deadline its hold may last: the backstop's longest round
/// (2 s) and a pod's longest pause (6 s), and a margin.
pub const YIELDED: Duration = Duration::from_secs(10);

/// How long past its maximum hold time a hold may last: the operator's grace, a lease TTL (an
/// unrecorded grant's clock starts a TTL after the operator first saw it), two of the
/// backstop's rounds (one to see the hold, one to end it) and a margin.
const TIMED: Duration = Duration::from_secs(GRACE.as_secs() + super::operator::TTL as u64 + 4 + 3);

/// A hold that owes an end by `by`, and why (`what`).
pub struct Due {
    /// Why it ends: `force`, `yield`, `deadline`.
    pub what: &'static str,
    /// Its lock's name.
    pub lock: String,
    /// Its fencing token.
    pub token: i64,
    /// Its lease.
    pub lease: i64,
    /// Its holder id.
    pub holder: String,
    /// When it must have ended.
    pub by: Instant,
}

/// Checks at `due.by` that its hold ended.
pub fn expect(world: &World, due: Due) {
    let (world, restores) = (world.clone(), world.with(|s| restores(s)));
    tokio::spawn(async move {
        sleep_until(due.by).await;
        if let Err(e) = ended(&world, &due, restores) {
            world.fail(e);
        }
    });
}

/// A grant answered to `holder`: with a maximum hold time, it owes its end by then (while the
/// operator's steps run).
pub fn timed(world: &World, holder: &str, g: &Grant) {
    let Some(seconds) = g.max_hold_seconds.filter(|_| world.with(|s| s.ops.on)) else {
        return;
    };
    let due = Due {
        what: "deadline",
        lock: g.lock.name.clone(),
        token: g.fencing_token,
        lease: g.lease_id,
        holder: holder.to_string(),
        by: Instant::now() + Duration::from_secs(seconds.into()) + TIMED,
    };
    expect(world, due);
}

/// Whether `due`'s hold ended, etcd having been restored `restores` times when it was due.
fn ended(world: &World, due: &Due, restores_then: u64) -> Result<(), String> {
    world.with(|s| {
        s.check.checks += 1;
        // A waiter whose key came to hold but whose client was not yet told (its pod cut
        // off) and whose key ended then is never told it held: nothing to tell.
        let granted = s.check.was_granted(&due.lock, due.token);
        let told = !granted || s.check.ended_at(&due.lock, due.token).is_some() || s.ops.dead_holder(&due.holder);
        let revision = Token::from_raw(due.token).revision();
        let placed = restores(s) == restores_then && in_place(&s.etcd, &due.lock, (revision, due.lease));
        if told && !placed {
            return Ok(());
        }
        let (what, lock, token, holder) = (due.what, &due.lock, due.token, &due.holder);
        Err(format!(
            "{what}: {holder}'s hold of {lock} token {token} had not ended by its bound (key in etcd: {placed}, client told: {told})"
        ))
    })
}

/// Whether `lock` has a queue key of create `revision` on `lease`.
fn in_place(etcd: &Etcd, lock: &str, (revision, lease): (i64, i64)) -> bool {
    let prefix = format!("{QUEUE_PREFIX}{}/{lock}/", super::NAMESPACE);
    etcd.inspect(|s| {
        (s.keys_under(prefix.as_bytes()).iter()).any(|kv| kv.create_revision == revision && kv.lease == lease)
    })
}

/// How many times etcd was restored so far.
pub fn restores(s: &super::shared::Shared) -> u64 {
    s.faults.get("restore").copied().unwrap_or(0)
}

/// The holder id of an entry (empty when it is not one).
pub fn holder(e: &QueueEntry) -> String {
    e.entry.as_ref().map_or_else(String::new, |e| e.holder_id.clone())
}

/// The fencing token of an entry: its epoch and create revision.
pub fn token(e: &QueueEntry) -> i64 {
    let epoch = e.entry.as_ref().map_or(0, |e| e.epoch);
    Token::new(epoch, e.revision).map_or(e.revision, Token::get)
}
