//! Namespace isolation with etcd auth: the operator gives each namespace credentials that reach
//! only its own locks; a pod with namespace A's credentials cannot take or break B's lock.

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::Api;
use serde_json::json;
use std::time::{Duration, SystemTime};

use crate::common::kube::{ControlPlane, Operator, rfc3339, running_pod, set_status, with_crd};
use crate::common::{EtcdServer, Sidecar, wait_until};

/// The etcd user and password the operator stored in namespace `ns`.
pub async fn credentials(plane: &ControlPlane, ns: &str) -> (String, String) {
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

/// Two namespaces with a lock `shared` each, on an etcd with auth, each with its operator and
/// the etcd credentials it provisioned.
struct Tenants {
    etcd: EtcdServer,
    x: String,
    y: String,
    creds: ((String, String), (String, String)),
    _ops: (Operator, Operator),
}

impl Tenants {
    async fn new(plane: &'static crate::common::kube::ControlPlane, x: &str, y: &str) -> Self {
        let etcd = EtcdServer::start().await;
        etcd.enable_auth("root-secret").await;
        let root = ["--etcd-user", "root", "--etcd-password", "root-secret"];
        let (x, y) = (plane.namespace(x), plane.namespace(y));
        let ops = (
            Operator::start_with(plane, &x, &etcd.endpoint, &root).await,
            Operator::start_with(plane, &y, &etcd.endpoint, &root).await,
        );
        for ns in [&x, &y] {
            declare_shared(plane, ns);
        }
        let creds = (credentials(plane, &x).await, credentials(plane, &y).await);
        Tenants {
            etcd,
            x,
            y,
            creds,
            _ops: ops,
        }
    }
}

#[tokio::test]
async fn a_namespace_cannot_take_or_break_another_namespaces_lock() {
    let plane = with_crd();
    let Tenants {
        etcd,
        x,
        y,
        creds,
        _ops,
    } = Tenants::new(plane, "iso-x", "iso-y").await;
    let ((ux, px), (uy, py)) = creds;
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

    // x's credentials work for x's own lock, once x's operator has published it (it makes the
    // credentials first, so the Secret can be there a moment before the lock is).
    let own = sidecar("pod-x2", x.clone(), ux, px).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (status, body) = loop {
        let (status, body) = own.post("shared", "acquire", json!({})).await;
        if status == 200 || std::time::Instant::now() > deadline {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status, 200, "x's own acquire: {body}");
}

#[tokio::test]
async fn a_tenants_key_on_another_namespaces_lease_neither_blocks_nor_revokes_its_holder() {
    let plane = with_crd();
    let Tenants {
        etcd,
        x,
        y,
        creds,
        _ops,
    } = Tenants::new(plane, "trust-x", "trust-y").await;
    let ((ux, px), (uy, py)) = creds;
    // y's pod (outside Kubernetes' view: no uid, so no pod state judges it) takes y's lock once
    // and lets go: its sidecar keeps its session's lease, now without keys.
    let args = ["--namespace", &y, "--etcd-user", &uy, "--etcd-password", &py];
    let victim = Sidecar::start(&etcd.endpoint, "victim", &args).await;
    wait_until(Duration::from_secs(10), || async {
        victim.get("/v1/locks/shared").await.0 == 200
    })
    .await
    .expect("y's lock is declared");
    let (status, first) = victim.post("shared", "acquire", json!({})).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(victim.post("shared", "release", json!({})).await.0, 200);
    let lease = first["leaseId"].as_i64().unwrap();
    // The release left its receipt on the lease (src/lock/txn/receipt.rs), a key of y's beside which
    // etcd lets x attach nothing. A hold that ended otherwise (a missed heartbeat, a give-up)
    // leaves none: remove it, as root, to stand for that.
    let root = etcd_client::ConnectOptions::new().with_user("root", "root-secret");
    let mut admin = etcd_client::Client::connect([&etcd.endpoint], Some(root))
        .await
        .unwrap();
    let receipts = etcd_client::DeleteOptions::new().with_prefix();
    let receipt = format!("/podlock/v1/queue/{y}/.released/");
    admin.delete(receipt, Some(receipts)).await.unwrap();

    // A tenant of x, with x's credentials only: a key under its own prefix, naming its own pod
    // (alive for now), attached to y's empty lease (etcd allows that while the lease has no key
    // x cannot write).
    let pods: Api<Pod> = Api::namespaced(plane.client().await, &x);
    let decoy_uid = running_pod(&pods, "decoy").await;
    let opts = etcd_client::ConnectOptions::new().with_user(ux, px);
    let mut tenant = etcd_client::Client::connect([&etcd.endpoint], Some(opts))
        .await
        .unwrap();
    let value = json!({"holderId": "evil", "pod": {"namespace": x, "name": "decoy", "uid": decoy_uid},
        "requestedAt": rfc3339(SystemTime::now()), "ttlSeconds": 15, "heartbeatTimeoutSeconds": 0});
    let key = format!("/podlock/v1/queue/{x}/shared/{lease:016x}/evil");
    tenant
        .put(
            key.as_str(),
            value.to_string(),
            Some(etcd_client::PutOptions::new().with_lease(lease)),
        )
        .await
        .expect("etcd lets x attach a key to a lease without keys of y");

    // y's pod takes its lock again. Since etcd 3.6.11 a put with a lease needs access to every
    // key on it, so the poisoned session cannot carry y's key (#55 F16): y's sidecar leaves
    // that session and takes the lock on a new one, which x cannot touch (it has y's key).
    let (status, again) = victim.post("shared", "acquire", json!({})).await;
    assert_eq!(
        status, 200,
        "y's acquire after x attached a key to its lease: {again}"
    );
    let fresh = again["leaseId"].as_i64().expect("a lease");
    assert_ne!(
        fresh, lease,
        "y's hold went on the session x attached a key to: {again}"
    );
    // The tenant's pod "fails": the operator ends that pod's holds, and must not take y's with it.
    set_status(&pods, "decoy", "Failed", SystemTime::now()).await;
    let gone = wait_until(Duration::from_secs(5), || {
        let mut admin = admin.clone();
        let key = key.clone();
        async move { admin.get(key, None).await.is_ok_and(|r| r.kvs().is_empty()) }
    })
    .await;
    gone.expect("the failed pod's own key is ended");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_, locks) = victim.get("/v1/locks").await;
    assert_eq!(
        (
            locks["locks"][0]["state"].as_str(),
            locks["locks"][0]["fencingToken"].clone()
        ),
        (Some("held"), again["fencingToken"].clone()),
        "y's hold was ended by x's pod failing: {locks}\noperator log of x:\n{}",
        _ops.0.log()
    );
    let ttl = admin.lease_time_to_live(fresh, None).await.unwrap().ttl();
    assert!(ttl > 0, "y's lease was revoked (ttl {ttl})");
}

/// Declares a DistributedLock `shared` in `ns`: the operator provisions the namespace's etcd
/// credentials for it.
pub fn declare_shared(plane: &ControlPlane, ns: &str) {
    let lock = format!(
        "apiVersion: podlock.io/v1alpha1\nkind: DistributedLock\nmetadata: {{name: shared, namespace: {ns}}}\nspec: {{}}\n"
    );
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &lock).0);
}

/// The flags of an operator with etcd's root credentials that makes deleted credentials
/// Secrets again every second.
pub const ISOLATED: [&str; 6] = [
    "--etcd-user",
    "root",
    "--etcd-password",
    "root-secret",
    "--credentials-check-seconds",
    "1",
];

/// An etcd with auth (root's password `root-secret`) and an operator for `ns` with
/// [`ISOLATED`]'s flags.
pub async fn isolated(plane: &'static ControlPlane, ns: &str) -> (EtcdServer, Operator) {
    let etcd = EtcdServer::start().await;
    etcd.enable_auth("root-secret").await;
    let op = Operator::start_with(plane, ns, &etcd.endpoint, &ISOLATED).await;
    (etcd, op)
}

#[tokio::test]
async fn a_namespace_with_a_lock_has_its_credentials_before_any_pod_and_gets_them_back_when_deleted() {
    let plane = with_crd();
    let ns = plane.namespace("creds-back");
    let (etcd, op) = isolated(plane, &ns).await;
    declare_shared(plane, &ns);
    let first = credentials(plane, &ns).await;
    let pods: Api<Pod> = Api::namespaced(plane.client().await, &ns);
    assert!(pods.list(&Default::default()).await.unwrap().items.is_empty());

    assert!(plane.kubectl(&["delete", "secret", "podlock-etcd", "-n", &ns]).0);
    let secrets: Api<Secret> = Api::namespaced(plane.client().await, &ns);
    wait_until(Duration::from_secs(10), || async {
        secrets.get_opt("podlock-etcd").await.is_ok_and(|s| s.is_some())
    })
    .await
    .unwrap_or_else(|e| panic!("the deleted Secret did not come back ({e}):\n{}", op.log()));
    let again = credentials(plane, &ns).await;
    assert_eq!(
        again, first,
        "made again with other credentials than running pods have"
    );
    takes_with(&etcd.endpoint, &ns, again, "shared").await;
}

/// A sidecar of namespace `ns` with its `credentials` takes `lock`.
pub async fn takes_with(etcd: &str, ns: &str, credentials: (String, String), lock: &str) {
    let pod = sidecar_with(etcd, ns, credentials).await;
    assert_eq!(pod.post(lock, "acquire", json!({})).await.0, 200);
}

/// A sidecar (pod `pod`) of namespace `ns` with its etcd `credentials`.
pub async fn sidecar_with(etcd: &str, ns: &str, (user, password): (String, String)) -> Sidecar {
    let args = [
        "--namespace",
        ns,
        "--etcd-user",
        &user,
        "--etcd-password",
        &password,
    ];
    Sidecar::start(etcd, "pod", &args).await
}

#[tokio::test]
async fn an_injected_pod_finds_its_namespaces_credentials_even_before_the_first_lock() {
    let plane = with_crd();
    let ns = plane.namespace("creds-first-pod");
    let (_etcd, _op) = isolated(plane, &ns).await;
    crate::injection::webhook_ready(plane, &ns).await;
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "first", "namespace": ns, "annotations": {"podlock.io/inject": "true"}},
        "spec": {"containers": [{"name": "app", "image": "app"}]}});
    let (ok, _, err) = plane.kubectl_stdin(&["create", "-f", "-"], &pod.to_string());
    assert!(ok, "{err}");
    let pods: Api<Pod> = Api::namespaced(plane.client().await, &ns);
    let created = pods.get("first").await.unwrap();
    let injected = created.spec.unwrap().init_containers.unwrap_or_default();
    assert!(injected.iter().any(|c| c.name == "podlock"), "not injected");
    // Read at once: the webhook made it before the API server stored the pod.
    let secrets: Api<Secret> = Api::namespaced(plane.client().await, &ns);
    assert!(
        secrets.get_opt("podlock-etcd").await.unwrap().is_some(),
        "the pod exists before its namespace's credentials:\n{}",
        _op.log()
    );
}

/// The bundled etcd's first start: etcd comes up with auth off, and the operator, given root's
/// password and `--etcd-enable-auth`, adds root and turns auth on; from then on etcd refuses
/// requests without credentials and the namespace gets its own user. Two replicas starting at
/// once and a restart (auth already on) all connect.
#[tokio::test]
async fn the_operator_turns_auth_on_in_a_fresh_etcd() {
    let plane = with_crd();
    let ns = plane.namespace("auth-on");
    let etcd = EtcdServer::start().await;
    let flags = [
        "--etcd-user",
        "root",
        "--etcd-password",
        "fresh-root",
        "--etcd-enable-auth",
    ];
    let (a, b) = tokio::join!(
        Operator::start_with(plane, &ns, &etcd.endpoint, &flags),
        Operator::start_with(plane, &ns, &etcd.endpoint, &flags),
    );
    let mut anonymous = etcd.client().await;
    let opts = etcd_client::GetOptions::new().with_prefix();
    let refused = anonymous.get("/podlock/", Some(opts)).await;
    assert!(
        refused.is_err(),
        "etcd still answers without credentials:\n{}",
        a.log()
    );
    declare_shared(plane, &ns);
    takes_with(&etcd.endpoint, &ns, credentials(plane, &ns).await, "shared").await;
    drop((a, b));
    // It serves /healthz, which start_with waits for, only once connected to etcd as root.
    Operator::start_with(plane, &ns, &etcd.endpoint, &flags).await;
}

/// A namespace whose Secret holds another etcd's credentials (an earlier install's, left with
/// no owner): the operator, which may not read it, knows it from etcd having no password for
/// the namespace yet, writes it again, says why, and a sidecar with what it now holds locks.
#[tokio::test]
async fn a_secret_with_another_etcds_credentials_is_written_again() {
    let plane = with_crd();
    let ns = plane.namespace("creds-stale");
    let old = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: podlock-etcd, namespace: {ns}}}\n\
         stringData: {{username: podlock-ns-{ns}, password: the-old-etcds}}\n"
    );
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &old).0);
    let (etcd, op) = isolated(plane, &ns).await;
    declare_shared(plane, &ns);
    wait_until(Duration::from_secs(15), || async {
        credentials(plane, &ns).await.1 != "the-old-etcds"
    })
    .await
    .unwrap_or_else(|e| panic!("the stale Secret was kept ({e}):\n{}", op.log()));
    let written = credentials(plane, &ns).await;
    assert!(
        op.log().contains("etcd had no password for the namespace"),
        "no cause logged:\n{}",
        op.log()
    );
    takes_with(&etcd.endpoint, &ns, written, "shared").await;
}
