//! `helm uninstall` with locks held, and an install again on fresh etcd volumes. Two app
//! namespaces each have a DistributedLock held by an injected pod. After the uninstall, one of
//! them is deleted, which must complete (no finalizer waits for an operator that is gone), and
//! no Secret of podlock's may be left anywhere. The other namespace is kept, with the Secret an
//! older podlock left behind (no owner, the credentials of the etcd that is gone): after the
//! install, on a new etcd with a new CA and new passwords, the pod that held the lock there
//! through the uninstall takes it again without a restart (its sidecar reads the rewritten
//! Secret's files anew), a new injected pod takes it too, both with curl and no step by hand,
//! and the operator says why it wrote the Secret again.

use std::time::{Duration, Instant};

use crate::common::node::{Node, retry};
use crate::upgrade::operator_logs;

/// The namespace deleted after the uninstall.
const GONE: &str = "uninstalled";
/// The namespace kept across the uninstall and the install again.
pub const KEPT: &str = "kept";
/// The label of every Secret the operator makes.
const MANAGED: &str = "app.kubernetes.io/managed-by=podlock-operator";

/// A lock, and an injected pod with curl in namespace `ns`, named `pod`.
fn manifest(node: &Node, ns: &str, pod: &str) -> String {
    format!(
        "apiVersion: podlock.io/v1alpha1\nkind: DistributedLock\nmetadata: {{name: held, namespace: {ns}}}\nspec: {{}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}, namespace: {ns}, annotations: {{podlock.io/inject: \"true\"}}}}\n\
         spec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: app, image: {image}, imagePullPolicy: Never, \
         command: [/bin/sleep, \"3600\"]}}\n",
        image = node.images["APP_IMAGE"]
    )
}

/// Creates pod `pod` in `ns` (made if missing) and has it take lock `held` with curl through
/// its sidecar, asking again while the sidecar is not ready; returns the grant.
fn take_the_lock(node: &Node, ns: &str, pod: &str) -> String {
    node.kubectl(&["create", "namespace", ns]);
    node.kubectl_apply(&manifest(node, ns, pod));
    let (ok, _, err) = node.kubectl(&[
        "wait",
        "pod",
        pod,
        "-n",
        ns,
        "--for=condition=Ready",
        "--timeout=120s",
    ]);
    assert!(ok, "pod {ns}/{pod} not Ready: {err}");
    call_the_lock(node, ns, pod, "acquire?waitSeconds=10", Duration::from_secs(60))
}

/// Has pod `pod` of `ns` make `call` on lock `held` with curl through its sidecar until it
/// succeeds, for up to `within`; returns the answer.
pub fn call_the_lock(node: &Node, ns: &str, pod: &str, call: &str, within: Duration) -> String {
    let curl = format!(r#"curl -s -w ' %{{http_code}}' -XPOST "$PODLOCK_ADDR/v1/locks/held/{call}""#);
    let answer = retry(within, || {
        let (_, out, err) = node.kubectl(&["exec", "-n", ns, pod, "-c", "app", "--", "sh", "-c", &curl]);
        let body = out.trim_end().strip_suffix(" 200");
        body.map(str::to_string).ok_or(format!("{out}{err}"))
    });
    let (_, sidecar, _) = node.kubectl(&["logs", "-n", ns, pod, "-c", "podlock", "--tail", "20"]);
    answer.unwrap_or_else(|e| panic!("{ns}/{pod}: {call} on its lock failed: {e}\nits sidecar:\n{sidecar}"))
}

/// Before the uninstall: both namespaces' locks held by their injected pods. Returns the kept
/// namespace's Secret (JSON), to leave behind as an older podlock, whose Secrets had no owner,
/// did.
pub fn locks_held_in_two_namespaces(node: &Node) -> String {
    for ns in [GONE, KEPT] {
        let grant = take_the_lock(node, ns, "holder");
        eprintln!("before helm uninstall: {ns}/holder holds: {grant}");
    }
    let (ok, secret, err) = node.kubectl(&["get", "secret", "podlock-etcd", "-n", KEPT, "-o", "json"]);
    assert!(ok, "no Secret podlock-etcd in {KEPT}: {err}");
    secret
}

/// After the uninstall: deleting a namespace whose lock is held completes within 60 s, no lock
/// keeps a finalizer and no Secret of podlock's is left; then the kept namespace gets back the
/// Secret an older podlock would have left there (`secret`, without its owner).
pub fn nothing_is_left_waiting_for_the_operator(node: &Node, secret: &str) {
    let started = Instant::now();
    let (ok, _, err) = node.kubectl(&["delete", "namespace", GONE, "--wait=true", "--timeout=60s"]);
    let (_, left, _) = node.kubectl(&["get", "dlock", "-A", "-o", "yaml"]);
    assert!(
        ok,
        "deleting namespace {GONE} (a held lock in it) did not complete within 60 s: {err}\nlocks:\n{left}"
    );
    eprintln!(
        "after helm uninstall: namespace {GONE}, its lock held, deleted in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let (_, finalizers, _) = node.kubectl(&[
        "get", "dlock", "-A", "-o",
        r#"jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name} {.metadata.finalizers}{"\n"}{end}"#,
    ]);
    let kept: Vec<&str> = finalizers.lines().filter(|l| l.contains("podlock.io")).collect();
    assert!(kept.is_empty(), "locks keep their finalizer: {kept:?}");
    no_secret_of_podlocks_is_left(node, "helm uninstall");
    let mut old: serde_json::Value = serde_json::from_str(secret).unwrap();
    let meta = old["metadata"].as_object_mut().unwrap();
    for field in [
        "ownerReferences",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
    ] {
        meta.remove(field);
    }
    node.kubectl_apply(&old.to_string());
}

/// No Secret labelled as the operator's is left in any namespace (the garbage collector
/// deletes them after their owner, within a minute).
pub fn no_secret_of_podlocks_is_left(node: &Node, after: &str) {
    let left = retry(Duration::from_secs(60), || {
        let columns = "custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name";
        let (_, out, _) = node.kubectl(&[
            "get",
            "secret",
            "-A",
            "-l",
            MANAGED,
            "-o",
            columns,
            "--no-headers",
        ]);
        out.trim().is_empty().then_some(()).ok_or(out)
    });
    assert!(
        left.is_ok(),
        "{after} left Secrets of podlock's: {}",
        left.unwrap_err()
    );
}

/// After the install again on fresh etcd volumes: the kept namespace's pod from before the
/// uninstall, never restarted, takes the lock again once its sidecar has read the rewritten
/// Secret (the kubelet updates its files within about a minute), then releases it; a new
/// injected pod takes it too, and the operator logged why it wrote that Secret again. Returns
/// the new pod's grant (it holds on).
pub fn the_kept_namespace_locks_again(node: &Node) -> String {
    let started = Instant::now();
    let acquire = "acquire?waitSeconds=10";
    let grant = call_the_lock(node, KEPT, "holder", acquire, Duration::from_secs(240));
    eprintln!(
        "after helm install on fresh etcd volumes: {KEPT}/holder, created before the uninstall, \
         holds again after {:.0} s: {grant}",
        started.elapsed().as_secs_f64()
    );
    let restarts = "jsonpath={.status.initContainerStatuses[*].restartCount} {.status.containerStatuses[*].restartCount}";
    let (_, restarts, _) = node.kubectl(&["get", "pod", "holder", "-n", KEPT, "-o", restarts]);
    assert_eq!(
        restarts.trim(),
        "0 0",
        "{KEPT}/holder's containers were restarted"
    );
    let (_, sidecar, _) = node.kubectl(&["logs", "-n", KEPT, "holder", "-c", "podlock"]);
    for line in sidecar.lines().filter(|l| l.contains("anew")) {
        eprintln!("{KEPT}/holder's sidecar: {}", line.trim());
    }
    call_the_lock(node, KEPT, "holder", "release", Duration::from_secs(10));
    let held = take_the_lock(node, KEPT, "after");
    eprintln!("after helm install on fresh etcd volumes: {KEPT}/after holds: {held}");
    let logs = operator_logs(node, 400);
    let rewrote: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("wrote it again") && l.contains(KEPT))
        .collect();
    assert!(
        rewrote.iter().any(|l| l.contains("a new etcd")),
        "the operator did not say why it wrote {KEPT}'s Secret again:\n{logs}"
    );
    eprintln!("the operator: {}", rewrote[0].trim());
    held
}
