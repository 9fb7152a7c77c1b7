//! A whole etcd cluster rebuilt at its addresses: wiped, or restored from a snapshot, every
//! member at once (a child of `common`, so it reaches [`EtcdServer`]'s private parts).

use std::path::Path;
use std::process::Command;

use super::{EtcdServer, bin_dir};

/// How [`EtcdServer::rebuild`] makes a cluster's data again.
#[derive(Clone, Copy)]
pub enum Rebuild<'a> {
    /// Every member empty: etcd reinstalled with fresh volumes, revisions from 1 again.
    Wipe,
    /// Every member from one snapshot, with `etcdutl snapshot restore`'s extra flags (such as
    /// `--bump-revision`).
    Restore(&'a Path, &'a [&'a str]),
}

impl EtcdServer {
    /// Stops every member of a cluster, rebuilds each one's data as `how` says, and starts
    /// them again at the same addresses; returns once each is healthy. A cluster is rebuilt
    /// whole: a member wiped or restored alone would not rejoin its peers.
    pub async fn rebuild(members: &mut [EtcdServer], how: Rebuild<'_>) {
        for m in members.iter_mut() {
            m.stop();
        }
        for m in members.iter() {
            std::fs::remove_dir_all(m.dir.path().join("data")).unwrap();
            if let Rebuild::Restore(snapshot, extra) = how {
                m.restore_data(snapshot, extra);
            }
        }
        for m in members.iter_mut() {
            m.spawn();
        }
        for m in members.iter() {
            m.wait_healthy().await;
        }
    }

    /// Its data directory made from `snapshot` (`etcdutl snapshot restore`).
    fn restore_data(&self, snapshot: &Path, extra: &[&str]) {
        let out = Command::new(bin_dir().join("etcdutl"))
            .args(["snapshot", "restore"])
            .arg(snapshot)
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--name", &self.name, "--initial-cluster", &self.initial_cluster])
            .args(["--initial-advertise-peer-urls", &self.peer_url])
            .args(["--initial-cluster-token", "podlock-test"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "etcdutl snapshot restore: {err}");
    }
}
