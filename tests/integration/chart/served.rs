//! The APIs the chart renders are served: by a real API server, by every Kubernetes minor version
//! the chart admits; and the generated files (`manifests/`, the chart's `crds/`) in step.

use serde::Deserialize;
use std::collections::BTreeSet;

use super::{CHART, EXTERNAL_ETCD, floor_version, helm, render};
use crate::common::kube::with_crd;

/// `manifests/` as `scripts/gen-manifests.sh` renders it: for the oldest Kubernetes the chart
/// admits, without Helm's hooks (the `helm test` objects, the pre-delete Job).
fn render_manifest(extra: &[&str]) -> String {
    let floor = floor_version();
    let mut args = vec!["template", "podlock", CHART, "--namespace", "podlock"];
    args.extend(["--kube-version", floor.as_str(), "--skip-tests", "--no-hooks"]);
    args.extend(EXTERNAL_ETCD);
    args.extend_from_slice(extra);
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm template {args:?}: {err}");
    out
}

#[test]
fn generated_files_are_in_step_with_the_chart_and_the_crd() {
    let crd = include_str!("../../../crds/distributedlock.yaml");
    let chart_crd = std::fs::read_to_string(format!("{CHART}/crds/distributedlock.yaml")).unwrap();
    assert_eq!(
        chart_crd, crd,
        "the chart's CRD is stale: run scripts/gen-manifests.sh"
    );
    let manifest = include_str!("../../../manifests/podlock.yaml");
    // `kubectl apply -f manifests/podlock.yaml` works on every admitted cluster: no hook of
    // Helm's (the `helm test` Pod and its NetworkPolicy would run once and fail, the pre-delete
    // Job would stop the operator at once), and only kinds the oldest one serves.
    let floor = floor_version();
    let minor: u32 = floor.split('.').nth(1).unwrap().parse().unwrap();
    let served = &served_apis()[&minor];
    let mut objects = 0;
    for doc in serde_yaml::Deserializer::from_str(manifest) {
        let v = serde_yaml::Value::deserialize(doc).unwrap();
        if v.is_null() {
            continue; // a document of comments only
        }
        let (api, kind) = (v["apiVersion"].as_str().unwrap(), v["kind"].as_str().unwrap());
        let name = format!("{kind} {}", v["metadata"]["name"].as_str().unwrap());
        let hook = v["metadata"]["annotations"]["helm.sh/hook"].as_str();
        assert!(
            hook.is_none(),
            "manifests/podlock.yaml has the {hook:?} hook {name}"
        );
        let crd = (api, kind) == ("apiextensions.k8s.io/v1", "CustomResourceDefinition");
        assert!(
            crd || served.contains(&(api.to_string(), kind.to_string())),
            "manifests/podlock.yaml has {api} {name}, which Kubernetes {floor} does not serve"
        );
        objects += 1;
    }
    eprintln!("manifests/podlock.yaml: {objects} objects, for Kubernetes {floor}+, no hook of Helm's");
    let all = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: podlock\n---\n{}",
        render_manifest(&["--include-crds"])
    );
    assert_eq!(
        all, manifest,
        "manifests/podlock.yaml is stale: run scripts/gen-manifests.sh"
    );
    // The RBAC alone, with its Secret policy (which tests/integration/rbac.rs applies).
    let rbac = render(&["--show-only", "templates/rbac.yaml"]);
    assert_eq!(
        rbac,
        include_str!("../../../manifests/rbac.yaml"),
        "manifests/rbac.yaml is stale: run scripts/gen-manifests.sh"
    );
}

#[tokio::test]
async fn the_rendered_objects_are_accepted_by_a_real_api_server() {
    let plane = with_crd();
    plane.namespace("podlock");
    for values in [
        &[][..],
        &["--set", "etcd.bundled.enabled=true"][..],
        &[
            "--set",
            "etcd.tlsSecret=etcd-tls",
            "--set",
            "etcd.authSecret=etcd-root",
        ][..],
    ] {
        let rendered = render(values);
        let (ok, out, err) = plane.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &rendered);
        assert!(ok, "server-side dry run of {values:?}: {err}");
        for kind in [
            "deployment.apps/podlock-operator",
            "service/podlock-webhook",
            "poddisruptionbudget.policy/podlock-operator",
        ] {
            assert!(out.contains(kind), "{kind} missing: {out}");
        }
        let bundled = [
            "networkpolicy.networking.k8s.io/podlock-etcd",
            "secret/podlock-etcd-tls",
        ];
        if values.contains(&"etcd.bundled.enabled=true") {
            assert!(bundled.iter().all(|k| out.contains(k)), "{out}");
        }
    }
}

/// Per Kubernetes minor version, the GA group/versions and kinds it serves by default, as
/// `scripts/kube-apis.sh` lists them from k8s.io/api of that version.
fn served_apis() -> std::collections::BTreeMap<u32, BTreeSet<(String, String)>> {
    let text = include_str!("../kube-apis.txt");
    let mut served = std::collections::BTreeMap::<u32, BTreeSet<_>>::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let mut parts = line.split(' ');
        let (Some(version), Some(api), Some(kind)) = (parts.next(), parts.next(), parts.next()) else {
            panic!("kube-apis.txt: malformed line {line:?}")
        };
        let minor = version
            .strip_prefix("1.")
            .and_then(|m| m.parse().ok())
            .expect(line);
        served.entry(minor).or_default().insert((api.into(), kind.into()));
    }
    served
}

/// Kinds of CustomResourceDefinitions that an optional feature needs (the Prometheus operator's,
/// cert-manager's): no Kubernetes version serves them, the user installs them.
const FROM_CRDS: [(&str, &str); 5] = [
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("cert-manager.io/v1", "Certificate"),
    ("cert-manager.io/v1", "Issuer"),
];

/// Every optional feature on.
const EVERYTHING: [&str; 14] = [
    "--set",
    "etcd.bundled.enabled=true",
    "--set",
    "webhook.certManager.enabled=true",
    "--set",
    "metrics.serviceMonitor.enabled=true",
    "--set",
    "metrics.podMonitor.enabled=true",
    "--set",
    "dashboards.enabled=true",
    "--set",
    "prometheusRule.enabled=true",
    "--set",
    "operator.watchNamespace=apps",
];

/// The (apiVersion, kind) of every object in a rendering.
fn kinds(rendered: &str) -> Vec<(String, String)> {
    let docs =
        serde_yaml::Deserializer::from_str(rendered).map(|d| serde_yaml::Value::deserialize(d).unwrap());
    let text = |v: &serde_yaml::Value| v.as_str().map(str::to_string);
    docs.filter_map(|d| Some((text(&d["apiVersion"])?, text(&d["kind"])?)))
        .collect()
}

/// Finding 4 of the day-two review: `kubeVersion` admitted 1.29, but the default values rendered a
/// ValidatingAdmissionPolicy, which 1.29 does not serve. Every minor version from the chart's
/// floor to the newest Kubernetes release, with default values, the bundled etcd and every
/// optional feature, rendered as `helm template --kube-version` does and as an install does
/// (the cluster's kinds as `--api-versions`, from the same list): each object's kind is served.
#[test]
fn every_admitted_minor_renders_only_apis_it_serves() {
    let served = served_apis();
    let chart = std::fs::read_to_string(format!("{CHART}/Chart.yaml")).unwrap();
    let floor = chart
        .lines()
        .find_map(|l| l.strip_prefix("kubeVersion: \">=1."))
        .expect("kubeVersion");
    let floor: u32 = floor.split('.').next().unwrap().parse().unwrap();
    assert_eq!(
        served.keys().next(),
        Some(&floor),
        "kube-apis.txt must start at the chart's floor 1.{floor}"
    );
    let crd = |api: &str, kind: &str| FROM_CRDS.contains(&(api, kind));
    for (minor, apis) in &served {
        let version = format!("1.{minor}.0");
        let discovered: Vec<String> = apis.iter().map(|(api, kind)| format!("{api}/{kind}")).collect();
        let discovery = discovered.join(",");
        for values in [&[][..], &["--set", "etcd.bundled.enabled=true"], &EVERYTHING] {
            for listed in [None, Some(discovery.as_str())] {
                let mut args = vec!["template", "podlock", CHART, "--namespace", "podlock"];
                args.extend(["--kube-version", version.as_str()]);
                args.extend(EXTERNAL_ETCD);
                args.extend(listed.map(|l| ["--api-versions", l]).into_iter().flatten());
                args.extend_from_slice(values);
                let (ok, out, err) = helm(&args);
                assert!(ok, "helm template for {version} {values:?}: {err}");
                for (api, kind) in kinds(&out) {
                    let everything = values == EVERYTHING;
                    assert!(
                        apis.contains(&(api.clone(), kind.clone())) || (everything && crd(&api, &kind)),
                        "the chart renders {api} {kind} for Kubernetes {version} {values:?}, which does not serve it"
                    );
                }
            }
        }
    }
    let newest = served.keys().last().unwrap();
    eprintln!("rendered for Kubernetes 1.{floor} to 1.{newest}");
}
