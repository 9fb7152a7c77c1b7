//! The processes under test: a 3-member etcd, the two locks, a sidecar per worker.

use std::sync::Arc;

use super::worker::Slot;
use super::{COUNTER, POOL, POOL_SLOTS, TTL, WORKERS};
use crate::common::members::leader_of;
use crate::common::netns::MemberNet;
use crate::common::{EtcdServer, Sidecar, declare};

/// The processes under test.
pub struct Rig {
    /// The etcd members (dropped, so killed, before their network).
    pub etcd: Vec<EtcdServer>,
    /// The members' network, where one can be partitioned.
    pub net: MemberNet,
    /// Their client URLs, comma-separated, as the sidecars get them.
    pub endpoints: String,
    /// Sidecar `i` serves worker `i`.
    pub sidecars: Vec<Sidecar>,
    /// The workers' slots: the mutex's first, then the semaphore's.
    pub slots: Vec<Arc<Slot>>,
}

impl Rig {
    /// Starts etcd, declares the mutex and the semaphore (TTL [`TTL`]), and starts a sidecar
    /// for each of [`WORKERS`].
    pub async fn start() -> Self {
        let net = MemberNet::create(3);
        let etcd = EtcdServer::cluster_on(&net, 3).await;
        let endpoints = (etcd.iter().map(|m| m.endpoint.clone()))
            .collect::<Vec<_>>()
            .join(",");
        let (ttl, slots) = (TTL.as_secs().to_string(), POOL_SLOTS.to_string());
        declare(&endpoints, &[COUNTER, "--ttl-seconds", &ttl]);
        declare(
            &endpoints,
            &[POOL, "--ttl-seconds", &ttl, "--max-holders", &slots],
        );
        let mut rig = Rig {
            etcd,
            net,
            endpoints,
            sidecars: vec![],
            slots: vec![],
        };
        for (i, lock) in WORKERS.into_iter().enumerate() {
            let pod = format!("w{i}");
            let s = Sidecar::start(&rig.endpoints, &pod, &[]).await;
            rig.slots.push(Slot::new(&pod, lock, &s.addr));
            rig.sidecars.push(s);
        }
        rig
    }

    /// How many workers take the mutex (the first ones): the victims of process faults.
    pub fn counter_workers(&self) -> usize {
        self.slots.iter().filter(|s| s.lock == COUNTER).count()
    }

    /// The index of the etcd leader, if a member says it is.
    pub async fn leader(&self) -> Option<usize> {
        leader_of(&self.etcd).await
    }

    /// The worker whose sidecar holds the mutex now, if any.
    pub async fn holder(&self) -> Option<usize> {
        let (_, info) = self.sidecars[0].get(&format!("/v1/locks/{COUNTER}")).await;
        let pod = info["holders"][0]["pod"].as_str()?;
        self.slots.iter().position(|s| s.pod == pod)
    }

    /// Whether a hold of the mutex granted after `t` has had its write accepted.
    pub fn progressed_since(&self, t: f64) -> bool {
        self.slots.iter().any(|s| {
            s.holds
                .lock()
                .unwrap()
                .iter()
                .any(|h| h.granted > t && h.write.is_some_and(|w| w.status == 200))
        })
    }
}
