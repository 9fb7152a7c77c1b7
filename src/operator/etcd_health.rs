//! `podlock_etcd_reachable`: whether this replica reaches etcd now. Every replica, leading or
//! not, probes etcd on a timer, so that an outage shows (and alerts) even while no lock changes
//! and no reconciliation runs. The probe is a linearizable read: it needs etcd's quorum, so a
//! cluster that lost its quorum counts as unreachable too. The first answer makes the replica
//! Ready ([`Readiness::etcd_answered`]).

use prometheus::IntGauge;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

use super::readiness::Readiness;
use crate::lock::Store;

/// How often etcd is probed.
const EVERY: Duration = Duration::from_secs(5);
/// How long etcd has to answer a probe.
const WITHIN: Duration = Duration::from_secs(2);

/// Probes etcd every [`EVERY`] and sets `reachable` to 1 when it answered within [`WITHIN`],
/// else 0, telling `ready` of each answer; logs each change.
pub async fn watch(store: Store, (reachable, ready): (IntGauge, Arc<Readiness>)) {
    let mut ticks = tokio::time::interval(EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let answers = store.ready(WITHIN).await;
        match (reachable.get() == 1, answers) {
            (true, false) => {
                warn!(within = ?WITHIN, "etcd does not answer (down, without quorum, unreachable or refusing the credentials)")
            }
            (false, true) => info!("etcd answers"),
            _ => {}
        }
        reachable.set(answers.into());
        if answers {
            ready.etcd_answered();
        }
    }
}
