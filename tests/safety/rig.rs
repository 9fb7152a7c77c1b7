//! The processes under test: a 3-member etcd (each member in its own network namespace), two
//! clusters' operators with the locks as DistributedLocks ([`clusters`](super::clusters)), a
//! Pod and a sidecar per worker.

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use std::sync::Arc;
use std::time::Duration;

use super::clusters::{self, Cluster};
use super::faults::LATE;
use super::objects::{NAMESPACE, apply_lock, published_limit};
use super::worker::Slot;
use super::{COUNTER, POOL, POOL_SLOTS, RW, SIDECARS, WORKERS};
use crate::common::held::HeldRequests;
use crate::common::kube::{other_cluster, running_pod, with_crd};
use crate::common::members::leader_of;
use crate::common::netns::MemberNet;
use crate::common::{EtcdServer, Sidecar, wait_until};

/// The processes under test.
pub struct Rig {
    /// The etcd members (dropped, so killed, before their network).
    pub etcd: Vec<EtcdServer>,
    /// The members' network, where one can be partitioned.
    pub net: MemberNet,
    /// Their client URLs, comma-separated.
    pub endpoints: String,
    /// The proxies in front of them, as the sidecars get them, comma-separated: a member can
    /// be made to answer late ([`Kind::LateAnswers`](super::faults::Kind::LateAnswers)).
    pub proxied: String,
    /// What makes a member behind its proxy answer late.
    pub late: HeldRequests,
    /// The two clusters: east publishes the locks, west declares them too.
    pub clusters: [Cluster; 2],
    /// Pod `i`'s uid now (a pod made again has a new one).
    pub uids: Vec<String>,
    /// Sidecar `i` serves pod `w{i}`.
    pub sidecars: Vec<Sidecar>,
    /// The workers' slots, as [`WORKERS`]: the mutex's first, on sidecars 0 to 2.
    pub slots: Vec<Arc<Slot>>,
}

impl Rig {
    /// Starts etcd and the operator, declares the locks as DistributedLocks, makes the Pods
    /// and their sidecars, and a slot for each of [`WORKERS`].
    pub async fn start() -> Self {
        let net = MemberNet::create(3);
        let etcd = EtcdServer::cluster_on(&net, 3).await;
        let endpoints = (etcd.iter().map(|m| m.endpoint.clone()))
            .collect::<Vec<_>>()
            .join(",");
        let east = Cluster::start(0, with_crd(), &endpoints).await;
        let locks = [(COUNTER, 1), (POOL, POOL_SLOTS), (RW, 1)];
        for (lock, limit) in locks {
            apply_lock(east.plane, lock, limit).await;
        }
        let published = wait_until(Duration::from_secs(20), || async {
            for (lock, _) in locks {
                if published_limit(&endpoints, lock).await.is_none() {
                    return false;
                }
            }
            true
        });
        published
            .await
            .unwrap_or_else(|e| panic!("locks not published: {e}\n{}", east.operator.log()));
        // West declares them once east has published them: east's settings stay in force.
        let west = Cluster::start(1, other_cluster(), &endpoints).await;
        for (lock, limit) in locks {
            apply_lock(west.plane, lock, limit).await;
        }
        let late = HeldRequests::answers(LATE);
        let mut proxies = vec![];
        for m in &etcd {
            proxies.push(late.proxy(&m.endpoint).await);
        }
        let mut rig = Rig {
            etcd,
            net,
            endpoints,
            proxied: proxies.join(","),
            late,
            clusters: [east, west],
            uids: vec![],
            sidecars: vec![],
            slots: vec![],
        };
        for i in 0..SIDECARS {
            rig.uids.push(running_pod(rig.pods_of(i), &format!("w{i}")).await);
            let s = rig.start_sidecar(i).await;
            rig.sidecars.push(s);
        }
        for w in WORKERS {
            let addr = &rig.sidecars[w.sidecar].addr;
            let pod = format!("w{}", w.sidecar);
            rig.slots.push(Slot::new(&pod, w.lock, w.sidecar, addr));
        }
        rig
    }

    /// A new sidecar for pod `i` in place of its old one (killed first), and its workers told
    /// where it listens.
    pub async fn replace_sidecar(&mut self, i: usize) {
        self.sidecars[i].kill9();
        self.sidecars[i] = self.start_sidecar(i).await;
        for s in self.slots.iter().filter(|s| s.sidecar == i) {
            *s.addr.lock().unwrap() = self.sidecars[i].addr.clone();
        }
    }

    /// The pods' API of sidecar `i`'s cluster.
    pub fn pods_of(&self, i: usize) -> &Api<Pod> {
        &self.clusters[clusters::of(i)].pods
    }

    /// Applies DistributedLock `lock` with `max_holders` in both clusters, east first.
    pub async fn apply_everywhere(&self, lock: &str, max_holders: u32) {
        for c in &self.clusters {
            apply_lock(c.plane, lock, max_holders).await;
        }
    }

    /// A new sidecar for worker `i`'s pod.
    pub async fn start_sidecar(&self, i: usize) -> Sidecar {
        let cluster = clusters::NAMES[clusters::of(i)];
        let args = [
            "--namespace",
            NAMESPACE,
            "--pod-uid",
            &self.uids[i],
            "--cluster",
            cluster,
        ];
        Sidecar::start(&self.proxied, &format!("w{i}"), &args).await
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
