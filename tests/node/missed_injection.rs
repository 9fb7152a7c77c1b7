//! Issue #55, item 3, on the real node: with the webhook unreachable (its Service pointed at no
//! pod, so the API server finds no endpoint for it), an annotated Deployment rolls out without
//! the sidecar (`failurePolicy: Ignore`), and the operator, still running, puts a Warning Event
//! `SidecarMissing` on the pod, its ReplicaSet and its Deployment within seconds.

use std::time::{Duration, Instant};

use crate::common::node::{Node, retry};

/// The webhook's Service, which the chart makes in the release's namespace.
const SERVICE: &str = "podlock-webhook";

/// A label no pod carries: added to the Service's selector, it selects none.
const NOWHERE: &str = "podlock.io/test-no-endpoint";

/// A Deployment whose pods ask for the sidecar (in their template, as a user writes it).
fn manifest(node: &Node) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: unhooked, namespace: app}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: unhooked}}}}
  template:
    metadata:
      labels: {{app: unhooked}}
      annotations: {{podlock.io/inject: "true"}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: app
          image: {image}
          imagePullPolicy: Never
          command: [sleep, "3600"]
"#,
        image = node.images["APP_IMAGE"],
    )
}

/// The init containers a pod asking for the sidecar would get now: the webhook's answer to a
/// server-side dry run (`podlock` when it answered, empty when it was not reached).
fn dry_run_injects(node: &Node) -> String {
    let (ok, out, err) = node.kubectl(&[
        "run",
        "podlock-check",
        "-n",
        "app",
        "--image=busybox",
        "--restart=Never",
        "--dry-run=server",
        "--annotations=podlock.io/inject=true",
        "-o",
        "jsonpath={.spec.initContainers[*].name}",
    ]);
    assert!(ok, "server-side dry run: {err}");
    out.trim().to_string()
}

/// Sets the webhook Service's selector to select no pod (`away`), or back; waits until the
/// webhook's answer to a dry run shows it.
fn webhook_reachable(node: &Node, reachable: bool) {
    let value = if reachable { "null" } else { "\"true\"" };
    let patch = format!(r#"{{"spec": {{"selector": {{"{NOWHERE}": {value}}}}}}}"#);
    let (ok, _, err) = node.kubectl(&[
        "patch", "service", SERVICE, "-n", "podlock", "--type", "merge", "-p", &patch,
    ]);
    assert!(ok, "patch the webhook's Service: {err}");
    let expected = if reachable { "podlock" } else { "" };
    let seen = retry(Duration::from_secs(30), || match dry_run_injects(node) {
        answer if answer == expected => Ok(()),
        answer => Err(answer),
    });
    seen.unwrap_or_else(|answer| panic!("dry run still injects {answer:?}, want {expected:?}"));
}

/// Puts the webhook's Service back when dropped, so that a failed step leaves the webhook
/// reachable for the steps after it.
struct Reachable<'a>(&'a Node);

impl Drop for Reachable<'_> {
    fn drop(&mut self) {
        let patch = format!(r#"{{"spec": {{"selector": {{"{NOWHERE}": null}}}}}}"#);
        self.0.kubectl(&[
            "patch", "service", SERVICE, "-n", "podlock", "--type", "merge", "-p", &patch,
        ]);
    }
}

/// The objects of namespace `app` with a `SidecarMissing` Event, as `Kind/name`.
fn warned(node: &Node) -> Vec<String> {
    let (ok, out, err) = node.kubectl(&[
        "get",
        "events",
        "-n",
        "app",
        "--field-selector",
        "reason=SidecarMissing,type=Warning",
        "-o",
        "jsonpath={range .items[*]}{.involvedObject.kind}/{.involvedObject.name}{\"\\n\"}{end}",
    ]);
    assert!(ok, "{err}");
    out.lines().map(str::to_string).collect()
}

/// The one pod of the Deployment, once it exists: its name, its ReplicaSet's, and its init
/// containers.
fn the_pod(node: &Node) -> (String, String, String) {
    let path = "jsonpath={.items[0].metadata.name} {.items[0].metadata.ownerReferences[0].name} {.items[0].spec.initContainers[*].name}";
    let found = retry(Duration::from_secs(30), || {
        let (_, out, err) = node.kubectl(&["get", "pods", "-n", "app", "-l", "app=unhooked", "-o", path]);
        let mut parts = out.split_whitespace().map(str::to_string);
        match (parts.next(), parts.next()) {
            (Some(pod), Some(set)) => Ok((pod, set, parts.collect::<Vec<_>>().join(" "))),
            _ => Err(format!("{out}{err}")),
        }
    });
    found.unwrap_or_else(|e| panic!("no pod of deployment/unhooked: {e}"))
}

/// The webhook made unreachable, an annotated Deployment rolls out without the sidecar and the
/// operator warns on its pod, ReplicaSet and Deployment within seconds; then the webhook is
/// reachable again and the Deployment is removed.
pub fn a_pod_the_webhook_missed_is_warned_about_within_seconds(node: &Node) {
    let _back = Reachable(node);
    webhook_reachable(node, false);
    let created = Instant::now();
    node.kubectl_apply(&manifest(node));
    let (pod, replica_set, init) = the_pod(node);
    assert_eq!(init, "", "{pod} was injected: the webhook was reachable");
    let expected = [
        format!("Pod/{pod}"),
        format!("ReplicaSet/{replica_set}"),
        "Deployment/unhooked".to_string(),
    ];
    let all_warned = retry(Duration::from_secs(20), || {
        let warned = warned(node);
        match expected.iter().all(|e| warned.contains(e)) {
            true => Ok(warned),
            false => Err(format!("{warned:?}")),
        }
    });
    let warned = all_warned.unwrap_or_else(|e| panic!("SidecarMissing on {e}, want {expected:?}"));
    let within = created.elapsed();
    eprintln!(
        "SidecarMissing on {warned:?} {:.1} s after the Deployment was applied",
        within.as_secs_f64()
    );
    assert!(within < Duration::from_secs(20), "{within:?}");
    webhook_reachable(node, true);
    let (ok, _, err) = node.kubectl(&["delete", "deployment", "unhooked", "-n", "app", "--wait=true"]);
    assert!(ok, "{err}");
}
