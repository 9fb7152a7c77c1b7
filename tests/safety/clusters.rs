//! The run's two clusters: two control planes, each with its own operator (`--cluster-name
//! east` and `west`) on the one lock etcd, each declaring the three locks. Most workers' pods
//! are east's; those of [`WEST`] are west's, so the mutex and the semaphore and reader-writer
//! lock each have holders of both clusters, and a Pod deletion or force release lands on
//! whichever cluster holds. Each operator must end only its own cluster's holds
//! ([`foreign_ends`]), though the other's pods are unknown to its API server.

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use super::objects::{NAMESPACE, pods};
use crate::common::kube::{ControlPlane, Operator};

/// The clusters' names, by index.
pub const NAMES: [&str; 2] = ["east", "west"];

/// The sidecars whose pods are west's: a mutex worker's, and the one of the semaphore's and
/// reader-writer lock's sidecars that also runs `podlock lock`.
pub const WEST: [usize; 2] = [2, 5];

/// The cluster (index into [`NAMES`]) of sidecar `i`'s pod.
pub fn of(i: usize) -> usize {
    usize::from(WEST.contains(&i))
}

/// One cluster.
pub struct Cluster {
    /// Its control plane.
    pub plane: &'static ControlPlane,
    /// Its operator, on the lock etcd.
    pub operator: Operator,
    /// Its pods in the checker's namespace.
    pub pods: Api<Pod>,
}

impl Cluster {
    /// Starts cluster `c`'s operator on `plane`, its locks in the etcd at `endpoints`.
    pub async fn start(c: usize, plane: &'static ControlPlane, endpoints: &str) -> Self {
        plane.namespace(NAMESPACE);
        let name = ["--cluster-name", NAMES[c]];
        let operator = Operator::start_with(plane, NAMESPACE, endpoints, &name).await;
        Cluster {
            plane,
            operator,
            pods: pods(plane).await,
        }
    }
}

/// The lines of cluster `c`'s operator `log` in which it ended a hold of a pod of the other
/// cluster.
pub fn foreign_ends(log: &str, c: usize) -> Vec<String> {
    let foreign = |pod: &str| (0..super::SIDECARS).any(|i| of(i) != c && pod == format!("w{i}"));
    (log.lines())
        .filter(|l| l.contains("ended hold of a dead pod"))
        .filter(|l| pod_field(l).is_some_and(foreign))
        .map(String::from)
        .collect()
}

/// The value of a log line's `pod=` field, quoted or not.
fn pod_field(line: &str) -> Option<&str> {
    let rest = line.split(" pod=").nth(1)?;
    let value = rest.split_whitespace().next()?;
    Some(value.trim_matches('"'))
}

/// How many lines of `log` say the operator ended a dead pod's hold.
pub fn ends(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("ended hold of a dead pod"))
        .count()
}
