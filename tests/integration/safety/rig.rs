//! The processes under test: a 3-member etcd (each member in its own network namespace), the
//! operator with the two locks as DistributedLocks, a Pod and a sidecar per worker.

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use std::sync::Arc;
use std::time::Duration;

use super::objects::{NAMESPACE, apply_lock, pods, published_limit};
use super::worker::Slot;
use super::{COUNTER, POOL, POOL_SLOTS, WORKERS};
use crate::common::kube::{ControlPlane, Operator, running_pod, with_crd};
use crate::common::members::leader_of;
use crate::common::netns::MemberNet;
use crate::common::{EtcdServer, Sidecar, wait_until};

/// The processes under test.
pub struct Rig {
    /// The etcd members (dropped, so killed, before their network).
    pub etcd: Vec<EtcdServer>,
    /// The members' network, where one can be partitioned.
    pub net: MemberNet,
    /// Their client URLs, comma-separated, as the sidecars get them.
    pub endpoints: String,
    /// The API server of the locks and pods.
    pub plane: &'static ControlPlane,
    /// The operator, on the checker's etcd and namespace.
    pub operator: Operator,
    /// The workers' pods.
    pub pods: Api<Pod>,
    /// Pod `i`'s uid now (a pod made again has a new one).
    pub uids: Vec<String>,
    /// Sidecar `i` serves worker `i`.
    pub sidecars: Vec<Sidecar>,
    /// The workers' slots: the mutex's first, then the semaphore's.
    pub slots: Vec<Arc<Slot>>,
}

impl Rig {
    /// Starts etcd and the operator, declares the mutex and the semaphore as DistributedLocks,
    /// and makes a Pod and a sidecar for each of [`WORKERS`].
    pub async fn start() -> Self {
        let net = MemberNet::create(3);
        let etcd = EtcdServer::cluster_on(&net, 3).await;
        let endpoints = (etcd.iter().map(|m| m.endpoint.clone()))
            .collect::<Vec<_>>()
            .join(",");
        let plane = with_crd();
        plane.namespace(NAMESPACE);
        apply_lock(plane, COUNTER, 1);
        apply_lock(plane, POOL, POOL_SLOTS);
        let operator = Operator::start_with(plane, NAMESPACE, &endpoints, &[]).await;
        let published = wait_until(Duration::from_secs(20), || async {
            published_limit(&endpoints, COUNTER).await.is_some()
                && published_limit(&endpoints, POOL).await.is_some()
        });
        published
            .await
            .unwrap_or_else(|e| panic!("locks not published: {e}\n{}", operator.log()));
        let mut rig = Rig {
            etcd,
            net,
            endpoints,
            plane,
            operator,
            pods: pods(plane).await,
            uids: vec![],
            sidecars: vec![],
            slots: vec![],
        };
        for (i, lock) in WORKERS.into_iter().enumerate() {
            let pod = format!("w{i}");
            rig.uids.push(running_pod(&rig.pods, &pod).await);
            let s = rig.start_sidecar(i).await;
            rig.slots.push(Slot::new(&pod, lock, &s.addr));
            rig.sidecars.push(s);
        }
        rig
    }

    /// A new sidecar for worker `i`'s pod.
    pub async fn start_sidecar(&self, i: usize) -> Sidecar {
        let args = ["--namespace", NAMESPACE, "--pod-uid", &self.uids[i]];
        Sidecar::start(&self.endpoints, &format!("w{i}"), &args).await
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
