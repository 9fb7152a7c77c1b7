//! Injection you cannot miss (#55 item 3), on the node: with the webhook unreachable (the
//! host firewall resets the control plane's connections to the operators' webhook port, as a
//! private cluster's firewall leaves it), `failurePolicy: Ignore` lets a pod that asked for the
//! sidecar start without it, and the operator says so within seconds: a Warning Event
//! `SidecarMissing` on the pod.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::node::{Node, retry};

/// The namespace of the pod that asks for the sidecar.
const NAMESPACE: &str = "missed";
/// How long the operator may take to warn: "within seconds", with headroom for the node.
const WARN_WITHIN: Duration = Duration::from_secs(30);

/// The operators' webhook port.
const WEBHOOK_PORT: &str = "9443";

/// Host firewall rules that reset every connection of this machine (the API server's) to the
/// webhook port of the operator pods, for as long as it lives. A change to the Service would
/// not do: the API server keeps its connection to the webhook open, and an open connection
/// stays where it was.
struct Firewall(Vec<String>);

impl Firewall {
    fn up(node: &Node) -> Self {
        let ips = operator_ips(node);
        assert!(!ips.is_empty(), "no operator pod IP");
        for ip in &ips {
            iptables("-I", ip);
        }
        Firewall(ips)
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        for ip in &self.0 {
            iptables("-D", ip);
        }
    }
}

/// Inserts (`-I`) or deletes (`-D`) the rule that resets TCP to `ip`'s webhook port.
fn iptables(op: &str, ip: &str) {
    let rule = [
        "-p",
        "tcp",
        "-d",
        ip,
        "--dport",
        WEBHOOK_PORT,
        "-j",
        "REJECT",
        "--reject-with",
        "tcp-reset",
    ];
    let out = Command::new("iptables")
        .args(["-w", op, "OUTPUT"])
        .args(rule)
        .output();
    let out = out.expect("iptables runs");
    assert!(
        out.status.success(),
        "iptables {op}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The operator pods' IPs.
fn operator_ips(node: &Node) -> Vec<String> {
    let selector = "app.kubernetes.io/component=podlock-operator";
    let args = [
        "get",
        "pods",
        "-n",
        "podlock",
        "-l",
        selector,
        "-o",
        "jsonpath={.items[*].status.podIP}",
    ];
    node.kubectl(&args)
        .1
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// An app pod that asks for the sidecar by its annotation.
fn asking_pod(node: &Node) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: lonely\n  namespace: {NAMESPACE}\n  \
         annotations: {{podlock.io/inject: \"true\"}}\nspec:\n  containers:\n  - {{name: app, \
         image: {image}, imagePullPolicy: Never, command: [sleep, \"3600\"]}}\n",
        image = node.images["APP_IMAGE"],
    )
}

/// The message of the `SidecarMissing` Warning on pod `lonely`, once there is one.
fn warning(node: &Node) -> Result<String, String> {
    let each = r#"jsonpath={range .items[*]}{.involvedObject.kind}/{.involvedObject.name} {.type} {.reason}: {.message}{"\n"}{end}"#;
    let (_, events, _) = node.kubectl(&["get", "events", "-n", NAMESPACE, "-o", each]);
    (events.lines())
        .find(|l| l.starts_with("Pod/lonely Warning SidecarMissing"))
        .map(str::to_string)
        .ok_or_else(|| format!("no SidecarMissing Warning on pod lonely yet; events:\n{events}"))
}

pub fn a_pod_the_webhook_could_not_reach_is_a_warning_within_seconds(node: &Node) {
    node.kubectl(&["create", "namespace", NAMESPACE]);
    let firewall = Firewall::up(node);
    let created = Instant::now();
    node.kubectl_apply(&asking_pod(node));
    let (_, init, _) = node.kubectl(&[
        "get",
        "pod",
        "lonely",
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={.spec.initContainers[*].name}",
    ]);
    drop(firewall);
    assert_eq!(
        init.trim(),
        "",
        "the webhook was still reached: the pod has a sidecar"
    );
    let warned = retry(WARN_WITHIN, || warning(node));
    let after = created.elapsed().as_secs_f64();
    let message = warned.unwrap_or_else(|e| panic!("{e}\n{}", node.logs()));
    eprintln!(
        "a pod that asked for the sidecar while the webhook was unreachable started without it; \
         the operator's Warning came {after:.1} s after its creation: {message}"
    );
    node.kubectl(&["delete", "namespace", NAMESPACE, "--wait=false"]);
}
