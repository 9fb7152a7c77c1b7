//! `manifests/rbac.yaml` (the chart's RBAC, rendered) is enough: the operator, run with a token of exactly that
//! ServiceAccount, reconciles, mirrors status, revokes a dead pod's hold, elects a leader,
//! makes its webhook certificate, registers its webhook and (with etcd auth) gives the
//! namespace its etcd credentials, without one refusal. And it is no
//! more: that token reads no Secret but the webhook certificate's in its own namespace, and
//! writes no existing Secret but those named `podlock-etcd`.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

use crate::common::kube::{ControlPlane, Operator, kubectl_as, with_crd};
use crate::common::{EtcdServer, Sidecar, wait_until};
use crate::isolation::credentials;

/// Applies `manifests/rbac.yaml` with its ServiceAccount in `ns` (and its cluster-wide binding
/// and Secret policy named after `ns`, so that tests do not take each other's), and returns a kubeconfig with a
/// token of exactly that ServiceAccount (in the returned directory).
async fn service_account_kubeconfig(plane: &ControlPlane, ns: &str) -> (tempfile::TempDir, PathBuf) {
    rbac_kubeconfig(plane, ns, include_str!("../../manifests/rbac.yaml")).await
}

/// Like [`service_account_kubeconfig`], with the rendered RBAC `rbac` (release namespace
/// `podlock`).
async fn rbac_kubeconfig(plane: &ControlPlane, ns: &str, rbac: &str) -> (tempfile::TempDir, PathBuf) {
    let rbac = rbac
        .replace("namespace: podlock", &format!("namespace: {ns}"))
        .replace(
            "kind: ClusterRoleBinding\nmetadata:\n  name: podlock-operator",
            &format!("kind: ClusterRoleBinding\nmetadata:\n  name: podlock-operator-{ns}"),
        )
        .replace(
            "name: podlock-operator-secrets",
            &format!("name: podlock-operator-secrets-{ns}"),
        )
        .replace(
            "policyName: podlock-operator-secrets",
            &format!("policyName: podlock-operator-secrets-{ns}"),
        )
        .replace(":podlock:podlock-operator", &format!(":{ns}:podlock-operator"))
        .replace("namespace == \"podlock\"", &format!("namespace == \"{ns}\""));
    let (ok, _, err) = plane.kubectl_stdin(&["apply", "-f", "-"], &rbac);
    assert!(ok, "{err}");
    let (dir, kubeconfig) = plane.token_kubeconfig(ns, "podlock-operator");
    // The policy takes effect a moment after it is created: wait, so that it judges every
    // Secret the operator makes.
    wait_until(Duration::from_secs(10), || async {
        refused(&kubeconfig, &other_secret(ns), "")
    })
    .await
    .expect("the policy refuses the operator a Secret of another name");
    (dir, kubeconfig)
}

/// Whether the operator (with `kubeconfig`) is refused `args` by the chart's Secret policy.
fn refused(kubeconfig: &std::path::Path, args: &[&str], stdin: &str) -> bool {
    let (ok, _, err) = kubectl_as(kubeconfig, args, stdin);
    !ok && err.contains("podlock's operator may create only")
}

/// A server-side dry run creating Secret `other` in `namespace`.
fn other_secret(namespace: &str) -> [&str; 8] {
    [
        "create",
        "secret",
        "generic",
        "other",
        "-n",
        namespace,
        "--from-literal=k=v",
        "--dry-run=server",
    ]
}

#[tokio::test]
async fn the_operator_needs_no_more_than_manifests_rbac() {
    let plane = with_crd();
    let ns = plane.namespace("rbac");
    let (_dir, kubeconfig) = service_account_kubeconfig(plane, &ns).await;
    does_its_work(plane, &ns, &kubeconfig).await;
}

/// With `operator.watchNamespace`, the chart grants what concerns locks and pods in a Role of
/// that namespace only; the ClusterRole keeps what is cluster-scoped.
#[tokio::test]
async fn an_operator_limited_to_a_namespace_needs_only_a_role_there() {
    let plane = with_crd();
    let ns = plane.namespace("rbac-ns");
    let watch = format!("operator.watchNamespace={ns}");
    let out = crate::chart::render(&["--set", &watch, "--show-only", "templates/rbac.yaml"]);
    // Its ClusterRole differs from the default one: under a name of its own, so that the
    // other test's operator keeps the cluster-wide rules it runs with.
    let rbac = out
        .replace(
            "kind: ClusterRole\nmetadata:\n  name: podlock-operator\n",
            &format!("kind: ClusterRole\nmetadata:\n  name: podlock-operator-{ns}\n"),
        )
        .replace(
            "kind: ClusterRole, name: podlock-operator}",
            &format!("kind: ClusterRole, name: podlock-operator-{ns}}}"),
        );
    let cluster_role = rbac.split("kind: ClusterRoleBinding").next().unwrap();
    assert!(
        !cluster_role.contains("distributedlocks") && !cluster_role.contains("pods"),
        "cluster-wide rules for a namespaced operator:\n{cluster_role}"
    );
    let (_dir, kubeconfig) = rbac_kubeconfig(plane, &ns, &rbac).await;
    does_its_work(plane, &ns, &kubeconfig).await;
}

/// Runs the operator as the ServiceAccount of `kubeconfig`, for namespace `ns`: it reconciles,
/// ends a dead pod's hold, gives the namespace its credentials and makes what it owns.
async fn does_its_work(plane: &ControlPlane, ns: &str, kubeconfig: &std::path::Path) {
    let ns = ns.to_string();
    // With etcd auth, so that it provisions the namespace's credentials Secret as well.
    let etcd = EtcdServer::start().await;
    etcd.enable_auth("root-secret").await;

    let op = Operator::start_as(
        kubeconfig,
        &ns,
        &etcd.endpoint,
        &[
            "--webhook-configuration",
            "podlock",
            "--etcd-user",
            "root",
            "--etcd-password",
            "root-secret",
        ],
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
    let (user, password) = credentials(plane, &ns).await;
    let args = [
        "--namespace",
        &ns,
        "--pod-uid",
        &uid,
        "--etcd-user",
        &user,
        "--etcd-password",
        &password,
    ];
    let s = Sidecar::start(&etcd.endpoint, "worker", &args).await;
    s.must_acquire("guarded", json!({})).await;
    wait_until(Duration::from_secs(5), || async { phase().await == "Held" })
        .await
        .expect("Held");
    pods.delete("worker", &DeleteParams::default()).await.unwrap();
    wait_until(Duration::from_secs(5), || async { phase().await == "Free" })
        .await
        .unwrap_or_else(|e| panic!("hold not revoked ({e}):\n{}", op.log()));

    made_what_it_owns(plane, &ns, &op).await;
}

/// The escalation the operator's token must not have: reading a Secret it does not own, in any
/// namespace, including the token of a ServiceAccount Secret it created itself under a name it
/// may write.
#[tokio::test]
async fn the_operators_token_cannot_read_a_secret_it_does_not_own() {
    let plane = with_crd();
    let ns = plane.namespace("rbac-deny");
    let victim = plane.namespace("rbac-victim");
    let (_dir, kubeconfig) = service_account_kubeconfig(plane, &ns).await;
    for (secret, namespace) in [
        ("other", &victim),
        ("other", &ns),
        ("podlock-webhook-tls", &victim),
    ] {
        let (ok, _, err) = plane.kubectl(&[
            "create",
            "secret",
            "generic",
            secret,
            "-n",
            namespace,
            "--from-literal=k=v",
        ]);
        assert!(ok || err.contains("AlreadyExists"), "{err}");
    }
    let as_operator = |args: &[&str], stdin: &str| kubectl_as(&kubeconfig, args, stdin);
    for (secret, namespace) in [
        ("other", &victim),
        ("other", &ns),
        ("podlock-webhook-tls", &victim),
    ] {
        let (ok, out, err) = as_operator(&["get", "secret", secret, "-n", namespace, "-o", "yaml"], "");
        assert!(
            !ok && err.contains("Forbidden"),
            "the operator's token read Secret {namespace}/{secret}:\n{out}{err}"
        );
    }
    for verb in ["list", "watch"] {
        let (_, answer, _) = as_operator(&["auth", "can-i", verb, "secrets", "-A"], "");
        assert_eq!(answer.trim(), "no", "{verb} secrets");
    }
    // It may write a stale podlock-etcd again, whole (an update), and no other Secret.
    for (secret, allowed) in [("podlock-etcd", "yes"), ("other", "no")] {
        let what = format!("secret/{secret}");
        let (_, answer, _) = as_operator(&["auth", "can-i", "update", &what, "-n", &victim], "");
        assert_eq!(answer.trim(), allowed, "update {what}");
    }

    may_create_only_its_own_secrets(&kubeconfig, &victim).await;
    cannot_read_back_a_service_account_token(plane, &kubeconfig, &victim).await;
}

/// A service-account-token Secret named `podlock-etcd` in `namespace`.
fn token_secret(namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\ntype: kubernetes.io/service-account-token\nmetadata:\n  name: podlock-etcd\n  namespace: {namespace}\n  annotations: {{kubernetes.io/service-account.name: default}}\n"
    )
}

/// RBAC lets the operator create any Secret anywhere; the chart's ValidatingAdmissionPolicy
/// lets it create only its own, never a service-account-token one (server-side dry runs).
async fn may_create_only_its_own_secrets(kubeconfig: &std::path::Path, victim: &str) {
    assert!(
        refused(kubeconfig, &other_secret(victim), ""),
        "Secret other in {victim}"
    );
    let create = ["create", "--dry-run=server", "-f", "-"];
    assert!(
        refused(kubeconfig, &create, &token_secret(victim)),
        "a service-account-token podlock-etcd"
    );
    let own = [
        "create",
        "secret",
        "generic",
        "podlock-etcd",
        "-n",
        victim,
        "--from-literal=k=v",
        "--dry-run=server",
    ];
    let (ok, _, err) = kubectl_as(kubeconfig, &own, "");
    assert!(ok, "its own Secret: {err}");
}

/// RBAC lets the operator's token create `podlock-etcd` in any namespace, so also as a
/// service-account-token Secret, into which the token controller puts a token of `default` (or
/// any account of `victim`): it must not be able to read that back.
async fn cannot_read_back_a_service_account_token(
    plane: &ControlPlane,
    kubeconfig: &std::path::Path,
    victim: &str,
) {
    let as_operator = |args: &[&str], stdin: &str| kubectl_as(kubeconfig, args, stdin);
    // Made by an admin here: the policy would refuse the operator (see above), but RBAC must
    // hold on its own, e.g. on a cluster too old for the policy.
    let (ok, _, err) = plane.kubectl_stdin(&["create", "-f", "-"], &token_secret(victim));
    assert!(ok || err.contains("AlreadyExists"), "{err}");
    wait_until(Duration::from_secs(10), || async {
        let jsonpath = "jsonpath={.data.token}";
        let (_, token, _) = plane.kubectl(&["get", "secret", "podlock-etcd", "-n", victim, "-o", jsonpath]);
        !token.is_empty()
    })
    .await
    .expect("the token controller fills the token in");
    // An update answers with what it sent: the token stays unread, whether the policy refuses
    // the update (1.30+) or RBAC alone lets it through.
    let (_, out, _) = as_operator(&["replace", "-f", "-", "-o", "yaml"], &token_secret(victim));
    assert!(
        !out.contains("token:"),
        "the operator's token got at a ServiceAccount token by an update:\n{out}"
    );
    for read in [
        &["get", "secret", "podlock-etcd", "-n", victim, "-o", "yaml"][..],
        &[
            "label",
            "secret",
            "podlock-etcd",
            "-n",
            victim,
            "x=y",
            "-o",
            "yaml",
        ][..],
    ] {
        let (ok, out, err) = as_operator(read, "");
        assert!(
            !ok && err.contains("Forbidden"),
            "the operator's token got at a ServiceAccount token ({read:?}):\n{out}{err}"
        );
    }
}

/// The operator registered its webhook, made its certificate's Secret, its Lease and its
/// namespace's credentials, leads, and was never refused.
async fn made_what_it_owns(plane: &ControlPlane, ns: &str, op: &Operator) {
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
            .kubectl(&["get", "secret", "podlock-webhook-tls", "-n", ns])
            .0
    );
    assert!(plane.kubectl(&["get", "lease", "podlock-operator", "-n", ns]).0);
    assert!(op.leads().await);
    let log = op.log();
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "refused:\n{log}"
    );
    assert!(plane.kubectl(&["get", "secret", "podlock-etcd", "-n", ns]).0);
}
