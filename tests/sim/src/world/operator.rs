//! The operator's part, through the functions the operator calls: every lock's settings
//! published with `Store::publish` under the epoch `protocol::epoch::choose` picks from the
//! lock's status, which lives here as the DistributedLock's status lives in Kubernetes, out
//! of etcd's reach: a wipe or a restore leaves it. Now and then the semaphore gets a new
//! `maxHolders`. It reconciles every lock every 0.2 to 2 s, so it notices a restore or a wipe
//! within that (the operator's etcd watch asks for a reconcile within about 150 ms).

use super::{LOCKS, LockSpec, NAMESPACE, SEMAPHORE, World};
use crate::rng::Rng;
use podlock::lock::protocol::epoch::{self, Known};
use podlock::lock::{LockError, LockId, Settings, Store, Token};
use std::time::Duration;
use tokio::time::{Instant, sleep};

/// The lease TTL of every lock.
pub const TTL: u32 = 3;

/// The operator actor of one seed.
pub struct Operator {
    /// Its choices.
    pub rng: Rng,
    /// What every actor shares; `returned` there is what the operator's watch would see.
    pub world: World,
    /// Its door to etcd.
    pub store: Store,
    /// Each lock's status: the epochs published and the largest token seen.
    pub status: Vec<Known>,
    /// Each lock's `maxHolders` in its spec.
    pub spec: Vec<u32>,
}

impl Operator {
    /// Declares every lock (epoch 0 on an empty etcd), as `kubectl apply` and a first
    /// reconcile would.
    pub fn new(rng: Rng, world: World, store: Store) -> Self {
        Operator {
            rng,
            world,
            store,
            status: vec![Known::default(); LOCKS.len()],
            spec: LOCKS.iter().map(|l| l.max_holders).collect(),
        }
    }

    /// Reconciles until `until`, changing the semaphore's spec now and then.
    pub async fn run(mut self, until: Instant) {
        while Instant::now() < until {
            sleep(Duration::from_millis(self.rng.between(200, 2_000))).await;
            if self.rng.one_in(5) {
                let i = SEMAPHORE;
                self.spec[i] = self.rng.between(1, 3) as u32;
                let max = self.spec[i];
                self.world.with(|s| s.max_holders[i] = s.max_holders[i].max(max));
                self.world
                    .log(format!("operator: {} spec maxHolders {max}", LOCKS[i].name));
            }
            for (i, l) in LOCKS.iter().enumerate() {
                if !super::relock::declared(&self.world, i, &mut self.status[i]) {
                    continue;
                }
                match self.reconcile(i).await {
                    Ok(()) => super::relock::published(&self.world, i),
                    Err(e) => self.world.log(format!("operator: {}: {e}", l.name)),
                }
            }
        }
    }

    /// Makes etcd have lock `i`'s spec under the epoch the rule picks, recording a new epoch
    /// in the status before etcd gets it, as `operator/reconcile/publish.rs` does.
    pub async fn reconcile(&mut self, i: usize) -> Result<(), LockError> {
        let (l, id) = (&LOCKS[i], lock_id(&LOCKS[i]));
        let state = self.store.lock_state(&id, self.spec[i]).await?;
        let status = &mut self.status[i];
        for h in &state.queue.holders {
            let token = Token::from_raw(h.fencing_token);
            status.token = status.token.max(Some(token));
        }
        let returned = self.world.with(|s| s.returned[i]);
        let choice = epoch::choose(*status, state.epoch(), (state.revision, returned)).map_err(|source| {
            LockError::Token {
                lock: id.clone(),
                source,
            }
        })?;
        let want = settings(l, self.spec[i], choice.epoch);
        if state.settings == Some(want) {
            self.world.with(|s| s.returned[i] = false);
            return Ok(());
        }
        status.published = status.published.max(Some(choice.epoch));
        let renew = choice.renewal.is_some();
        let ended = (self.store)
            .publish(&id, &want, "", state.settings_revision, renew)
            .await?;
        if ended.is_some() {
            self.world.with(|s| s.returned[i] = false);
        }
        let why = choice.renewal.map(|r| format!(": {r}")).unwrap_or_default();
        self.world.log(format!(
            "operator: {} published maxHolders {} epoch {} ({ended:?} keys ended){why}",
            l.name, want.max_holders, want.epoch
        ));
        Ok(())
    }
}

/// Writes `l`'s settings with `max_holders` as `podlock declare` does, keeping the epoch etcd
/// has; a declare that meets a change of the settings is not tried again (for scenes, which
/// play one interleaving without an operator).
pub(super) async fn declare(store: &Store, l: &LockSpec, max_holders: u32) -> Result<(), LockError> {
    let id = lock_id(l);
    let state = store.lock_state(&id, max_holders).await?;
    let s = settings(l, max_holders, state.epoch().unwrap_or(0));
    (store.publish(&id, &s, "", state.settings_revision, false).await).map(drop)
}

fn settings(l: &LockSpec, max_holders: u32, epoch: u32) -> Settings {
    Settings {
        ttl_seconds: TTL,
        max_holders,
        heartbeat_timeout_seconds: l.heartbeat,
        max_hold_seconds: 0,
        epoch,
    }
}

/// `l`'s identity.
pub fn lock_id(l: &LockSpec) -> LockId {
    LockId::new(NAMESPACE, l.name).expect("a valid name")
}
