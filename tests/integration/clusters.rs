//! Locks shared by two clusters (docs/operator.md, "Locks shared by several clusters"): two
//! real control planes, each with its own operator (`--cluster-name east` and `west`), and one
//! lock etcd (the first plane's). Each cluster's pods queue on the same lock; each operator
//! ends only its own cluster's holds, though the other cluster's pods are unknown to its API
//! server, and mirrors every holder, with its cluster, into its own status.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::kube::{ControlPlane, Operator, other_cluster, running_pod, with_crd};
use crate::common::{EtcdAt, Sidecar, wait_until};
use crate::force_release::event;
use crate::operator::lock_yaml;
use podlock::crd::{DistributedLock, DistributedLockStatus};

/// One cluster: its control plane, its operator (on the shared lock etcd) and its API's pods
/// and locks in `ns`.
pub(crate) struct Cluster {
    name: &'static str,
    plane: &'static ControlPlane,
    op: Operator,
    pods: Api<Pod>,
    locks: Api<DistributedLock>,
}

impl Cluster {
    pub(crate) async fn start(
        name: &'static str,
        plane: &'static ControlPlane,
        ns: &str,
        etcd: &str,
    ) -> Self {
        plane.namespace(ns);
        let op = Operator::start_with(plane, ns, etcd, &["--cluster-name", name]).await;
        let client = plane.client().await;
        let (pods, locks) = (Api::namespaced(client.clone(), ns), Api::namespaced(client, ns));
        Cluster {
            name,
            plane,
            op,
            pods,
            locks,
        }
    }

    pub(crate) fn declare(&self, ns: &str, lock: &str, spec: &str) {
        let yaml = lock_yaml(ns, lock, spec);
        assert!(self.plane.kubectl_stdin(&["apply", "-f", "-"], &yaml).0);
    }

    /// Waits until this cluster's status of `lock` shows `what`; fails with its operator's log.
    pub(crate) async fn shows(&self, lock: &str, what: &str, check: impl Fn(&DistributedLockStatus) -> bool) {
        let status = || async { self.locks.get_status(lock).await.ok().and_then(|dl| dl.status) };
        let shown = wait_until(Duration::from_secs(10), || async {
            status().await.as_ref().is_some_and(&check)
        });
        if let Err(e) = shown.await {
            let now = status().await;
            panic!(
                "{}'s status never showed {what} ({e}): {now:?}\n{}",
                self.name,
                self.op.log()
            );
        }
    }

    /// Stops its operator (its status stays in its API server); returns its control plane.
    pub(crate) fn stop(self) -> &'static ControlPlane {
        self.plane
    }

    /// Its operator's log so far.
    pub(crate) fn log(&self) -> String {
        self.op.log()
    }

    /// A running pod of this cluster and its sidecar (on the shared lock etcd).
    async fn pod(&self, ns: &str, name: &str, etcd: &str) -> Arc<Sidecar> {
        let uid = running_pod(&self.pods, name).await;
        let args = ["--namespace", ns, "--pod-uid", &uid, "--cluster", self.name];
        Arc::new(Sidecar::start(etcd, name, &args).await)
    }
}

/// Both clusters, lock `job` (TTL 30 s: a handoff within a second can only come from an
/// operator) declared in each, and the shared lock etcd's endpoint.
async fn clusters(ns: &str) -> (Cluster, Cluster, String) {
    let etcd = with_crd().etcd.endpoint.clone();
    let east = Cluster::start("east", with_crd(), ns, &etcd).await;
    let west = Cluster::start("west", other_cluster(), ns, &etcd).await;
    east.declare(ns, "job", "{ttlSeconds: 30}");
    west.declare(ns, "job", "{ttlSeconds: 30}");
    for c in [&east, &west] {
        c.shows("job", "Free", |s| s.phase.as_deref() == Some("Free"))
            .await;
    }
    (east, west, etcd)
}

/// Starts `waiter`'s acquire of `job`; returns its answer's status and when it came.
fn acquire_later(waiter: &Arc<Sidecar>) -> tokio::task::JoinHandle<(u16, Instant)> {
    let waiter = waiter.clone();
    tokio::spawn(async move {
        let (status, _) = waiter.post("job", "acquire", json!({})).await;
        (status, Instant::now())
    })
}

#[tokio::test]
async fn a_pod_of_one_cluster_waits_behind_another_clusters_and_only_its_operator_ends_it() {
    let ns = "clusters";
    let (east, west, etcd) = clusters(ns).await;
    let a = east.pod(ns, "app-east", &etcd).await;
    let b = west.pod(ns, "app-west", &etcd).await;
    b.must_acquire("job", json!({})).await;
    let granted = acquire_later(&a);
    // East's API server has no pod app-west: an operator judging it would end its hold now.
    let shown = |c: &'static str| {
        move |s: &DistributedLockStatus| {
            s.waiters == 1
                && (s.holders.first()).is_some_and(|h| h.pod == "app-west" && h.cluster.as_deref() == Some(c))
        }
    };
    east.shows("job", "west's holder and a waiter", shown("west"))
        .await;
    west.shows("job", "west's holder and a waiter", shown("west"))
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!granted.is_finished(), "east's pod was let in while west's held");
    let (_, lock) = b.get("/v1/locks/job").await;
    assert_eq!(lock["holders"][0]["pod"], "app-west", "{lock}");
    assert_eq!(lock["holders"][0]["cluster"], "west", "{lock}");
    let deleted = Instant::now();
    west.pods
        .delete("app-west", &DeleteParams::default())
        .await
        .unwrap();
    let (status, at) = tokio::time::timeout(Duration::from_secs(5), granted)
        .await
        .expect("granted")
        .unwrap();
    assert_eq!(status, 200);
    let handoff = at - deleted;
    println!("clusters: west's pod deleted -> east's pod granted in {handoff:?}");
    assert!(handoff < Duration::from_secs(1), "{handoff:?}\n{}", west.op.log());
    assert!(
        !east.op.log().contains("app-west"),
        "east's operator judged west's pod:\n{}",
        east.op.log()
    );
}

#[tokio::test]
async fn a_cluster_withdraws_only_its_own_holds_and_releases_only_its_own_holders() {
    let ns = "clusters-withdraw";
    let (east, west, etcd) = clusters(ns).await;
    let a = east.pod(ns, "app-east", &etcd).await;
    let b = west.pod(ns, "app-west", &etcd).await;
    b.must_acquire("job", json!({})).await;
    let waiting = acquire_later(&a);
    east.shows("job", "a waiter", |s| s.waiters == 1).await;
    // An administrator of east asks to release west's holder: east's operator leaves it.
    let annotate = [
        "annotate",
        "dlock",
        "job",
        "-n",
        ns,
        "podlock.io/release=app-west",
    ];
    assert!(east.plane.kubectl(&annotate).0);
    let (kind, note) = event(east.plane, ns, "job", "ReleaseOtherCluster").await;
    assert_eq!(kind, "Warning");
    assert!(note.contains("app-west (pod app-west of cluster west"), "{note}");
    // East withdraws: its waiter's key goes, west's hold and the lock's settings stay.
    assert!(
        east.plane
            .kubectl(&["delete", "dlock", "job", "-n", ns, "--wait=true"])
            .0
    );
    let (status, _) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter ends")
        .unwrap();
    assert_ne!(status, 200, "east's waiter was granted while west's pod held");
    let (_, lock) = b.get("/v1/locks/job").await;
    assert_eq!(
        (lock["holders"][0]["pod"].as_str(), lock["waiters"].as_u64()),
        (Some("app-west"), Some(0)),
        "{lock}"
    );
    let config = format!("/podlock/v1/config/{ns}/job");
    let store = &with_crd().etcd;
    assert_eq!(
        store.count(&config).await,
        1,
        "the lock left etcd while west declares it"
    );
    // West withdraws too: the lock leaves etcd.
    assert!(
        west.plane
            .kubectl(&["delete", "dlock", "job", "-n", ns, "--wait=true"])
            .0
    );
    wait_until(Duration::from_secs(10), || async {
        store.count(&config).await == 0
    })
    .await
    .expect("the lock removed once no cluster declares it");
    assert_eq!(store.count(&format!("/podlock/v1/queue/{ns}/job/")).await, 0);
}

#[tokio::test]
async fn one_cluster_publishes_the_settings_and_the_other_reports_a_different_spec() {
    let ns = "clusters-settings";
    let etcd = with_crd().etcd.endpoint.clone();
    let east = Cluster::start("east", with_crd(), ns, &etcd).await;
    east.declare(ns, "pool", "{maxHolders: 2}");
    east.shows("pool", "Free", |s| s.phase.as_deref() == Some("Free"))
        .await;
    let west = Cluster::start("west", other_cluster(), ns, &etcd).await;
    west.declare(ns, "pool", "{maxHolders: 3}");
    let other = |s: &DistributedLockStatus| {
        s.conditions
            .iter()
            .any(|c| c.reason == "PublishedByOtherCluster" && c.message.contains("cluster east"))
    };
    west.shows("pool", "settings published by east", other).await;
    let b = west.pod(ns, "app-west", &etcd).await;
    let (_, lock) = b.get("/v1/locks/pool").await;
    assert_eq!(
        lock["maxHolders"], 2,
        "west's spec overwrote east's settings: {lock}"
    );
    let ready = west
        .locks
        .get_status("pool")
        .await
        .unwrap()
        .status
        .unwrap()
        .conditions;
    assert!(ready[0].message.contains("(maxHolders 2,"), "{:?}", ready[0]);
}

#[tokio::test]
async fn a_withdrawal_ends_its_clusters_holder_and_waiters_together() {
    let ns = "clusters-together";
    let (east, west, etcd) = clusters(ns).await;
    // East holds and waits (its holder's key sorts first), west waits last.
    let holder = east.pod(ns, "app-east", &etcd).await;
    let waiter = east.pod(ns, "app-east2", &etcd).await;
    let other = west.pod(ns, "app-west", &etcd).await;
    holder.must_acquire("job", json!({})).await;
    let east_waits = acquire_later(&waiter);
    east.shows("job", "a waiter", |s| s.waiters == 1).await;
    let west_waits = acquire_later(&other);
    east.shows("job", "two waiters", |s| s.waiters == 2).await;
    let before = with_crd().etcd.revision().await;
    assert!(
        east.plane
            .kubectl(&["delete", "dlock", "job", "-n", ns, "--wait=true"])
            .0
    );
    let (status, _) = west_waits.await.unwrap();
    assert_eq!(status, 200, "west's waiter was not granted once east withdrew");
    let (status, _) = east_waits.await.unwrap();
    assert_ne!(
        status, 200,
        "east's waiter was granted by its own cluster's withdrawal"
    );
    // Ended one by one, front first, the holder's end would admit east's waiter for a moment,
    // and its sidecar could answer that grant, already gone.
    let ended = deletions(&format!("/podlock/v1/queue/{ns}/job/"), before).await;
    assert_eq!(ended.len(), 2, "{ended:?}");
    assert_eq!(ended[0].1, ended[1].1, "not ended in one revision: {ended:?}");
}

/// A deleted pod that holds a lock under one holder id and waits for it under another: its
/// operator ends both at one revision. Ended one by one, front first, the holder's end would
/// admit the pod's own waiter for a moment, and its sidecar (still running: the kubelet is
/// gone, say) could answer that grant, already gone.
#[tokio::test]
async fn a_dead_pods_holds_and_waits_end_together() {
    let ns = "clusters-dead-pod";
    let (east, _west, etcd) = clusters(ns).await;
    let pod = east.pod(ns, "app-both", &etcd).await;
    pod.must_acquire("job", json!({"holderId": "first"})).await;
    let waits = {
        let pod = pod.clone();
        tokio::spawn(async move { pod.post("job", "acquire", json!({"holderId": "second"})).await })
    };
    east.shows("job", "a waiter", |s| s.waiters == 1).await;
    let before = with_crd().etcd.revision().await;
    east.pods
        .delete("app-both", &DeleteParams::default())
        .await
        .unwrap();
    let (status, answer) = waits.await.unwrap();
    assert_ne!(
        status, 200,
        "the dead pod's waiter was granted by its own holder's end: {answer}"
    );
    let ended = deletions(&format!("/podlock/v1/queue/{ns}/job/"), before).await;
    assert_eq!(ended.len(), 2, "{ended:?}");
    assert_eq!(ended[0].1, ended[1].1, "not ended in one revision: {ended:?}");
}

/// The deletions under `prefix` of the lock etcd after revision `from` that a second of
/// watching shows: (key, revision).
async fn deletions(prefix: &str, from: i64) -> Vec<(String, i64)> {
    deletions_in(&with_crd().etcd, prefix, from).await
}

/// The deletions under `prefix` of `etcd` after revision `from` that a second of watching
/// shows: (key, revision).
pub(crate) async fn deletions_in(etcd: &EtcdAt, prefix: &str, from: i64) -> Vec<(String, i64)> {
    let opts = etcd_client::WatchOptions::new()
        .with_prefix()
        .with_start_revision(from + 1);
    let mut client = etcd.client().await;
    let mut stream = client.watch(prefix, Some(opts)).await.unwrap();
    let mut found = vec![];
    let second = tokio::time::sleep(Duration::from_secs(1));
    tokio::pin!(second);
    loop {
        tokio::select! {
            _ = &mut second => return found,
            msg = stream.message() => {
                let events = msg.unwrap().map(|m| m.events().to_vec()).unwrap_or_default();
                let deleted = events.into_iter().filter(|e| e.event_type() == etcd_client::EventType::Delete);
                found.extend(deleted.filter_map(|e| {
                    let kv = e.kv()?;
                    Some((kv.key_str().ok()?.to_string(), kv.mod_revision()))
                }));
            }
        }
    }
}
