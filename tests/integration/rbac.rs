//! `manifests/rbac.yaml` (the chart's RBAC, rendered) is enough: the operator, run with a token of exactly that
//! ServiceAccount, reconciles, mirrors status, revokes a dead pod's hold, elects a leader,
//! makes its webhook certificate and registers its webhook, without one refusal.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

use crate::common::kube::{Operator, with_crd};
use crate::common::{Sidecar, wait_until};

#[tokio::test]
async fn the_operator_needs_no_more_than_manifests_rbac() {
    let plane = with_crd();
    let ns = plane.namespace("rbac");
    let rbac =
        include_str!("../../manifests/rbac.yaml").replace("namespace: podlock", &format!("namespace: {ns}"));
    let (ok, _, err) = plane.kubectl_stdin(&["apply", "-f", "-"], &rbac);
    assert!(ok, "{err}");
    let (ok, token, err) =
        plane.kubectl(&["create", "token", "podlock-operator", "-n", &ns, "--duration=1h"]);
    assert!(ok, "{err}");
    let admin = std::fs::read_to_string(&plane.kubeconfig).unwrap();
    let (_, admin_token) = admin.split_once("token: ").unwrap();
    let admin_token = admin_token.lines().next().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, admin.replace(admin_token, token.trim())).unwrap();

    let op = Operator::start_as(
        &kubeconfig,
        &ns,
        &plane.etcd.endpoint,
        &["--webhook-configuration", "podlock"],
    )
    .await;
    let lock = format!(
        "apiVersion: podlock.io/v1alpha1\nkind: DistributedLock\nmetadata: {{name: guarded, namespace: {ns}}}\nspec: {{ttlSeconds: 30}}\n"
    );
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &lock).0);
    let phase = || async {
        plane
            .kubectl(&[
                "get",
                "dlock",
                "guarded",
                "-n",
                &ns,
                "-o",
                "jsonpath={.status.phase}",
            ])
            .1
    };
    wait_until(Duration::from_secs(15), || async { phase().await == "Free" })
        .await
        .unwrap_or_else(|e| panic!("never Free ({e}):\n{}", op.log()));

    // A holder pod dies: the operator (as the ServiceAccount) sees it and ends the hold.
    let pods: Api<Pod> = Api::namespaced(plane.client().await, &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "worker", "labels": {"podlock.io/sidecar": "true"}},
        "spec": {"containers": [{"name": "app", "image": "app"}]}
    }))
    .unwrap();
    let uid = pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let status = json!({"status": {"phase": "Running"}});
    pods.patch_status("worker", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let s = Sidecar::start(
        &plane.etcd.endpoint,
        "worker",
        &["--namespace", &ns, "--pod-uid", &uid],
    )
    .await;
    s.must_acquire("guarded", json!({})).await;
    wait_until(Duration::from_secs(5), || async { phase().await == "Held" })
        .await
        .expect("Held");
    pods.delete("worker", &DeleteParams::default()).await.unwrap();
    wait_until(Duration::from_secs(5), || async { phase().await == "Free" })
        .await
        .unwrap_or_else(|e| panic!("hold not revoked ({e}):\n{}", op.log()));

    let (ok, ca, _) = plane.kubectl(&[
        "get",
        "mutatingwebhookconfiguration",
        "podlock",
        "-o",
        "jsonpath={.webhooks[0].clientConfig.caBundle}",
    ]);
    assert!(ok && !ca.is_empty(), "webhook not registered:\n{}", op.log());
    assert!(
        plane
            .kubectl(&["get", "secret", "podlock-webhook-tls", "-n", &ns])
            .0
    );
    assert!(plane.kubectl(&["get", "lease", "podlock-operator", "-n", &ns]).0);
    assert!(op.leads().await);
    let log = op.log();
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "refused:\n{log}"
    );
}
