//! A semaphore's status stays small however many hold it: `status.holders` lists the first
//! 100 holders, `holderCount` counts them all.

use futures::StreamExt;
use kube::api::Api;
use podlock::crd::DistributedLock;
use serde_json::json;

use crate::common::Sidecar;
use crate::common::kube::with_crd;
use crate::operator::{declare_until_free, operator_for, status_until};

#[tokio::test]
async fn a_semaphore_with_300_holders_lists_100_and_counts_them_all() {
    let plane = with_crd();
    let ns = plane.namespace("big-semaphore");
    let _op = operator_for(plane, &ns).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    let spec = "{ttlSeconds: 30, maxHolders: 500}";
    declare_until_free(plane, &api, &ns, "pool", spec).await;
    let sidecar = Sidecar::start(&plane.etcd.endpoint, "pod-a", &["--namespace", &ns]).await;
    let acquires =
        (0..300).map(|i| sidecar.must_acquire("pool", json!({"holderId": format!("holder-{i:03}")})));
    futures::stream::iter(acquires)
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    status_until(&api, "pool", "300 holders", |s| s.holder_count == 300).await;
    let status = api.get_status("pool").await.unwrap().status.unwrap();
    assert_eq!(status.holders.len(), 100, "the list is capped");
    let tokens: Vec<i64> = status.holders.iter().map(|h| h.fencing_token).collect();
    assert!(tokens.is_sorted(), "listed in acquisition order: {tokens:?}");
    let (_, object, _) = plane.kubectl(&["get", "dlock", "pool", "-n", &ns, "-o", "json"]);
    eprintln!(
        "a semaphore with 300 holders: its object is {} bytes",
        object.len()
    );
    assert!(object.len() < 64 * 1024, "{} bytes", object.len());
}
