//! Failover: how long a waiter waits after the holder dies (kill -9) or after its node is lost
//! (holder frozen with SIGSTOP) and its Pod is deleted, with the same TTL for every lock.
//! Peers know nothing of Pods, so they wait out their TTL in both cases; podlock's operator
//! sees the Pod go and revokes the hold at once.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::kube::{ControlPlane, Operator, running_pod, with_crd};
use crate::common::{EtcdServer, Sidecar, declare, wait_until};
use crate::peers::{Peers, failover};

/// The TTL (lease, lock expiry, Lease duration) of every lock in these runs, in seconds.
pub const TTL: u32 = 5;

/// How a holder goes away.
#[derive(Clone, Copy)]
pub enum Fault {
    /// kill -9 of the holder's process (for podlock: its sidecar); no Kubernetes involved.
    Kill,
    /// The holder frozen (SIGSTOP, like a lost node) and its Pod deleted.
    PodDeleted,
}

/// A holder sidecar and a waiter sidecar queued behind it on `lock`; returns the waiter's grant.
async fn queued(
    holder: &Sidecar,
    waiter: &Arc<Sidecar>,
    lock: &'static str,
) -> tokio::task::JoinHandle<Instant> {
    holder.must_acquire(lock, json!({})).await;
    let w = waiter.clone();
    let granted = tokio::spawn(async move {
        w.must_acquire(lock, json!({"waitSeconds": 60})).await;
        Instant::now()
    });
    wait_until(Duration::from_secs(5), || async {
        holder.get(&format!("/v1/locks/{lock}")).await.1["waiters"] == 1
    })
    .await
    .expect("waiter queued");
    granted
}

/// podlock after kill -9 of the holder's sidecar, on plain etcd: the lease runs out.
pub async fn podlock_killed(etcd: &EtcdServer, trials: usize) -> Vec<Duration> {
    declare(&etcd.endpoint, &["failover", "--ttl-seconds", &TTL.to_string()]);
    let mut out = vec![];
    for t in 0..trials {
        let mut holder = Sidecar::start(&etcd.endpoint, &format!("holder-{t}"), &[]).await;
        let waiter = Arc::new(Sidecar::start(&etcd.endpoint, &format!("waiter-{t}"), &[]).await);
        let granted = queued(&holder, &waiter, "failover").await;
        holder.kill9();
        let killed = Instant::now();
        out.push(granted.await.unwrap() - killed);
    }
    out
}

/// podlock with its operator on a real API server: holder frozen, its Pod deleted.
pub async fn podlock_pod_deleted(trials: usize) -> Vec<Duration> {
    let (plane, ns) = (with_crd(), "bench");
    plane.namespace(ns);
    let lock = format!(
        "apiVersion: podlock.io/v1alpha1\nkind: DistributedLock\nmetadata: {{name: job, namespace: {ns}}}\nspec: {{ttlSeconds: {TTL}}}\n"
    );
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &lock).0);
    let _operator = Operator::start(plane, ns).await;
    wait_until(Duration::from_secs(10), || async {
        plane.etcd.count(&format!("/podlock/v1/config/{ns}/job")).await == 1
    })
    .await
    .expect("lock published by the operator");
    let pods: Api<Pod> = Api::namespaced(plane.client().await, ns);
    let mut out = vec![];
    for t in 0..trials {
        let holder = pod_sidecar(plane, &pods, ns, &format!("holder-{t}")).await;
        let waiter = Arc::new(pod_sidecar(plane, &pods, ns, &format!("waiter-{t}")).await);
        let granted = queued(&holder, &waiter, "job").await;
        holder.signal(libc::SIGSTOP);
        pods.delete(&holder.pod, &DeleteParams::default()).await.unwrap();
        let deleted = Instant::now();
        out.push(granted.await.unwrap() - deleted);
        holder.signal(libc::SIGCONT);
    }
    out
}

/// A running Pod named `name` and its sidecar.
async fn pod_sidecar(plane: &ControlPlane, pods: &Api<Pod>, ns: &str, name: &str) -> Sidecar {
    let uid = running_pod(pods, name).await;
    Sidecar::start(
        &plane.etcd.endpoint,
        name,
        &["--namespace", ns, "--pod-uid", &uid],
    )
    .await
}

/// The signal that models `fault` for a peer (it has no Pod to delete).
fn signal(fault: Fault) -> i32 {
    match fault {
        Fault::Kill => libc::SIGKILL,
        Fault::PodDeleted => libc::SIGSTOP,
    }
}

/// A lock peer (`etcd-mutex` or `redis-lock`, with its connection flags) after `fault`.
pub async fn peer(peers: &Peers, name: &str, flags: &[&str], fault: Fault, trials: usize) -> Vec<Duration> {
    let mut out = vec![];
    for t in 0..trials {
        let lock = format!("failover-{t}");
        let args = |mode: &'static str| [flags, &["-lock", &lock, mode]].concat();
        let (mut holder, mut waiter) = (
            peers.command(name, &args("hold")),
            peers.command(name, &args("wait")),
        );
        out.push(failover(&mut holder, "HELD", &mut waiter, "ACQUIRED", signal(fault)).await);
    }
    out
}

/// client-go Lease leader election on the control plane after `fault`.
pub async fn lease_election(peers: &Peers, fault: Fault, trials: usize) -> Vec<Duration> {
    let plane = with_crd();
    let kubeconfig = plane.kubeconfig.to_str().unwrap();
    let mut out = vec![];
    for t in 0..trials {
        let lease = format!("bench-failover-{t}");
        let candidate = |id: &str| {
            peers.command(
                "lease-election",
                &[
                    "-kubeconfig",
                    kubeconfig,
                    "-namespace",
                    "default",
                    "-name",
                    &lease,
                    "-id",
                    id,
                ]
                .into_iter()
                .chain(["-lease-seconds", &TTL.to_string(), "candidate"])
                .collect::<Vec<_>>(),
            )
        };
        let (mut a, mut b) = (candidate("a"), candidate("b"));
        out.push(failover(&mut a, "LEADER", &mut b, "LEADER", signal(fault)).await);
    }
    out
}
