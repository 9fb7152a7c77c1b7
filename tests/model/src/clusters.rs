//! Locks shared by several clusters (docs/operator.md, "Locks shared by several clusters"):
//! the pods of every cluster queue on one etcd, and each cluster's operator ends the holds of
//! the pods it judges gone. The queue protocol is the same; what changes is who may end a hold.
//! An operator knows only its own API server's pods: a pod of another cluster is not found
//! there, so it must judge only the entries that name its own cluster, or it would end the
//! holds of live pods it cannot see ([`Bug::ForeignPods`]).

use crate::model::{Action, Protocol};
use crate::runs::{Expect, HOLDS, Run, spec};
use crate::spec::{Bug, ClientSpec as C, Spec};
use crate::state::{Broken, State};

/// Safety: an operator ends only the holds of dead pods of its own cluster.
pub const OWN: &str = "own cluster: an operator ends only its own cluster's dead pods' holds";
/// Reached: a dead pod's holds were ended by its cluster's operator.
pub const REVOKED: &str = "a dead pod's holds ended by its cluster's operator";

impl Protocol {
    /// Each operator's revocations possible now: of the pods with a lease that it judges gone.
    pub fn revocations(&self, s: &State, out: &mut Vec<Action>) {
        let clusters = self.spec.clusters.iter().copied().max().map_or(0, |c| c + 1);
        for (p, pod) in s.pods.iter().enumerate().filter(|(_, pod)| pod.lease) {
            for c in 0..clusters {
                if self.judges_gone(c, p as u8, pod.crashed) {
                    out.push(Action::Revoke(c, p as u8));
                }
            }
        }
    }

    /// Whether the operator of `cluster` judges pod `p` gone: a pod of its cluster that died
    /// (its API server says so); with [`Bug::ForeignPods`], also any pod of another cluster.
    fn judges_gone(&self, cluster: u8, p: u8, crashed: bool) -> bool {
        let own = self.spec.clusters[p as usize] == cluster;
        match self.spec.bug {
            Some(Bug::ForeignPods) => crashed || !own,
            _ => own && crashed,
        }
    }

    /// An operator revokes pod `p`'s lease, which deletes every key bound to it.
    pub fn revoke(&self, s: &mut State, p: u8) {
        if s.pods[p as usize].crashed {
            s.revoked = true;
        } else {
            s.broken.get_or_insert(Broken::LiveRevoked);
        }
        s.end_lease(p, &self.owners);
    }
}

/// A mutex shared by pods of two clusters: pod 0 in cluster 0, pods 1 and 2 in cluster 1.
fn shared(name: &'static str, bug: Option<Bug>) -> Spec {
    Spec {
        clusters: vec![0, 1, 1],
        bug,
        ..spec(
            name,
            vec![1],
            vec![vec![]],
            vec![C::new(0, 0), C::new(1, 0).acquires(2), C::new(2, 0).connection()],
        )
    }
}

/// The runs of locks shared by clusters.
pub fn runs() -> Vec<Run> {
    vec![
        Run {
            spec: shared("two clusters", None),
            about: "a mutex taken by pods of two clusters; a pod dies (the fault) and its \
                    cluster's operator revokes its lease, whenever it likes",
            expect: HOLDS,
        },
        Run {
            spec: shared(
                "bug: an operator judges other clusters' pods",
                Some(Bug::ForeignPods),
            ),
            about: "an operator ignores the cluster an entry names, so another cluster's live pod, \
                    unknown to its API server, looks deleted",
            expect: Expect::Finds(OWN),
        },
    ]
}
