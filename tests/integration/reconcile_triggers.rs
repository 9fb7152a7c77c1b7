//! What starts a reconciliation of a DistributedLock: its spec (generation) and its finalizers
//! change, or its lock changes in etcd. A write to its status does not: each of the operator's
//! own status patches used to come back as a watch event and cost one more reconciliation,
//! half of a busy lock's (issue #15, status lag).

use kube::api::{Api, Patch, PatchParams};
use podlock::crd::DistributedLock;
use serde_json::json;
use std::time::Duration;

use crate::common::kube::{Operator, with_crd};
use crate::common::wait_until;
use crate::operator::{declare_until_free, lock_yaml, operator_for, status_until};

/// The count once it has not moved for a second.
async fn settled_reconciles(op: &Operator) -> u64 {
    let mut last = op.reconciles().await;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = op.reconciles().await;
        if now == last {
            return now;
        }
        last = now;
    }
}

#[tokio::test]
async fn a_status_or_label_write_does_not_reconcile_a_lock_but_a_spec_change_does() {
    let plane = with_crd();
    let ns = plane.namespace("triggers");
    let op = operator_for(plane, &ns).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    declare_until_free(plane, &api, &ns, "quiet", "{ttlSeconds: 20}").await;
    let before = settled_reconciles(&op).await;

    let (ok, _, err) = plane.kubectl(&["label", "dlock", "quiet", "-n", &ns, "team=a"]);
    assert!(ok, "label: {err}");
    let status = Patch::Merge(json!({"status": {"waiters": 7}}));
    api.patch_status("quiet", &PatchParams::default(), &status)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        op.reconciles().await,
        before,
        "a label and a status write reconciled the lock"
    );

    plane.kubectl_stdin(
        &["apply", "-f", "-"],
        &lock_yaml(&ns, "quiet", "{ttlSeconds: 30}"),
    );
    let reconciled = wait_until(Duration::from_secs(5), || async {
        op.reconciles().await > before
    });
    reconciled.await.expect("a spec change reconciles the lock");
    // And that reconciliation puts the status back to what etcd holds.
    status_until(&api, "quiet", "no waiters", |s| s.waiters == 0).await;
}
