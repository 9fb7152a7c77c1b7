//! The bundled etcd's NetworkPolicy, enforced by the node's kube-router: etcd's
//! client port refuses a pod without the sidecar's labels and a pod of another release (the
//! connection is dropped: curl times out), and admits a pod labelled as this release's
//! injected pods are; the operator and the injected workers reach it too (their locks work).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::node::{Node, retry};

/// etcd's client port, through member 0's stable name; `/version` answers without credentials.
const ETCD: &str = "https://podlock-etcd-0.podlock-etcd.podlock.svc:2379/version";

/// curl's exit codes when it could not connect: refused (a policy's REJECT) or timed out (DROP).
const NOT_CONNECTED: [i64; 2] = [7, 28];

/// Asks etcd's `/version` every second for 30 s until it answers: the policy controller admits
/// a new pod's address only once it has seen the pod, a moment after the pod starts.
const ASK: &str = "i=0; while [ $i -lt 30 ]; do curl -sSk --max-time 3 \"$ETCD\" && exit 0; \
                   code=$?; i=$((i+1)); sleep 1; done; exit $code";

/// A pod with `labels` that asks etcd's `/version` ([`ASK`]).
fn probe(node: &Node, name: &str, labels: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: netpol, labels: {{{labels}}}}}\n\
         spec:\n  restartPolicy: Never\n  containers:\n  - {{name: curl, image: {image}, imagePullPolicy: Never, \
         command: [/bin/sh, -c, {ask}], env: [{{name: ETCD, value: \"{ETCD}\"}}]}}\n",
        image = node.images["APP_IMAGE"],
        ask = serde_json::to_string(ASK).unwrap(),
    )
}

/// Each probe pod's curl exit code and output, once it ended.
fn results(node: &Node, pods: &[&str]) -> BTreeMap<String, (i64, String)> {
    let mut out = BTreeMap::new();
    for pod in pods {
        let code = retry(Duration::from_secs(120), || {
            let (_, code, _) = node.kubectl(&[
                "get",
                "pod",
                pod,
                "-n",
                "netpol",
                "-o",
                "jsonpath={.status.containerStatuses[0].state.terminated.exitCode}",
            ]);
            code.parse::<i64>().map_err(|_| format!("{pod} has not ended"))
        });
        let code = code.unwrap_or_else(|e| panic!("{e}"));
        let (_, log, _) = node.kubectl(&["logs", pod, "-n", "netpol"]);
        eprintln!(
            "{pod}: curl exit {code}: {}",
            log.trim().lines().last().unwrap_or("")
        );
        out.insert(pod.to_string(), (code, log));
    }
    out
}

pub fn etcd_admits_only_this_releases_sidecars_and_the_operator(node: &Node) {
    node.kubectl(&["create", "namespace", "netpol"]);
    let release = "podlock.io/sidecar: \"true\"";
    for (name, labels) in [
        ("stranger", "app: stranger".to_string()),
        ("other-release", format!("{release}, podlock.io/instance: other")),
        ("this-release", format!("{release}, podlock.io/instance: podlock")),
    ] {
        node.kubectl_apply(&probe(node, name, &labels));
    }
    let got = results(node, &["stranger", "other-release", "this-release"]);
    for refused in ["stranger", "other-release"] {
        let (code, log) = &got[refused];
        assert!(
            NOT_CONNECTED.contains(code),
            "{refused} reached etcd's client port: exit {code}: {log}"
        );
    }
    let (code, log) = &got["this-release"];
    assert!(
        *code == 0 && log.contains("etcdserver"),
        "a pod labelled as this release's sidecars did not reach etcd: exit {code}: {log}"
    );
    // The webhook labels injected pods with the release, which is what admits them.
    let (_, injected, _) = node.kubectl(&[
        "get",
        "pods",
        "-n",
        "app",
        "-l",
        "podlock.io/sidecar=true,podlock.io/instance=podlock",
        "-o",
        "name",
    ]);
    assert!(
        !injected.trim().is_empty(),
        "no injected pod carries podlock.io/instance=podlock"
    );
    node.kubectl(&["delete", "namespace", "netpol", "--wait=false"]);
}
