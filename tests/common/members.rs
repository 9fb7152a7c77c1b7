//! What tests ask of one etcd member behind podlock's back: how many watchers it serves, and
//! deleting a lock's queue keys.

use std::time::{Duration, Instant};

use super::{EtcdAt, sum_metric};

impl EtcdAt {
    /// How many watchers this member serves now (etcd's own gauge). Never ask a stopped
    /// (SIGSTOPped) member: it does not answer.
    pub async fn watchers(&self) -> u64 {
        let url = format!("{}/metrics", self.endpoint);
        let text = reqwest::get(url).await.unwrap().text().await.unwrap();
        sum_metric(&text, "etcd_debugging_mvcc_watcher_total") as u64
    }

    /// Deletes every queue key of `lock` (namespace `default`), as a revocation or an operator
    /// would; panics if there was none.
    pub async fn delete_queue(&self, lock: &str) {
        let opts = etcd_client::DeleteOptions::new().with_prefix();
        let prefix = format!("/podlock/v1/queue/default/{lock}/");
        let deleted = self.client().await.delete(prefix, Some(opts)).await.unwrap();
        assert!(deleted.deleted() > 0, "no key of {lock} to delete");
    }
}

/// The first of `members` to serve more watchers than it did in `before` (same order), once
/// one does within 5 s.
pub async fn watched_member(members: &[&EtcdAt], before: &[u64]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        for (i, m) in members.iter().enumerate() {
            if m.watchers().await > before[i] {
                return i;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no member took the new watch within 5 s");
}

/// The index of the member of `cluster` that says it leads, if one does.
pub async fn leader_of(cluster: &[super::EtcdServer]) -> Option<usize> {
    for (i, m) in cluster.iter().enumerate() {
        if m.is_leader().await {
            return Some(i);
        }
    }
    None
}

/// The index of `cluster`'s leader, once it has elected one (within 5 s; panics otherwise).
pub async fn elected(cluster: &[super::EtcdServer]) -> usize {
    for _ in 0..100 {
        if let Some(leader) = leader_of(cluster).await {
            return leader;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the cluster elected no leader within 5 s");
}
