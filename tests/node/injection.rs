//! Injection you cannot miss (#55 item 3), on the node: with the webhook unreachable (its
//! Service pointed at a port nothing listens on, as a private cluster's firewall or an overlay
//! CNI leaves it), `failurePolicy: Ignore` lets a pod that asked for the sidecar start without
//! it, and the operator says so within seconds: a Warning Event `SidecarMissing` on the pod.

use std::time::{Duration, Instant};

use crate::common::node::{Node, retry};

/// The namespace of the pod that asks for the sidecar.
const NAMESPACE: &str = "missed";
/// How long the operator may take to warn: "within seconds", with headroom for the node.
const WARN_WITHIN: Duration = Duration::from_secs(30);

/// Points the webhook's Service at `port` (a number, or the operator's port name `webhook`).
fn webhook_target(node: &Node, port: &str) {
    let value = port
        .parse::<u16>()
        .map_or_else(|_| format!("\"{port}\""), |n| n.to_string());
    let patch = format!(r#"[{{"op":"replace","path":"/spec/ports/0/targetPort","value":{value}}}]"#);
    let args = [
        "patch",
        "service",
        "podlock-webhook",
        "-n",
        "podlock",
        "--type=json",
        "-p",
        &patch,
    ];
    let (ok, _, err) = node.kubectl(&args);
    assert!(ok, "kubectl patch service podlock-webhook: {err}");
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
    webhook_target(node, "9");
    // kube-proxy moves the Service's rules over within a moment.
    std::thread::sleep(Duration::from_secs(3));
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
    webhook_target(node, "webhook");
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
