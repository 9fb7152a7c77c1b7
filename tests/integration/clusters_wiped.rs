//! A lock two clusters share over an etcd wiped twice: the edges review's finding 6. Each
//! operator chooses the token epoch from its own status, which only its own API server keeps;
//! a cluster whose status never learned the epoch the other published can publish it again
//! after the second wipe, and its tokens fall below earlier ones until an operator that knows
//! reconciles (docs/design.md, "Where the engine and the model part ways"; the model's run
//! `two clusters publish, etcd wiped twice`). Run with `--nocapture` to see the tokens.

use serde_json::json;

use crate::clusters::Cluster;
use crate::common::kube::{other_cluster, with_crd};
use crate::common::store::FencedStore;
use crate::common::{EtcdServer, Sidecar};
use crate::etcd_rebuild::granted_after_rebuild;

const LOCK: &str = "ledger";

/// The first token `s` is granted once the lock is published again after a wipe; released
/// at once.
async fn next_token(s: &Sidecar) -> i64 {
    let token = granted_after_rebuild(s, LOCK).await;
    let (status, body) = s.post(LOCK, "release", json!({})).await;
    assert_eq!(status, 200, "{body}");
    token
}

/// West's operator is down while east moves the lock to epoch 1 and hands out tokens, then
/// east's is down over a second wipe, and west publishes epoch 1 again: its token falls (the
/// window). Then east reconciles: its status knows the highest token, so it moves west's
/// settings to epoch 2, and the next token lies above every earlier one. Fails on the engine
/// before finding 6's fix with `east's status never showed epoch 2 ... fencing_token:
/// Some(1099511627790), fencing_epoch: Some(1) ... "the settings cluster west published are
/// live in etcd"`: east left west's settings alone.
#[tokio::test]
async fn the_cluster_that_knows_the_tokens_fell_moves_the_lock_above_them() {
    let ns = "clusters-wiped";
    let mut etcd = EtcdServer::start().await;
    let east = Cluster::start("east", with_crd(), ns, &etcd.endpoint).await;
    let west = Cluster::start("west", other_cluster(), ns, &etcd.endpoint).await;
    east.declare(ns, LOCK, "{}");
    west.declare(ns, LOCK, "{}");
    west.shows(LOCK, "Free", |s| s.phase.as_deref() == Some("Free"))
        .await;
    let west_plane = west.stop();
    // West's operator is down from here: its status never learns epoch 1.
    let s = Sidecar::start(&etcd.endpoint, "pod-a", &["--namespace", ns]).await;
    let store = FencedStore::start().await;
    etcd.wipe().await;
    for _ in 0..5 {
        assert_eq!(store.write(next_token(&s).await, "pod-a").await, 200);
    }
    let held = s.must_acquire(LOCK, json!({})).await;
    assert_eq!(store.write(held, "pod-a").await, 200);
    east.shows(LOCK, "the highest token", |st| st.fencing_token == Some(held))
        .await;
    let (status, body) = s.post(LOCK, "release", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let east_plane = east.stop();
    etcd.wipe().await;
    let west = Cluster::start("west", west_plane, ns, &etcd.endpoint).await;
    let fell = next_token(&s).await;
    eprintln!("epoch 1 up to token {held}; west published after the second wipe: token {fell}");
    assert!(fell < held, "the window did not open: token {fell} after {held}");
    let east = Cluster::start("east", east_plane, ns, &etcd.endpoint).await;
    east.shows(LOCK, "epoch 2", |st| st.fencing_epoch >= Some(2))
        .await;
    let after = next_token(&s).await;
    eprintln!("east reconciled: token {after}");
    assert!(
        after > held,
        "east's status knew token {held} and reconciled, yet the next token was {after}\n{}",
        east.log()
    );
    assert_eq!(store.write(after, "pod-a").await, 200);
    west.shows(LOCK, "epoch 2 mirrored", |st| st.fencing_epoch >= Some(2))
        .await;
}
