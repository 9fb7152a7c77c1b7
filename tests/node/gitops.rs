//! GitOps (issue #55, item 5). Argo CD and Flux render the chart without `lookup`, so the
//! bundled etcd's Secrets are made once, outside the release, by the recipe of
//! docs/operations.md ("With Argo CD or Flux"), and named in the values. An uninstall keeps the
//! etcd volumes (a StatefulSet's claims outlive it) and those Secrets; an install over them
//! with the same values must authenticate to the etcd that kept its root password, and keep
//! every lock's history: the kept namespace's pod takes its lock again with a higher token.

use std::time::{Duration, Instant};

use crate::common::node::Node;
use crate::uninstall::{KEPT, call_the_lock};
use crate::{CHART, helm_uninstall, install};

/// The Secrets the recipe makes, as the values name them.
const SECRETS: [&str; 2] = ["podlock-etcd-tls-kept", "podlock-etcd-root-kept"];

/// The values that name them.
pub const VALUES: [&str; 2] = [
    "etcd.bundled.tlsSecret=podlock-etcd-tls-kept",
    "etcd.bundled.authSecret=podlock-etcd-root-kept",
];

/// Makes the bundled etcd's Secrets once, as docs/operations.md does: the chart renders them
/// (for the oldest Kubernetes it admits: `helm template` assumes 1.20, which it refuses) and
/// `sed` renames each `name: podlock-etcd-tls` or `-root` line's Secret with `-kept`.
pub fn make_the_secrets(node: &Node) {
    let (ok, rendered, err) = node.helm(&[
        "template",
        "podlock",
        CHART,
        "-n",
        "podlock",
        "--kube-version",
        "1.35.0",
        "--set",
        "etcd.bundled.enabled=true",
        "--set",
        "etcd.bundled.networkPolicy.enabled=false",
        "--show-only",
        "templates/etcd-security.yaml",
    ]);
    assert!(ok, "helm template of the bundled etcd's Secrets: {err}");
    let renamed: Vec<String> = (rendered.lines())
        .map(
            |l| match l.ends_with("name: podlock-etcd-tls") || l.ends_with("name: podlock-etcd-root") {
                true => format!("{l}-kept"),
                false => l.to_string(),
            },
        )
        .collect();
    let renamed = renamed.join("\n");
    for secret in SECRETS {
        assert!(
            renamed.contains(secret),
            "the recipe made no {secret}:\n{rendered}"
        );
    }
    node.kubectl_apply(&renamed);
}

/// `after`, which holds the kept namespace's lock (its grant `held_by_after`), releases it;
/// the release is uninstalled, keeping the etcd volumes and the named Secrets, and installed
/// again with the same values: `after` takes the lock again, with a higher token.
pub fn an_install_over_kept_volumes_keeps_the_locks(node: &Node, held_by_after: &str) {
    let before = token(held_by_after);
    call_the_lock(node, KEPT, "after", "release", Duration::from_secs(10));
    helm_uninstall(node);
    let (_, claims, _) = node.kubectl(&["get", "pvc", "-n", "podlock", "-o", "name"]);
    assert_eq!(claims.lines().count(), 3, "the etcd members' volumes: {claims}");
    install(node, &node.images["ETCD_IMAGE"], &VALUES);
    let started = Instant::now();
    let acquire = "acquire?waitSeconds=10";
    let grant = call_the_lock(node, KEPT, "after", acquire, Duration::from_secs(240));
    eprintln!(
        "after helm install over the kept etcd volumes with the named Secrets: {KEPT}/after \
         holds again after {:.0} s: {grant}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        token(&grant) > before,
        "the token fell across the install over kept volumes: {before} then {grant}"
    );
    call_the_lock(node, KEPT, "after", "release", Duration::from_secs(10));
}

/// Deletes the named Secrets: they are the user's, and no uninstall removes them.
pub fn delete_the_secrets(node: &Node) {
    for secret in SECRETS {
        let (ok, _, err) = node.kubectl(&["delete", "secret", secret, "-n", "podlock"]);
        assert!(ok, "deleting {secret}: {err}");
    }
}

/// The fencing token of a grant (the sidecar's JSON answer).
fn token(grant: &str) -> i64 {
    let grant: serde_json::Value = serde_json::from_str(grant).unwrap();
    grant["fencingToken"]
        .as_i64()
        .unwrap_or_else(|| panic!("no token in {grant}"))
}
