//! An observer of one lock through one sidecar, as `GET /v1/locks/{name}/watch` and `podlock
//! observe` follow it (`Engine::observe`, then `Observer::next` until `deleted`), checked on
//! what it is told (docs/api.md, the watch):
//! - a holder it names was not told its hold ended before the observer asked for the news,
//!   but for the contract's restore window (docs/api.md, the fence check);
//! - a holder it never named before has a token above every one it named (the holders are the
//!   queue's first keys, so a later holder stands behind them), but across a restore, whose
//!   keys come back with older tokens;
//! - `deleted` comes only after the lock was lost with etcd (a wipe, or a restore) or deleted
//!   by the operator (`relock.rs`);
//! - the last change is never missed: once every client is done and all is quiet, the last
//!   holders it was told are none (unless its sidecar's pod died: it hears nothing more).

use super::{LOCKS, World};
use crate::rng::Rng;
use podlock::lock::{Engine, HolderSet, LockId, Observed, Observer};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep};

/// One observer actor's memory of what it was told.
struct Watch {
    world: World,
    lock: LockId,
    /// The sidecar it observes through.
    via: usize,
    /// The holders it was told last.
    reported: Vec<(String, i64)>,
    /// Every holder it was told of since the last restore, and their largest token.
    seen: BTreeSet<(String, i64)>,
    top: i64,
    /// Restores, wipes and deletions so far when it last looked: a restore brings older tokens
    /// back.
    losses: u64,
}

/// Observes a lock drawn by `rng` through a sidecar drawn from `engines` until `stop`, then
/// checks that the last holders it was told are none.
pub async fn run(mut rng: Rng, world: World, engines: Vec<Engine>, mut stop: oneshot::Receiver<()>) {
    let (lock, via) = (
        rng.below(LOCKS.len() as u64) as usize,
        rng.below(engines.len() as u64) as usize,
    );
    let lock = LockId::new(super::NAMESPACE, LOCKS[lock].name).expect("a valid name");
    let mut watch = Watch {
        losses: losses(&world),
        world,
        lock,
        via,
        reported: vec![],
        seen: BTreeSet::new(),
        top: 0,
    };
    let engine = &engines[via];
    loop {
        let (asked, losses) = (Instant::now(), losses(&watch.world));
        let observed = tokio::select! {
            biased;
            _ = &mut stop => return watch.end(),
            observed = engine.observe(&watch.lock) => observed,
        };
        let observer = match observed {
            Ok((now, observer)) => {
                watch.told(&now, asked);
                observer
            }
            Err(e) => {
                watch.log(format!("not observed: {e}"));
                let pause = Duration::from_millis(rng.between(200, 1_000));
                tokio::select! {
                    biased;
                    _ = &mut stop => return watch.end(),
                    _ = sleep(pause) => continue,
                }
            }
        };
        if !watch.follow(observer, &mut stop, losses).await {
            return watch.end();
        }
    }
}

/// Restores, wipes and the operator's deletions of a lock so far.
fn losses(world: &World) -> u64 {
    world.with(|s| {
        ["restore", "wipe", "delete"]
            .iter()
            .map(|k| s.faults.get(k).unwrap_or(&0))
            .sum()
    })
}

impl Watch {
    /// Follows `observer` until the lock is deleted (`true`: observe it again) or `stop`
    /// (`false`). `losses`: restores, wipes and deletions when it started observing.
    async fn follow(
        &mut self,
        mut observer: Observer,
        stop: &mut oneshot::Receiver<()>,
        losses: u64,
    ) -> bool {
        loop {
            let asked = Instant::now();
            let news = tokio::select! {
                biased;
                _ = &mut *stop => return false,
                news = observer.next() => news,
            };
            match news {
                Observed::Holders(now) => self.told(&now, asked),
                Observed::Deleted(gone) => {
                    self.log(format!("told deleted at revision {}", gone.revision));
                    self.reported.clear();
                    if self::losses(&self.world) == losses {
                        let e = format!("told {} deleted, and no lock was", self.lock.name);
                        self.fail(e);
                    }
                    return true;
                }
            }
        }
    }

    /// Checks the holders `now`, told after the observer asked at `asked`.
    fn told(&mut self, now: &HolderSet, asked: Instant) {
        let holders: Vec<(String, i64)> = (now.holders.iter())
            .map(|h| (h.holder_id.clone(), h.fencing_token))
            .collect();
        self.log(format!("told holders {holders:?} at revision {}", now.revision));
        let losses = losses(&self.world);
        if losses != self.losses {
            self.seen.clear();
            self.top = 0;
            self.losses = losses;
        }
        for (holder, token) in &holders {
            self.held_then(holder, *token, asked);
            if !self.seen.contains(&(holder.clone(), *token)) && *token <= self.top {
                let e = format!(
                    "a new holder {holder} with token {token}, after token {}",
                    self.top
                );
                self.fail(e);
            }
        }
        self.top = (holders.iter().map(|(_, t)| *t)).fold(self.top, i64::max);
        self.seen.extend(holders.iter().cloned());
        self.reported = holders;
    }

    /// Checks that `holder`'s hold of `token` had not ended when the observer asked, but for
    /// two windows: a view names a hold a restore brought back, through any sidecar (only the
    /// fence check through the hold's own sidecar knows better); and a hold ended at its
    /// maximum hold time while its key stays, its sidecar cut off from etcd (finding F13).
    fn held_then(&self, holder: &str, token: i64, asked: Instant) {
        let name = self.lock.name.as_str();
        let ended = self.world.with(|s| {
            s.check.checks += 1;
            let ended = (s.check.ended_at(name, token)).filter(|(at, _)| *at < asked);
            let deadline = s.deadline_ends.contains(&(name.to_string(), token));
            ended.filter(|(at, _)| !s.check.restored_since(*at) && !deadline)
        });
        if let Some((at, _)) = ended {
            let ago = asked - at;
            self.fail(format!(
                "told {holder} holds token {token}, its end told {ago:?} before"
            ));
        }
    }

    /// At the end, once all was quiet: the last holders told must be none, unless its pod
    /// died.
    fn end(self) {
        let dead = self.world.with(|s| {
            s.check.checks += 1;
            s.ops.dead.contains(&self.via)
        });
        if !dead && !self.reported.is_empty() {
            let e = format!("the last holders told, all quiet: {:?}", self.reported);
            self.fail(e);
        }
    }

    fn log(&self, line: String) {
        let lock = &self.lock.name;
        self.world
            .log(format!("observer of {lock} via pod-{}: {line}", self.via));
    }

    fn fail(&self, e: String) {
        let lock = &self.lock.name;
        self.world
            .fail(format!("observer of {lock} via pod-{}: {e}", self.via));
    }
}
