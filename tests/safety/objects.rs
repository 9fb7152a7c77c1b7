//! The Kubernetes side of the checker: the locks are DistributedLocks that an operator
//! publishes to the checker's etcd, each worker's sidecar belongs to a Pod, and the faults that
//! change a lock or delete a pod go through the API server, as a user's or a kubelet's would.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use podlock::crd::DistributedLock;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::clusters;
use super::faults::Kind;
use super::rig::Rig;
use super::{COUNTER, POOL, TTL, now};
use crate::common::kube::{ControlPlane, running_pod};
use crate::common::wait_until;

/// The namespace of the checker's locks and pods.
pub const NAMESPACE: &str = "safety";

/// Creates (or changes) the DistributedLock `lock` with the checker's TTL and `max_holders`,
/// by a server-side apply. Each attempt is bounded and retried: a `kubectl apply` (which fetches
/// the OpenAPI schema each time) once took a minute on a loaded machine, starving the run; so
/// every change of a DistributedLock here goes through the API client, not kubectl.
pub async fn apply_lock(plane: &ControlPlane, lock: &str, max_holders: u32) {
    let locks: Api<DistributedLock> = Api::namespaced(plane.client().await, NAMESPACE);
    let object = serde_json::json!({
        "apiVersion": "podlock.io/v1alpha1",
        "kind": "DistributedLock",
        "metadata": {"name": lock, "namespace": NAMESPACE},
        "spec": {"ttlSeconds": TTL.as_secs(), "maxHolders": max_holders},
    });
    let (params, patch) = (PatchParams::apply("safety").force(), Patch::Apply(&object));
    for tries in 1.. {
        let apply = locks.patch(lock, &params, &patch);
        match tokio::time::timeout(Duration::from_secs(10), apply).await {
            Ok(Ok(_)) => return,
            Ok(Err(e)) if tries < 3 => eprintln!("  apply DistributedLock {lock}: {e}; retrying"),
            Err(_) if tries < 3 => eprintln!("  apply DistributedLock {lock}: no answer in 10 s; retrying"),
            failed => panic!("apply DistributedLock {lock}: {failed:?}"),
        }
    }
}

/// Deletes the DistributedLock `lock` in each cluster, east first, each waiting until its
/// operator withdrew from it in etcd (its finalizer), and creates it again in each, east first.
pub async fn recreate_lock(rig: &Rig, lock: &str, max_holders: u32) {
    for c in &rig.clusters {
        let locks: Api<DistributedLock> = Api::namespaced(c.plane.client().await, NAMESPACE);
        let deleted = locks.delete(lock, &DeleteParams::default()).await;
        deleted.unwrap_or_else(|e| panic!("delete DistributedLock {lock}: {e}"));
        let gone = wait_until(Duration::from_secs(20), || async {
            matches!(locks.get_opt(lock).await, Ok(None))
        });
        gone.await.unwrap_or_else(|e| {
            panic!(
                "DistributedLock {lock} not withdrawn ({e}):\n{}",
                c.operator.log()
            )
        });
    }
    rig.apply_everywhere(lock, max_holders).await;
}

/// The `maxHolders` etcd holds for `lock` now (`None`: not declared, or etcd did not answer
/// within a second).
pub async fn published_limit(endpoints: &str, lock: &str) -> Option<u64> {
    let read = read_limit(endpoints, lock);
    tokio::time::timeout(Duration::from_secs(1), read).await.ok()?
}

async fn read_limit(endpoints: &str, lock: &str) -> Option<u64> {
    let endpoints: Vec<&str> = endpoints.split(',').collect();
    let mut etcd = etcd_client::Client::connect(endpoints, None).await.ok()?;
    let key = format!("/podlock/v1/config/{NAMESPACE}/{lock}");
    let resp = etcd.get(key, None).await.ok()?;
    let settings: serde_json::Value = serde_json::from_slice(resp.kvs().first()?.value()).ok()?;
    settings["maxHolders"].as_u64()
}

impl Rig {
    /// Sets the semaphore's `maxHolders` on its DistributedLock and waits until the operator
    /// has published it; returns when the patch was sent (the fault's `until` is when etcd was
    /// seen to hold the new value, so the checker allows either limit in between).
    pub async fn patch_pool_limit(&self, limit: u32) -> f64 {
        let at = now();
        self.apply_everywhere(POOL, limit).await;
        let published = wait_until(Duration::from_secs(10), || async {
            published_limit(&self.endpoints, POOL).await == Some(limit.into())
        })
        .await;
        published.unwrap_or_else(|e| {
            panic!(
                "maxHolders {limit} not published: {e}\n{}",
                self.clusters[0].operator.log()
            )
        });
        at
    }

    /// Deletes the Pod of a mutex holder while its sidecar runs on, unaware, as behind a lost
    /// kubelet: its cluster's operator must end its hold. The clusters take turns by `round`;
    /// one of that cluster's mutex workers is made to stall once it holds, heartbeating (a hung
    /// app: nothing but the operator would end its hold), and its pod is deleted then (or after
    /// 10 s without a hold). Once the lock has moved on (or after twice the TTL), the pod comes
    /// back under the same name with a new uid, as a StatefulSet's would, with a new sidecar
    /// (the old one killed with it).
    pub async fn delete_pod(&mut self, round: usize) -> (usize, f64) {
        let cluster = (round / Kind::CYCLE.len()) % 2;
        let mine: Vec<usize> = (0..self.counter_workers())
            .filter(|&i| clusters::of(self.slots[i].sidecar) == cluster)
            .collect();
        let i = mine[round / (2 * Kind::CYCLE.len()) % mine.len()];
        self.start_stall(Kind::PodDeleted, i).await;
        let pod = self.slots[i].pod.clone();
        let pods = self.pods_of(self.slots[i].sidecar).clone();
        let at = now();
        pods.delete(&pod, &DeleteParams::default()).await.unwrap();
        let _ = wait_until(2 * TTL, || async { self.holder().await.is_some_and(|h| h != i) }).await;
        let gone = wait_until(Duration::from_secs(10), || async {
            pods.get_opt(&pod).await.unwrap().is_none()
        });
        gone.await.expect("the deleted pod is gone");
        self.sidecars[i].kill9(); // before its pod comes back: it never serves the new uid
        self.uids[i] = running_pod(&pods, &pod).await;
        self.replace_sidecar(i).await;
        (i, at)
    }

    /// An administrator's request about the mutex's holder, by annotation: a force release
    /// (`podlock.io/release`) or a request to yield within 1 s (`podlock.io/yield`). On odd
    /// rounds by its holder id, of a worker stalled between its grant and its write (a hung app
    /// whose heartbeats go on: nothing else would end its hold; asked to yield, every other one
    /// heeds it), else as `*`, on whoever holds; waits until the operator has acted (the
    /// annotation is gone). Returns the stalled worker (else the holder's, or 0) and when the
    /// annotation was set.
    pub async fn administer(&self, kind: Kind, round: usize) -> (usize, f64) {
        let stalled = match round % 2 {
            1 => {
                let i = round % self.counter_workers();
                // Every other cycle's request to yield is heeded.
                let heeds = kind == Kind::YieldAsked && (round / Kind::CYCLE.len()).is_multiple_of(2);
                self.slots[i].heeds_yield.store(heeds, Ordering::Relaxed);
                self.start_stall(kind, i).await
            }
            _ => None,
        };
        let (_, info) = self.sidecars[0].get(&format!("/v1/locks/{COUNTER}")).await;
        let value = match info["holders"][0]["holderId"].as_str() {
            Some(holder) if stalled.is_some() => holder.to_string(),
            _ => "*".to_string(),
        };
        let target = match stalled {
            Some(i) => i,
            None => self.holder().await.unwrap_or(0),
        };
        // Asked of the target's own cluster, whose operator alone may end its hold.
        let cluster = &self.clusters[clusters::of(self.slots[target].sidecar)];
        let (annotation, also) = match kind {
            Kind::YieldAsked => ("podlock.io/yield", Some("podlock.io/yield-grace=1s")),
            _ => ("podlock.io/release", None),
        };
        let at = now();
        tokio::task::block_in_place(|| {
            annotate(cluster.plane, COUNTER, &format!("{annotation}={value}"), also)
        });
        let acted = wait_until(Duration::from_secs(10), || async {
            !tokio::task::block_in_place(|| pending(cluster.plane, COUNTER, annotation))
        })
        .await;
        acted.unwrap_or_else(|e| {
            panic!(
                "the operator never acted on {annotation} ({e}):\n{}",
                cluster.operator.log()
            )
        });
        (target, at)
    }
}

/// Sets the annotation `set` (and `also`) on the DistributedLock `lock`, as an administrator
/// would.
fn annotate(plane: &ControlPlane, lock: &str, set: &str, also: Option<&str>) {
    let mut args = vec!["annotate", "dlock", lock, "-n", NAMESPACE, set, "--overwrite"];
    args.extend(also);
    let (ok, _, err) = plane.kubectl(&args);
    assert!(ok, "annotate DistributedLock {lock}: {err}");
}

/// Whether the DistributedLock `lock` still carries the request `annotation`.
fn pending(plane: &ControlPlane, lock: &str, annotation: &str) -> bool {
    let path = format!(
        "jsonpath={{.metadata.annotations.{}}}",
        annotation.replace('.', "\\.")
    );
    let (ok, out, _) = plane.kubectl(&["get", "dlock", lock, "-n", NAMESPACE, "-o", &path]);
    !ok || !out.trim().is_empty()
}

/// The checker's pods' API.
pub async fn pods(plane: &ControlPlane) -> Api<Pod> {
    Api::namespaced(plane.client().await, NAMESPACE)
}

/// The operator's Events on the mutex about force releases and requests to yield (`Released`,
/// `ReleaseNotHeld`, `YieldAsked`, `YieldReleased`, ...), each as "reason: message", for the
/// report.
pub fn release_events(plane: &ControlPlane) -> Vec<String> {
    let selector = format!("involvedObject.name={COUNTER}");
    let path = r#"jsonpath={range .items[*]}{.reason}: {.message}{"\n"}{end}"#;
    let args = [
        "get",
        "events",
        "-n",
        NAMESPACE,
        "--field-selector",
        &selector,
        "-o",
        path,
    ];
    let (_, out, _) = plane.kubectl(&args);
    (out.lines())
        .filter(|l| l.starts_with("Release") || l.starts_with("Yield"))
        .map(String::from)
        .collect()
}
