//! A client of one sidecar: it thinks, acquires (waiting or trying once), holds with
//! heartbeats, and releases, every choice and time from its own generator. While it holds, a
//! downstream system checks its token, or the last token of the lock whose hold ended,
//! through any sidecar (the fence check).

use super::{LOCKS, World, sets};
use crate::rng::Rng;
use podlock::lock::{AcquireRequest, Engine, Grant, LockError, LockId, Mode};
use std::time::Duration;
use tokio::time::{Instant, sleep};

/// How often a holder heartbeats a lock with a heartbeat window.
const HEARTBEAT_EVERY: Duration = Duration::from_millis(1_000);

/// One client of one sidecar.
pub struct Client {
    /// Its holder id, fixed by the world (the sidecar would draw one from the OS).
    pub id: String,
    /// Its sidecar's engine.
    pub engine: Engine,
    /// Every sidecar's engine, for fence checks.
    pub peers: Vec<Engine>,
    /// Its choices.
    pub rng: Rng,
    /// What every client and the checkers share.
    pub world: World,
}

impl Client {
    /// Acquires and releases until `until`, then returns with nothing held.
    pub async fn run(mut self, until: Instant) {
        while Instant::now() < until {
            sleep(self.ms(0, 1_500)).await;
            let lock = self.rng.below(LOCKS.len() as u64) as usize;
            let mut req = self.request(lock);
            sets::widen(&mut self.rng, &mut req, lock);
            let (wait, asked, locks) = (req.wait, Instant::now(), sets::locks_of(&req));
            self.world.log(format!(
                "{} acquire {} wait {wait:?} {:?}×{}",
                self.id,
                sets::names(&locks),
                req.mode,
                req.permits
            ));
            self.world.asking(&self.id);
            let answer = self.engine.acquire(req).await;
            (self.world).answered(&self.id, asked.elapsed(), wait, answer.is_ok());
            match answer {
                Ok(g) => {
                    self.world.granted(&self.id, &locks, &g);
                    self.hold(&g).await;
                }
                Err(e) => self.world.log(format!("{} refused: {e}", self.id)),
            }
        }
    }

    fn request(&mut self, lock: usize) -> AcquireRequest {
        let shared = LOCKS[lock].shared && self.rng.one_in(2);
        AcquireRequest {
            lock: LockId::new(super::NAMESPACE, LOCKS[lock].name).expect("a valid name"),
            holder_id: self.id.clone(),
            wait: if self.rng.one_in(3) {
                Duration::ZERO
            } else {
                self.ms(0, 4_000)
            },
            ttl_seconds: None,
            heartbeat_timeout_seconds: None,
            // A quarter of the holds ask for a maximum hold time: the engine ends them then.
            max_hold_seconds: self.rng.one_in(4).then(|| self.rng.between(1, 3) as u32),
            deadline_warning_seconds: None,
            container: None,
            mode: if shared { Mode::Shared } else { Mode::Exclusive },
            // Two permits only on the semaphore: on a mutex it is refused at once.
            permits: if LOCKS[lock].max_holders > 1 {
                self.rng.between(1, 2) as u32
            } else {
                1
            },
            connection_bound: false,
            with: Vec::new(),
        }
    }

    /// Holds `g` for a while, heartbeating if its lock wants it (now and then forgetting to),
    /// then releases it.
    async fn hold(&mut self, g: &Grant) {
        let end = Instant::now() + self.ms(0, 3_000);
        if self.rng.one_in(2) {
            self.fence(g).await;
        }
        let forgets = self.rng.one_in(8);
        while g.heartbeat_timeout_seconds > 0 && Instant::now() + HEARTBEAT_EVERY < end {
            sleep(HEARTBEAT_EVERY).await;
            if forgets {
                continue;
            }
            if let Err(e) = self.engine.heartbeat(&g.lock, &self.id).await {
                self.world
                    .log(format!("{} heartbeat {}: {e}", self.id, g.fencing_token));
                return;
            }
        }
        sleep(end.saturating_duration_since(Instant::now())).await;
        let rebuilds = self.world.with(|s| s.rebuilds);
        (self.world).releasing(&self.id, &g.lock.name, g.fencing_token);
        let answer = (self.engine)
            .release_token(&g.lock, &self.id, g.fencing_token)
            .await;
        match &answer {
            Ok(()) => self.world.released_grant(&self.id, g),
            Err(e) => self
                .world
                .log(format!("{} release {}: {e}", self.id, g.fencing_token)),
        }
        if let Ok(()) | Err(LockError::Lost { .. }) = answer {
            (self.world).release_answered((&self.id, g), answer.is_ok(), rebuilds);
        }
    }

    /// A fence check, through a sidecar picked at random, of `g`'s token or (a third of the
    /// time) of the last token of its lock whose hold ended.
    async fn fence(&mut self, g: &Grant) {
        let older = self.rng.one_in(3);
        let (token, ended) = (self.world).token_to_fence(&g.lock.name, g.fencing_token, older);
        let via = self.rng.below(self.peers.len() as u64) as usize;
        match self.peers[via].fence(&g.lock, token).await {
            Ok(check) => {
                let lock = (g.lock.name.as_str(), token);
                (self.world).fenced(&self.id, lock, via, check.current, ended)
            }
            Err(e) => self.world.log(format!("{} fence {token}: {e}", self.id)),
        }
    }

    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.rng.between(lo, hi))
    }
}
