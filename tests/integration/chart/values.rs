//! The settings common clusters need land in their objects, and the operator takes what the
//! chart passes it.

use serde_json::json;
use std::process::Command;

use super::{documents, find, operator_env, render};

/// Values a common cluster sets (issue #41, item 3): every one of them set, as a values file.
const COMMON_CLUSTER_VALUES: &str = r#"
priorityClassName: everyone
operator:
  logLevel: info,kube=warn
  priorityClassName: operator-high
  resources: {requests: {cpu: 75m, memory: 96Mi}, limits: {cpu: null, memory: 1Gi}}
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{key: dedicated, operator: Equal, value: infra, effect: NoSchedule}]
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms: [{matchExpressions: [{key: pool, operator: In, values: [infra]}]}]
etcd:
  bundled:
    enabled: true
    storageClassName: fast-ssd
    logLevel: warn
    resources: {requests: {cpu: 250m, memory: 256Mi}, limits: {cpu: "2", memory: 2Gi}}
    priorityClassName: etcd-high
    nodeSelector: {disk: ssd}
    tolerations: [{key: etcd, operator: Exists}]
    affinity:
      podAntiAffinity:
        requiredDuringSchedulingIgnoredDuringExecution:
          - topologyKey: topology.kubernetes.io/zone
            labelSelector: {matchLabels: {app.kubernetes.io/component: etcd}}
sidecar:
  resources: {requests: {cpu: 5m, memory: 24Mi}, limits: {memory: 48Mi}}
  logLevel: debug
  port: 4050
  imagePullSecrets: [{name: regcred}]
  securityContext: {runAsUser: null}
webhook:
  timeoutSeconds: 9
  namespaceSelector:
    matchExpressions: [{key: team, operator: In, values: [a, b]}]
  failurePolicy: Fail
  objectSelector: {matchLabels: {podlock.io/allowed: "true"}}
metrics:
  serviceMonitor: {enabled: true, labels: {release: kps}}
  podMonitor: {enabled: true, labels: {release: kps, team: locks}}
prometheusRule: {enabled: true, labels: {release: kps}}
"#;

/// Every value of COMMON_CLUSTER_VALUES lands in the object it is for, and the defaults keep
/// what the chart rendered before them.
#[test]
fn common_cluster_settings_land_in_their_objects() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, COMMON_CLUSTER_VALUES).unwrap();
    let docs = documents(&render(&["-f", file.to_str().unwrap()]));

    // Prometheus's selectors (kube-prometheus-stack: release: NAME) find the monitors and rules.
    let labels = |kind: &str, name: &str| find(&docs, kind, name)["metadata"]["labels"].clone();
    assert_eq!(labels("ServiceMonitor", "podlock")["release"], "kps");
    assert_eq!(labels("PodMonitor", "podlock-sidecars")["release"], "kps");
    assert_eq!(labels("PodMonitor", "podlock-sidecars")["team"], "locks");
    assert_eq!(labels("PrometheusRule", "podlock")["release"], "kps");
    // ... and keep the chart's own labels.
    assert_eq!(
        labels("PodMonitor", "podlock-sidecars")["app.kubernetes.io/instance"],
        "podlock"
    );

    // The operator's pods (`cpu: null` drops the default's CPU limit: Helm merges maps).
    let operator = &find(&docs, "Deployment", "podlock-operator")["spec"]["template"]["spec"];
    assert_eq!(operator["priorityClassName"], "operator-high");
    assert_eq!(operator["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(operator["tolerations"][0]["value"], "infra");
    assert!(
        operator["affinity"]["nodeAffinity"].is_object(),
        "{}",
        operator["affinity"]
    );
    assert!(
        operator["affinity"]["podAntiAffinity"].is_null(),
        "the given affinity replaces the default"
    );
    assert_eq!(
        operator["containers"][0]["resources"],
        json!({"requests": {"cpu": "75m", "memory": "96Mi"}, "limits": {"memory": "1Gi"}})
    );
    assert_eq!(
        operator_env(&docs, "PODLOCK_LOG").as_deref(),
        Some("info,kube=warn")
    );

    // The bundled etcd's pods and volumes.
    let etcd = &find(&docs, "StatefulSet", "podlock-etcd")["spec"];
    let pod = &etcd["template"]["spec"];
    assert_eq!(
        etcd["volumeClaimTemplates"][0]["spec"]["storageClassName"],
        "fast-ssd"
    );
    assert_eq!(pod["priorityClassName"], "etcd-high");
    assert_eq!(pod["nodeSelector"], json!({"disk": "ssd"}));
    assert_eq!(pod["tolerations"], json!([{"key": "etcd", "operator": "Exists"}]));
    let anti = &pod["affinity"]["podAntiAffinity"];
    assert_eq!(
        anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    assert!(anti["preferredDuringSchedulingIgnoredDuringExecution"].is_null());
    let container = &pod["containers"][0];
    assert_eq!(
        container["resources"],
        json!({"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "2Gi"}})
    );
    assert!(
        container["args"]
            .as_array()
            .unwrap()
            .contains(&json!("--log-level=warn"))
    );

    // The sidecar's and the webhook's settings reach the operator, which applies them.
    // (The default's CPU limit is kept: Helm merges the given map into it.)
    let resources: serde_json::Value =
        serde_json::from_str(&operator_env(&docs, "PODLOCK_SIDECAR_RESOURCES").unwrap()).unwrap();
    assert_eq!(
        resources,
        json!({"requests": {"cpu": "5m", "memory": "24Mi"}, "limits": {"cpu": "200m", "memory": "48Mi"}})
    );
    assert_eq!(
        operator_env(&docs, "PODLOCK_SIDECAR_LOG_LEVEL").as_deref(),
        Some("debug")
    );
    assert_eq!(
        operator_env(&docs, "PODLOCK_WEBHOOK_TIMEOUT_SECONDS").as_deref(),
        Some("9")
    );
    let selector: serde_json::Value =
        serde_json::from_str(&operator_env(&docs, "PODLOCK_WEBHOOK_NAMESPACE_SELECTOR").unwrap()).unwrap();
    assert_eq!(
        selector,
        json!({"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]})
    );
    assert_eq!(
        operator_env(&docs, "PODLOCK_WEBHOOK_FAILURE_POLICY").as_deref(),
        Some("Fail")
    );
    let objects: serde_json::Value =
        serde_json::from_str(&operator_env(&docs, "PODLOCK_WEBHOOK_OBJECT_SELECTOR").unwrap()).unwrap();
    assert_eq!(objects, json!({"matchLabels": {"podlock.io/allowed": "true"}}));

    // Defaults: the spread over nodes, etcd without a CPU limit on the cluster's default
    // StorageClass, the top-level priority class, no namespace selector.
    let docs = documents(&render(&[
        "--set",
        "etcd.bundled.enabled=true",
        "--set",
        "priorityClassName=everyone",
    ]));
    let etcd = &find(&docs, "StatefulSet", "podlock-etcd")["spec"];
    let pod = &etcd["template"]["spec"];
    assert!(etcd["volumeClaimTemplates"][0]["spec"]["storageClassName"].is_null());
    assert!(pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"].is_array());
    assert_eq!(pod["priorityClassName"], "everyone");
    assert_eq!(
        pod["containers"][0]["resources"],
        json!({"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1536Mi"}})
    );
    let operator = &find(&docs, "Deployment", "podlock-operator")["spec"]["template"]["spec"];
    assert_eq!(operator["priorityClassName"], "everyone");
    assert!(operator["affinity"]["podAntiAffinity"].is_object());
    assert!(operator_env(&docs, "PODLOCK_WEBHOOK_NAMESPACE_SELECTOR").is_none());
    assert!(operator_env(&docs, "PODLOCK_WEBHOOK_OBJECT_SELECTOR").is_none());
    assert_eq!(
        operator_env(&docs, "PODLOCK_WEBHOOK_FAILURE_POLICY").as_deref(),
        Some("Ignore")
    );
    assert_eq!(
        operator_env(&docs, "PODLOCK_WEBHOOK_TIMEOUT_SECONDS").as_deref(),
        Some("5")
    );
}

/// `podlock ARGS` (the rendered `operator` and its extra flags) with the environment `vars`,
/// and no cluster to reach; its error output. It must fail: at the flags, or finding no cluster.
pub(super) fn run_operator(args: &[&str], vars: &[(&str, String)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(crate::common::podlock_bin())
        .args(args)
        .args(["--etcd-endpoints", "http://127.0.0.1:1"])
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .env("KUBECONFIG", dir.path().join("no-kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// What the chart passes for the sidecar and the webhook, the operator takes: `podlock
/// operator` reads the rendered variables as its flags and gets as far as looking for a
/// cluster; a bad value stops it first, naming the flag.
#[test]
fn the_operator_accepts_what_the_chart_passes_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, COMMON_CLUSTER_VALUES).unwrap();
    let docs = documents(&render(&["-f", file.to_str().unwrap()]));
    let passed = [
        "PODLOCK_SIDECAR_RESOURCES",
        "PODLOCK_SIDECAR_LOG_LEVEL",
        "PODLOCK_WEBHOOK_TIMEOUT_SECONDS",
        "PODLOCK_WEBHOOK_NAMESPACE_SELECTOR",
        "PODLOCK_WEBHOOK_FAILURE_POLICY",
        "PODLOCK_WEBHOOK_OBJECT_SELECTOR",
        "PODLOCK_SIDECAR_PORT",
        "PODLOCK_SIDECAR_IMAGE_PULL_SECRETS",
        "PODLOCK_SIDECAR_SECURITY_CONTEXT",
    ];
    let vars: Vec<(&str, String)> = passed
        .iter()
        .map(|name| {
            (
                *name,
                operator_env(&docs, name).unwrap_or_else(|| panic!("{name} not passed")),
            )
        })
        .collect();
    let run = |vars: &[(&str, String)]| run_operator(&["operator"], vars);
    let err = run(&vars);
    assert!(err.contains("cannot reach the Kubernetes API"), "{vars:?}: {err}");
    eprintln!("the operator took {vars:?}");
    for (name, bad, flag) in [
        (
            "PODLOCK_SIDECAR_RESOURCES",
            r#"{"requests": {"cpu": "lots"}}"#,
            "--sidecar-resources",
        ),
        ("PODLOCK_SIDECAR_LOG_LEVEL", "verbose", "--sidecar-log-level"),
        (
            "PODLOCK_WEBHOOK_TIMEOUT_SECONDS",
            "60",
            "--webhook-timeout-seconds",
        ),
        (
            "PODLOCK_WEBHOOK_NAMESPACE_SELECTOR",
            "team=a",
            "--webhook-namespace-selector",
        ),
        (
            "PODLOCK_WEBHOOK_FAILURE_POLICY",
            "Sometimes",
            "--webhook-failure-policy",
        ),
        (
            "PODLOCK_WEBHOOK_OBJECT_SELECTOR",
            r#"{"matchLabel": {}}"#,
            "--webhook-object-selector",
        ),
        ("PODLOCK_SIDECAR_PORT", "80", "--sidecar-port"),
        (
            "PODLOCK_SIDECAR_IMAGE_PULL_SECRETS",
            "Regcred",
            "--sidecar-image-pull-secrets",
        ),
        (
            "PODLOCK_SIDECAR_SECURITY_CONTEXT",
            r#"{"runAsUsr": 1}"#,
            "--sidecar-security-context",
        ),
    ] {
        let mut vars = vars.clone();
        vars.retain(|(n, _)| *n != name);
        vars.push((name, bad.to_string()));
        let err = run(&vars);
        assert!(
            err.contains(flag) && !err.contains("cannot reach"),
            "{name}={bad}: {err}"
        );
        eprintln!("{name}={bad}: {}", err.lines().next().unwrap_or_default());
    }
}
