//! The online checkers, on what each client was told. A hold counts from its grant's answer to
//! its release's answer or its `lost` event; since a `lost` may come after another client was
//! granted (the contract's exclusion is per lease validity), the limit is the protocol model's
//! (`tests/model/src/props.rs`, LIMIT and MODES): at no grant more holds whose keys are in place
//! than `maxHolders` allows, and never shared beside exclusive.

use crate::etcd::Etcd;
use podlock::lock::{Grant, Mode, Token};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

/// Where the queue keys of the world's namespace live (`src/lock/protocol/keys.rs`).
pub const QUEUE_PREFIX: &str = "/podlock/v1/queue/";

/// How long past its wait an acquire may take to be answered: the engine's request budget
/// (`etcd/mod.rs`, 5 s) twice, and a pod's longest pause.
pub const ANSWER_BOUND: Duration = Duration::from_secs(20);

/// How long after a restore a hold that ended before it may read as current through another
/// pod's sidecar: the lock's `ttlSeconds` (docs/api.md).
const RESTORE_WINDOW: Duration = Duration::from_secs(super::operator::TTL as u64);

/// When a client was told its hold ended, and its holder id.
pub type Ended = (Instant, String);

/// A hold some client was told it has.
struct Held {
    lock: String,
    holder: String,
    token: i64,
    lease: i64,
    mode: Mode,
    permits: u32,
    /// Its release was answered, or its `lost` event came.
    ended: bool,
}

/// What the checkers know and how much they checked.
#[derive(Default)]
pub struct Checker {
    holds: Vec<Held>,
    /// Per lock, the highest token of a hold known to be over (ended, or its key gone), and
    /// its holder.
    top: BTreeMap<String, (i64, String)>,
    /// Every (lock, token) whose client was told its hold ended: when, and its holder.
    over: BTreeMap<(String, i64), (Instant, String)>,
    /// When etcd was restored.
    restores: Vec<Instant>,
    /// Per lock, the token of the hold whose end a client was told last.
    last_over: BTreeMap<String, i64>,
    /// Per pod and lock, the highest token epoch its sidecar granted under since etcd's last
    /// wipe (which may make a sidecar find the lock undeclared, and forget it).
    floors: BTreeMap<(String, String), u32>,
    /// Checks made.
    pub checks: u64,
}

impl Checker {
    /// A grant answered to `holder` on a lock whose `maxHolders` never exceeded `max`: checks
    /// the limit, the modes, the token's rise and its sidecar's epoch floor; returns the first
    /// broken rule. `window`: etcd was restored and the operator has not yet published the lock
    /// again, when a token may fall (the snapshot may predate the lock's latest epoch, #54
    /// F11), but never below an epoch the granting sidecar granted under.
    pub fn granted(
        &mut self,
        etcd: &Etcd,
        holder: &str,
        g: &Grant,
        (max, window): (u32, bool),
    ) -> Result<(), String> {
        let lock = g.lock.name.clone();
        let new = Held {
            lock: lock.clone(),
            holder: holder.to_string(),
            token: g.fencing_token,
            lease: g.lease_id,
            mode: g.mode,
            permits: g.permits,
            ended: false,
        };
        let placed = in_place(etcd, &lock);
        for h in (self.holds.iter()).filter(|h| h.lock == lock && (h.ended || !placed(h))) {
            let top = self.top.entry(lock.clone()).or_default();
            if h.token > top.0 {
                *top = (h.token, h.holder.clone());
            }
        }
        self.holds.retain(|h| !h.ended);
        self.floor(holder, &lock, Token::from_raw(new.token).epoch())?;
        self.checks += 1;
        let fell = self.top.get(&lock).filter(|(t, _)| *t >= new.token && !window);
        if let Some((token, by)) = fell {
            return Err(format!(
                "fencing: {holder} granted {lock} with token {} after {by}'s hold of token {token} was over",
                new.token
            ));
        }
        self.holds.push(new);
        let live: Vec<&Held> = (self.holds.iter())
            .filter(|h| h.lock == lock && placed(h))
            .collect();
        self.checks += 1;
        let exclusive: u32 = live
            .iter()
            .filter(|h| h.mode == Mode::Exclusive)
            .map(|h| h.permits)
            .sum();
        let shared = live.iter().any(|h| h.mode == Mode::Shared);
        if exclusive > max || (shared && exclusive > 0) {
            let names: Vec<String> = (live.iter())
                .map(|h| format!("{} {:?}×{} token {}", h.holder, h.mode, h.permits, h.token))
                .collect();
            return Err(format!(
                "limit: {lock} (maxHolders ≤ {max}) held by {}",
                names.join(", ")
            ));
        }
        Ok(())
    }

    /// Checks and raises the epoch floor of `holder`'s sidecar for `lock` at a grant under
    /// `epoch`.
    fn floor(&mut self, holder: &str, lock: &str, epoch: u32) -> Result<(), String> {
        let pod = holder.split('c').next().unwrap_or(holder).to_string();
        let floor = self.floors.entry((pod, lock.to_string())).or_default();
        self.checks += 1;
        if epoch < *floor {
            return Err(format!(
                "epoch floor: {holder} granted {lock} under epoch {epoch}, its sidecar having granted under {floor}"
            ));
        }
        *floor = epoch;
        Ok(())
    }

    /// etcd was wiped: a sidecar may find its locks undeclared meanwhile, and forget their
    /// epochs.
    pub fn wiped(&mut self) {
        self.floors.clear();
    }

    /// `lock` was deleted: a sidecar may find it undeclared meanwhile, and forget its epoch.
    pub fn deleted(&mut self, lock: &str) {
        self.floors.retain(|(_, l), _| l != lock);
    }

    /// The hold of `token` ended: released, or told lost.
    pub fn ended(&mut self, lock: &str, token: i64) {
        let holder = (self.holds.iter().find(|h| h.lock == lock && h.token == token))
            .map_or_else(String::new, |h| h.holder.clone());
        (self.over).insert((lock.to_string(), token), (Instant::now(), holder));
        self.last_over.insert(lock.to_string(), token);
        for h in (self.holds.iter_mut()).filter(|h| h.lock == lock && h.token == token) {
            h.ended = true;
        }
    }

    /// The locks and tokens of the hold of `holder` that `token` of `lock` belongs to: that one,
    /// and the other locks of its set (their tokens of the same revision).
    pub fn hold_of(&self, holder: &str, (lock, token): (&str, i64)) -> Vec<(String, i64)> {
        let revision = Token::from_raw(token).revision();
        let mut all: Vec<(String, i64)> = (self.holds.iter())
            .filter(|h| h.holder == holder && !h.ended && Token::from_raw(h.token).revision() == revision)
            .map(|h| (h.lock.clone(), h.token))
            .collect();
        if !all.iter().any(|(l, t)| l == lock && *t == token) {
            all.push((lock.to_string(), token));
        }
        all
    }

    /// The holds some client was told it has and not yet told are over whose keys are gone
    /// from `etcd` now: lock, holder id and token.
    pub fn gone_holds(&self, etcd: &Etcd) -> Vec<super::belief::Gone> {
        let mut gone = Vec::new();
        let locks: std::collections::BTreeSet<&str> = (self.holds.iter())
            .filter(|h| !h.ended)
            .map(|h| h.lock.as_str())
            .collect();
        for lock in locks {
            let placed = in_place(etcd, lock);
            let held = (self.holds.iter()).filter(|h| h.lock == lock && !h.ended && !placed(h));
            gone.extend(held.map(|h| (h.lock.clone(), h.holder.clone(), h.token)));
        }
        gone
    }

    /// Whether some client was told it has a hold of `lock` by the key of `revision`, and not
    /// yet that it is over.
    pub fn holds_key(&self, lock: &str, revision: i64) -> bool {
        (self.holds.iter())
            .any(|h| h.lock == lock && !h.ended && Token::from_raw(h.token).revision() == revision)
    }

    /// Whether some client was told it holds `token` of `lock` (its hold may have ended).
    pub fn was_granted(&self, lock: &str, token: i64) -> bool {
        let key = (lock.to_string(), token);
        self.over.contains_key(&key) || (self.holds.iter()).any(|h| h.lock == lock && h.token == token)
    }

    /// The token of `lock`'s hold whose end a client was told last.
    pub fn last_over(&self, lock: &str) -> Option<i64> {
        self.last_over.get(lock).copied()
    }

    /// When the client of `token` was told its hold ended, and who it was, if it was.
    pub fn ended_at(&self, lock: &str, token: i64) -> Option<Ended> {
        self.over.get(&(lock.to_string(), token)).cloned()
    }

    /// etcd was restored now.
    pub fn restored(&mut self) {
        self.restores.push(Instant::now());
    }

    /// A fence check of `token` through the sidecar of pod `via`, asked after its hold had
    /// `ended` (if it had), answered `current`: `current` only for a token whose client holds,
    /// but for the contract's restore window (docs/api.md, the fence check): a hold that
    /// ended before a restore brought its key back reads as current through another pod's
    /// sidecar for at most `ttlSeconds` after etcd's return.
    pub fn fenced(
        &mut self,
        (lock, token): (&str, i64),
        via: usize,
        current: bool,
        ended: Option<Ended>,
    ) -> Result<(), String> {
        self.checks += 1;
        let Some((at, holder)) = ended.filter(|_| current) else {
            return Ok(());
        };
        let other = !holder.starts_with(&format!("p{via}c"));
        if other && self.restored_since(at) {
            return Ok(());
        }
        Err(format!(
            "fence: {lock} token {token} answered current through pod-{via} after {holder}'s hold had ended"
        ))
    }

    /// Whether etcd was restored after `at`, within the restore window of now: a hold that
    /// ended at `at` may have come back.
    pub fn restored_since(&self, at: Instant) -> bool {
        let now = Instant::now();
        (self.restores.iter()).any(|r| *r >= at && now <= *r + RESTORE_WINDOW)
    }

    /// An acquire answered after `took`, having asked to wait `wait`.
    pub fn answered(&mut self, took: Duration, wait: Duration) -> Result<(), String> {
        self.checks += 1;
        if took > wait + ANSWER_BOUND {
            return Err(format!("an acquire waiting {wait:?} was answered after {took:?}"));
        }
        Ok(())
    }
}

/// Whether a hold's key is in etcd now: a key of its lock with its lease and its token's
/// create revision.
fn in_place(etcd: &Etcd, lock: &str) -> impl Fn(&Held) -> bool {
    let prefix = format!("{QUEUE_PREFIX}{}/{lock}/", super::NAMESPACE);
    let keys: Vec<(i64, i64)> = etcd.inspect(|s| {
        (s.keys_under(prefix.as_bytes()).iter())
            .map(|kv| (kv.create_revision, kv.lease))
            .collect()
    });
    move |h| keys.contains(&(Token::from_raw(h.token).revision(), h.lease))
}
