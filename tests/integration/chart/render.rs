//! What the chart renders: lint, the optional parts, the settings Helm users set, and two
//! releases side by side.

use serde::Deserialize;

use super::{CHART, EXTERNAL_ETCD, KUBE_VERSION, documents, find, helm, render, render_release};

/// The names a rendering claims: (kind, namespace, name) of every object, and of the objects the
/// operator makes from its environment (its webhook configuration, leader Lease and certificate
/// Secret).
fn claimed_names(rendered: &str) -> std::collections::BTreeSet<(String, String, String)> {
    let mut names = std::collections::BTreeSet::new();
    for doc in serde_yaml::Deserializer::from_str(rendered) {
        let v = serde_yaml::Value::deserialize(doc).unwrap();
        let text = |v: &serde_yaml::Value| v.as_str().unwrap_or_default().to_string();
        let meta = &v["metadata"];
        names.insert((text(&v["kind"]), text(&meta["namespace"]), text(&meta["name"])));
        let env = &v["spec"]["template"]["spec"]["containers"][0]["env"];
        for var in env.as_sequence().into_iter().flatten() {
            let kind = match var["name"].as_str() {
                Some("PODLOCK_WEBHOOK_CONFIGURATION") => "MutatingWebhookConfiguration",
                Some("PODLOCK_LEADER_ELECTION_ID") => "Lease",
                Some("PODLOCK_WEBHOOK_TLS_SECRET") => "Secret",
                _ => continue,
            };
            let ns = if kind == "MutatingWebhookConfiguration" {
                ""
            } else {
                &text(&meta["namespace"])
            };
            names.insert((kind.into(), ns.into(), text(&var["value"])));
        }
    }
    names
}

#[test]
fn two_releases_share_no_name() {
    // Each team its own release, limited to its namespace; the second in the first's namespace
    // too, the hardest case.
    let etcd = ["--set", "etcd.bundled.enabled=true"];
    let first = render_release(
        "podlock",
        "locks",
        &[&etcd[..], &["--set", "operator.watchNamespace=team-a"]].concat(),
    );
    let second = render_release(
        "team-b",
        "locks",
        &[&etcd[..], &["--set", "operator.watchNamespace=team-b"]].concat(),
    );
    let (first, second) = (claimed_names(&first), claimed_names(&second));
    assert!(
        first
            .iter()
            .any(|(kind, _, name)| kind == "Lease" && name == "podlock-operator")
    );
    let shared: Vec<_> = first.intersection(&second).collect();
    assert!(shared.is_empty(), "two releases claim the same names: {shared:?}");
}

#[test]
fn the_chart_lints_clean() {
    let mut args = vec!["lint", "--strict", CHART];
    args.extend(EXTERNAL_ETCD);
    let (ok, out, err) = helm(&args);
    assert!(ok, "{out}{err}");
}

/// Issue #55, item 4: an install with neither `etcd.endpoints` nor the bundled etcd fails at
/// render, naming both values, instead of an operator that waits for an etcd that is not there.
#[test]
fn an_install_without_an_etcd_fails_naming_the_values_to_set() {
    for extra in [&[][..], &["--set", "etcd.endpoints=null"]] {
        let mut args = vec!["template", "podlock", CHART, "--kube-version", KUBE_VERSION];
        args.extend_from_slice(extra);
        let (ok, _, err) = helm(&args);
        assert!(!ok, "rendered without an etcd ({extra:?})");
        for value in ["etcd.endpoints", "etcd.bundled.enabled=true"] {
            assert!(
                err.contains(value),
                "{extra:?}: the error does not name {value}: {err}"
            );
        }
    }
    // Either etcd renders.
    assert!(render(&[]).contains("value: \"http://etcd.podlock.svc:2379\""));
    let bundled = render(&[
        "--set",
        "etcd.endpoints=null",
        "--set",
        "etcd.bundled.enabled=true",
    ]);
    assert!(bundled.contains("https://podlock-etcd-0.podlock-etcd.podlock.svc:2379"));
}

#[test]
fn optional_parts_render() {
    let out = render(&[
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "webhook.certManager.enabled=true",
    ]);
    assert!(out.contains("kind: ServiceMonitor") && out.contains("kind: Certificate"));
    // The operator's per-lock series keep their `namespace` (the lock's), to join the sidecars'.
    assert!(out.contains("honorLabels: true"), "{out}");
    assert!(out.contains("/etc/podlock/webhook/ca.crt"));
    let out = render(&["--set", "etcd.bundled.enabled=true"]);
    assert!(out.contains("kind: StatefulSet"));
    assert!(out.contains("https://podlock-etcd-0.podlock-etcd.podlock.svc:2379,https://podlock-etcd-1"));
}

#[test]
fn the_dashboard_and_the_alerts_render_only_when_enabled() {
    let default = render(&[]);
    assert!(!default.contains("grafana_dashboard") && !default.contains("kind: PrometheusRule"));
    let out = render(&[
        "--set",
        "dashboards.enabled=true",
        "--set",
        "dashboards.label=my_dashboards",
        "--set",
        "dashboards.labelValue=yes",
        "--set",
        "dashboards.namespace=monitoring",
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "prometheusRule.labels.release=kps",
    ]);
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&out)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let of_kind = |kind: &str| {
        docs.iter().find(|d| {
            d["kind"] == kind
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("podlock-dash") || kind == "PrometheusRule")
        })
    };
    let cm = of_kind("ConfigMap").expect("the dashboard ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["my_dashboards"], "yes");
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
    let json = cm["data"]["podlock.json"].as_str().unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(json).expect("the dashboard is valid JSON");
    assert_eq!(
        json,
        include_str!("../../../charts/podlock/dashboards/podlock.json").trim_end()
    );
    assert!(dashboard["panels"].as_array().is_some_and(|p| p.len() >= 8));
    let rule = of_kind("PrometheusRule").expect("the PrometheusRule");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["labels"]["release"], "kps");
    // The default label is the one kube-prometheus-stack's Grafana sidecar looks for.
    let out = render(&["--set", "dashboards.enabled=true"]);
    assert!(out.contains("grafana_dashboard: \"1\""), "{out}");
}

/// The chart admits the minors Kubernetes supports (1.35+): an older one, even one with native
/// sidecars and the Secret policy's API, is refused.
#[test]
fn a_cluster_older_than_the_supported_minors_is_refused() {
    for version in ["1.28.9", "1.34.9"] {
        let (ok, _, err) = helm(&["template", "podlock", CHART, "--kube-version", version]);
        assert!(!ok && err.contains("kubeVersion"), "{version}: {err}");
    }
}

#[test]
fn helm_users_settings_render() {
    let digest = format!("sha256:{}", "a".repeat(64));
    let out = render(&[
        "--set",
        &format!("image.digest={digest}"),
        "--set",
        "imagePullSecrets[0].name=regcred",
        "--set",
        "priorityClassName=system-cluster-critical",
        "--set",
        "metrics.podMonitor.enabled=true",
        "--set",
        "operator.replicas=1",
    ]);
    assert!(out.contains(&format!("image: ghcr.io/podlock/podlock@{digest}")));
    assert!(
        out.contains("imagePullSecrets:\n        - name: regcred"),
        "{out}"
    );
    assert!(out.contains("priorityClassName: system-cluster-critical"));
    assert!(out.contains("kind: PodMonitor") && out.contains("port: podlock-metrics"));
    assert!(
        !out.contains("kind: PodDisruptionBudget"),
        "a PDB over one replica blocks every drain"
    );
    for label in ["helm.sh/chart: podlock-", "app.kubernetes.io/managed-by: Helm"] {
        assert!(out.contains(label), "{label} missing");
    }
    // Two releases' selectors never select each other's pods.
    let selector =
        "matchLabels:\n      app.kubernetes.io/name: podlock\n      app.kubernetes.io/instance: podlock";
    assert!(out.contains(selector), "{out}");
}

#[test]
fn the_bundled_etcd_compacts_keeps_under_its_quota_and_spreads() {
    let out = render(&["--set", "etcd.bundled.enabled=true"]);
    for arg in [
        "--auto-compaction-mode=periodic",
        "--auto-compaction-retention=1h",
        "--quota-backend-bytes=805306368",
    ] {
        assert!(out.contains(arg), "{arg} missing");
    }
    assert!(out.contains("name: podlock-etcd\n  namespace: podlock") && out.contains("maxUnavailable: 1"));
    assert!(out.contains("podAntiAffinity"));
}

/// `operator.hostNetwork` (issue #55, item 3: a control plane that cannot reach pod addresses)
/// puts the operator on its nodes' network, one replica per node: their ports would clash.
#[test]
fn the_operator_can_run_on_its_nodes_network() {
    let spec = |extra: &[&str]| {
        let docs = documents(&render(extra));
        find(&docs, "Deployment", "podlock-operator")["spec"]["template"]["spec"].clone()
    };
    let default = spec(&[]);
    assert!(default["hostNetwork"].is_null() && default["dnsPolicy"].is_null());
    let anti = &default["affinity"]["podAntiAffinity"];
    assert!(anti["requiredDuringSchedulingIgnoredDuringExecution"].is_null());
    let host = spec(&["--set", "operator.hostNetwork=true"]);
    assert_eq!(host["hostNetwork"], true);
    assert_eq!(host["dnsPolicy"], "ClusterFirstWithHostNet");
    let anti = &host["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(anti[0]["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(
        anti[0]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"],
        "podlock-operator"
    );
}

/// Issue #55, item 1: the operator knows its own Pod (the downward API), where it puts the
/// `EtcdBelowMinimum` Event; with `operator.watchNamespace` elsewhere, its own namespace's Role
/// lets it read that Pod and write the Event.
#[test]
fn the_operator_knows_its_own_pod_and_may_warn_on_it() {
    let docs = documents(&render(&[]));
    let spec = &find(&docs, "Deployment", "podlock-operator")["spec"]["template"]["spec"];
    let env = spec["containers"][0]["env"].as_array().unwrap();
    let pod_name = env.iter().find(|e| e["name"] == "PODLOCK_POD_NAME");
    let field = pod_name.map(|e| &e["valueFrom"]["fieldRef"]["fieldPath"]);
    assert_eq!(field, Some(&serde_json::json!("metadata.name")), "{env:?}");
    let docs = documents(&render(&["--set", "operator.watchNamespace=team-a"]));
    let own = find(&docs, "Role", "podlock-operator");
    assert_eq!(own["metadata"]["namespace"], "podlock");
    let grants = |group: &str, resource: &str, verb: &str| {
        (own["rules"].as_array().unwrap().iter()).any(|r| {
            let has = |key: &str, v: &str| r[key].as_array().unwrap().iter().any(|x| x == v);
            has("apiGroups", group)
                && has("resources", resource)
                && has("verbs", verb)
                && r["resourceNames"].is_null()
        })
    };
    assert!(grants("", "pods", "get"), "{own}");
    assert!(grants("events.k8s.io", "events", "create"), "{own}");
}
