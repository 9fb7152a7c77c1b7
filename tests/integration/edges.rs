//! The lock's life at its edges (issue #40's findings), on a real etcd through the operator's
//! door (`Store`): a lock removed and declared again keeps its token epoch, and two clusters
//! withdrawing at once leave nothing of the lock behind.

use podlock::lock::{LockId, Settings, Store};

use crate::common::{EtcdServer, declare};

async fn store(etcd: &EtcdServer) -> Store {
    Store::new(etcd.client().await)
}

/// The token epoch in `lock`'s settings as etcd has them (`None`: no settings).
async fn epoch(etcd: &EtcdServer, lock: &str) -> Option<u64> {
    let key = format!("/podlock/v1/config/default/{lock}");
    let resp = etcd.client().await.get(key, None).await.unwrap();
    let kv = resp.kvs().first()?;
    let settings: serde_json::Value = serde_json::from_slice(kv.value()).unwrap();
    Some(settings["epoch"].as_u64().unwrap_or(0))
}

/// Finding 1: the removal deleted the settings and the epoch in them, so a lock declared
/// again published under epoch 0, its tokens bare revisions below every token of the epoch
/// an etcd wipe had moved it to. Fails on the old removal with `epoch Some(0) after
/// --delete and declare`.
#[tokio::test]
async fn a_lock_removed_and_declared_again_keeps_its_token_epoch() {
    let etcd = EtcdServer::start().await;
    let store = store(&etcd).await;
    let lock = LockId::new("default", "ledger").unwrap();
    let moved = Settings {
        epoch: 3,
        ..Settings::default()
    };
    assert_eq!(store.publish(&lock, &moved, "", 0, false).await.unwrap(), Some(0));
    declare(&etcd.endpoint, &["ledger", "--delete"]);
    assert_eq!(epoch(&etcd, "ledger").await, None);
    declare(&etcd.endpoint, &["ledger"]);
    let kept = epoch(&etcd, "ledger").await;
    assert_eq!(kept, Some(3), "epoch {kept:?} after --delete and declare");
    // A withdrawal (the DistributedLock deleted) keeps it too.
    let withdrawn = store.withdraw(&lock, "").await.unwrap().unwrap();
    assert!(withdrawn.removed, "{withdrawn:?}");
    declare(&etcd.endpoint, &["ledger"]);
    let kept = epoch(&etcd, "ledger").await;
    assert_eq!(kept, Some(3), "epoch {kept:?} after a withdrawal and declare");
    // Once published again the settings carry it; a lock that never left epoch 0 keeps
    // nothing.
    declare(&etcd.endpoint, &["plain"]);
    declare(&etcd.endpoint, &["plain", "--delete"]);
    assert_eq!(etcd.count("/podlock/v1/retired/").await, 0);
}

/// Finding 4: two clusters whose DistributedLocks are deleted at the same moment each saw the
/// other's declaration, took off their own and left the settings in etcd with no
/// DistributedLock anywhere. Fails on the old withdrawal with `settings left: 1`.
#[tokio::test]
async fn two_clusters_withdrawing_at_once_leave_nothing_behind() {
    let etcd = EtcdServer::start().await;
    let store = store(&etcd).await;
    for round in 0..5 {
        let lock = LockId::new("default", &format!("shared-{round}")).unwrap();
        store.declare_in(&lock, "east").await.unwrap();
        store.declare_in(&lock, "west").await.unwrap();
        let settings = Settings::default();
        store.publish(&lock, &settings, "east", 0, false).await.unwrap();
        let (east, west) = tokio::join!(store.withdraw(&lock, "east"), store.withdraw(&lock, "west"));
        let (east, west) = (east.unwrap().unwrap(), west.unwrap().unwrap());
        let settings_left = etcd
            .count(&format!("/podlock/v1/config/default/{}", lock.name))
            .await;
        let declared_left = etcd
            .count(&format!("/podlock/v1/declared/default/{}/", lock.name))
            .await;
        assert_eq!(
            (settings_left, declared_left),
            (0, 0),
            "settings left: {settings_left}, declarations left: {declared_left} (east {east:?}, west {west:?})"
        );
        assert!(east.removed || west.removed, "east {east:?}, west {west:?}");
    }
}
