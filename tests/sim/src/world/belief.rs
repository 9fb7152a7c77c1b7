//! Belief (#54 item 4; the protocol model's *belief*): a client that believes it holds has its
//! key in place, or is told within a bound that it is gone. Each sample the checker looks up,
//! in the simulated etcd, the key of every hold some client was granted and not yet told is
//! over: a key gone for [`BOUND`](super::liveness::BOUND), counted past the settling of any
//! fault that touched its pod or etcd meanwhile (`liveness.rs`), while its client has not
//! asked to release it, breaks the rule: that client goes on writing as the holder. An
//! operator's force release, deadline end or lock deletion delete keys under undisturbed holds
//! all the time; the hold's own sidecar must tell its client at once (its key's watch).

use super::liveness::{Waits, pod_of};
use std::collections::{BTreeMap, BTreeSet};
use tokio::time::Instant;

/// A hold whose key is gone: its lock, holder id and token.
pub type Gone = (String, String, i64);

/// What the belief checker follows.
#[derive(Default)]
pub struct Beliefs {
    /// The holds whose keys were gone in the last sample, by lock and token: since when.
    gone: BTreeMap<(String, i64), Instant>,
    /// The holds whose clients asked to release them (answered or not): no longer believed.
    releasing: BTreeSet<(String, i64)>,
}

impl Beliefs {
    /// A client asked to release the hold of `token` of `lock`.
    pub fn releasing(&mut self, lock: &str, token: i64) {
        self.releasing.insert((lock.to_string(), token));
    }

    /// Follows the holds believed whose keys are `gone` now (`dead`: whether a holder id's pod
    /// died, its clients with it); the first gone for the bound (see [`Waits::overdue_since`]) breaks
    /// the rule.
    pub fn sample(
        &mut self,
        gone: Vec<Gone>,
        live: &Waits,
        dead: impl Fn(&str) -> bool,
    ) -> Result<(), String> {
        let now = Instant::now();
        let mut still = BTreeMap::new();
        let mut broken = None;
        for (lock, holder, token) in gone {
            let key = (lock, token);
            if self.releasing.contains(&key) || dead(&holder) {
                continue;
            }
            let since = self.gone.get(&key).copied().unwrap_or(now);
            if broken.is_none() && live.overdue_since(pod_of(&holder), since) {
                broken = Some(format!(
                    "belief: {holder} still believes it holds {} token {token}, its key gone since \
                     {:?} ago (past any fault's settling)",
                    key.0,
                    now - since
                ));
            }
            still.insert(key, since);
        }
        self.gone = still;
        broken.map_or(Ok(()), Err)
    }
}
