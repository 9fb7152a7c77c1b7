//! Namespace isolation with etcd auth: the operator gives each namespace credentials that reach
//! only its own locks; a pod with namespace A's credentials cannot take or break B's lock.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::json;
use std::time::Duration;

use crate::common::kube::{ControlPlane, Operator, with_crd};
use crate::common::{EtcdServer, Sidecar, wait_until};

/// The etcd user and password the operator stored in namespace `ns`.
async fn credentials(plane: &ControlPlane, ns: &str) -> (String, String) {
    let secrets: Api<Secret> = Api::namespaced(plane.client().await, ns);
    wait_until(Duration::from_secs(15), || async {
        secrets.get_opt("podlock-etcd").await.is_ok_and(|s| s.is_some())
    })
    .await
    .unwrap_or_else(|e| panic!("no podlock-etcd Secret in {ns}: {e}"));
    let data = secrets.get("podlock-etcd").await.unwrap().data.unwrap();
    let field = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
    (field("username"), field("password"))
}

#[tokio::test]
async fn a_namespace_cannot_take_or_break_another_namespaces_lock() {
    let plane = with_crd();
    let etcd = EtcdServer::start().await;
    etcd.enable_auth("root-secret").await;
    let root = ["--etcd-user", "root", "--etcd-password", "root-secret"];
    let (x, y) = (plane.namespace("iso-x"), plane.namespace("iso-y"));
    let _ops = (
        Operator::start_with(plane, &x, &etcd.endpoint, &root).await,
        Operator::start_with(plane, &y, &etcd.endpoint, &root).await,
    );
    for ns in [&x, &y] {
        let lock = format!(
            "apiVersion: podlock.io/v1alpha1\nkind: DistributedLock\nmetadata: {{name: shared, namespace: {ns}}}\nspec: {{}}\n"
        );
        assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &lock).0);
    }
    let ((ux, px), (uy, py)) = (credentials(plane, &x).await, credentials(plane, &y).await);
    let endpoint = etcd.endpoint.clone();
    let sidecar = |pod: &'static str, ns: String, user: String, password: String| {
        let endpoint = endpoint.clone();
        async move {
            let args = [
                "--namespace",
                &ns,
                "--etcd-user",
                &user,
                "--etcd-password",
                &password,
            ];
            Sidecar::start(&endpoint, pod, &args).await
        }
    };
    let owner = sidecar("pod-y", y.clone(), uy, py).await;
    wait_until(Duration::from_secs(10), || async {
        owner.post("shared", "acquire", json!({})).await.0 == 200
    })
    .await
    .expect("y's own pod takes y's lock");
    let token = owner.get("/v1/locks/shared").await.1["fencingToken"].clone();

    // x's credentials, claiming to be in namespace y.
    let intruder = sidecar("pod-x", y.clone(), ux.clone(), px.clone()).await;
    let (status, err) = intruder
        .post("shared", "acquire", json!({"waitSeconds": 0}))
        .await;
    assert_eq!((status, err["error"].as_str()), (403, Some("forbidden")), "{err}");
    assert_eq!(
        intruder.get("/readyz").await.0,
        503,
        "x's credentials cannot even read y's settings"
    );
    // Nor can they delete y's queue behind the sidecar's back.
    let opts = etcd_client::ConnectOptions::new().with_user(ux.clone(), px.clone());
    let mut raw = etcd_client::Client::connect([&etcd.endpoint], Some(opts))
        .await
        .unwrap();
    let delete = raw
        .delete(
            format!("/podlock/v1/queue/{y}/"),
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await;
    assert!(delete.is_err(), "x deleted y's holds");
    let (_, info) = owner.get("/v1/locks/shared").await;
    assert_eq!(
        (info["held"].clone(), info["fencingToken"].clone()),
        (json!(true), token),
        "y's holder keeps it"
    );

    // x's credentials work for x's own lock.
    let own = sidecar("pod-x2", x.clone(), ux, px).await;
    assert_eq!(own.post("shared", "acquire", json!({})).await.0, 200);
}
