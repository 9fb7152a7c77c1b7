//! The faults that rebuild etcd whole, every member at once, at the same addresses: a restore
//! from a snapshot with a revision bump, and a wipe. Both are finding-level edges of the lock's
//! life (#40): a restore brings back holds released after the snapshot, which the operator
//! must end under a new epoch; after a wipe the operator publishes the locks under a new epoch,
//! and the DistributedLock deleted and created again must keep it, or tokens fall.

use std::time::Duration;
use tokio::task::block_in_place;
use tokio::time::sleep;

use super::objects::{published_limit, recreate_lock};
use super::rig::Rig;
use super::{COUNTER, now};
use crate::common::{EtcdServer, Rebuild, wait_until};

/// How far a restore bumps etcd's revisions: above every revision made since the snapshot.
const BUMP: &str = "1000000";

/// How long after its snapshot etcd is restored: long enough for holds to be released and
/// granted on, so that the restore brings released ones back.
const SNAPSHOT_AGE: Duration = Duration::from_millis(1500);

impl Rig {
    /// Saves a snapshot, lets the workers go on for [`SNAPSHOT_AGE`], and restores every
    /// member from it with `--bump-revision` and `--mark-compacted`, as operations.md says to;
    /// returns when etcd went down.
    pub async fn restore_etcd(&mut self) -> (usize, f64) {
        let dir = tempfile::tempdir().unwrap();
        let snapshot = dir.path().join("podlock.db");
        block_in_place(|| self.etcd[0].snapshot(&snapshot));
        sleep(SNAPSHOT_AGE).await;
        let at = now();
        let flags = ["--bump-revision", BUMP, "--mark-compacted"];
        EtcdServer::rebuild(&mut self.etcd, Rebuild::Restore(&snapshot, &flags)).await;
        (0, at)
    }

    /// Wipes every member; once the operator has published the mutex again, deletes its
    /// DistributedLock in both clusters and creates it again; returns when etcd went down.
    pub async fn wipe_etcd(&mut self) -> (usize, f64) {
        let at = now();
        EtcdServer::rebuild(&mut self.etcd, Rebuild::Wipe).await;
        let published = wait_until(Duration::from_secs(20), || async {
            published_limit(&self.endpoints, COUNTER).await.is_some()
        });
        published.await.unwrap_or_else(|e| {
            let log = self.clusters[0].operator.log();
            panic!("the mutex was not published again after the wipe ({e}):\n{log}")
        });
        recreate_lock(self, COUNTER, 1).await;
        (0, at)
    }
}
