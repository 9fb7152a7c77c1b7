//! The Helm chart: lint, schema-checked values, rendered objects accepted by a real API server,
//! and the generated files (`manifests/`, the chart's `crds/`) in step with their sources.

use serde::Deserialize;
use std::collections::BTreeSet;
use std::process::Command;

use crate::common::bin_dir;
use crate::common::kube::with_crd;

pub(crate) const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/podlock");

/// Runs helm with `args`; returns (success, stdout, stderr).
pub(crate) fn helm(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin_dir().join("helm"))
        .args(args)
        .output()
        .expect("helm: run scripts/setup.sh --kubernetes");
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

/// The cluster version charts are rendered for (the chart needs 1.29+ for native sidecars).
const KUBE_VERSION: &str = "1.34.0";

/// `helm template` of the chart as release `podlock` in namespace `podlock`, with `extra` arguments.
pub(crate) fn render(extra: &[&str]) -> String {
    render_release("podlock", "podlock", extra)
}

/// Renders the chart as release `release` in `namespace`.
pub(crate) fn render_release(release: &str, namespace: &str, extra: &[&str]) -> String {
    let mut args = vec!["template", release, CHART, "--namespace", namespace];
    args.extend(["--kube-version", KUBE_VERSION]);
    args.extend_from_slice(extra);
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm template {release} {extra:?}: {err}");
    out
}

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
    let (ok, out, err) = helm(&["lint", "--strict", CHART]);
    assert!(ok, "{out}{err}");
}

#[test]
fn bad_values_fail_naming_the_field() {
    for (set, field) in [
        ("operator.replicas=0", "/operator/replicas"),
        ("operator.leaderLeaseSeconds=1", "/operator/leaderLeaseSeconds"),
        (
            "operator.leaderRenewDeadlineSeconds=15",
            "operator.leaderRenewDeadlineSeconds",
        ),
        ("etcd.endpoints[0]=etcd:2379", "/etcd/endpoints/0"),
        ("operator.logFormat=xml", "/operator/logFormat"),
        ("operatr.replicas=2", "operatr"),
        ("image.digest=latest", "/image/digest"),
        ("imagePullSecrets[0].nam=x", "/imagePullSecrets/0"),
        (
            "etcd.bundled.quotaBackendBytes=1024",
            "/etcd/bundled/quotaBackendBytes",
        ),
        ("dashboards.labelValue=a b", "/dashboards/labelValue"),
        (
            "prometheusRule.heldTooLong.factor=1",
            "/prometheusRule/heldTooLong/factor",
        ),
        // The settings common clusters need (issue #41), each of the wrong type or value.
        (
            "metrics.serviceMonitor.labels=kps",
            "/metrics/serviceMonitor/labels",
        ),
        (
            "metrics.podMonitor.labels.release[0]=kps",
            "/metrics/podMonitor/labels/release",
        ),
        ("prometheusRule.labels=kps", "/prometheusRule/labels"),
        (
            "etcd.bundled.storageClassName[0]=fast",
            "/etcd/bundled/storageClassName",
        ),
        (
            "etcd.bundled.storageClassName=Fast SSD",
            "/etcd/bundled/storageClassName",
        ),
        ("etcd.bundled.logLevel=verbose", "/etcd/bundled/logLevel"),
        (
            "etcd.bundled.resources.requests.cpu=lots",
            "/etcd/bundled/resources/requests/cpu",
        ),
        ("etcd.bundled.affinity=near", "/etcd/bundled/affinity"),
        ("etcd.bundled.tolerations.key=x", "/etcd/bundled/tolerations"),
        (
            "etcd.bundled.nodeSelector.disk[0]=ssd",
            "/etcd/bundled/nodeSelector/disk",
        ),
        (
            "etcd.bundled.priorityClassName[0]=high",
            "/etcd/bundled/priorityClassName",
        ),
        ("operator.affinity.nodeAfinity.x=1", "/operator/affinity"),
        (
            "operator.tolerations[0].operator=Maybe",
            "/operator/tolerations/0/operator",
        ),
        ("operator.nodeSelector=linux", "/operator/nodeSelector"),
        (
            "operator.resources.limits.memory=lots",
            "/operator/resources/limits/memory",
        ),
        ("operator.resources.limit.memory=1Gi", "/operator/resources"),
        ("operator.priorityClassName=High", "/operator/priorityClassName"),
        ("operator.logLevel=verbose", "/operator/logLevel"),
        ("sidecar.logLevel=loud", "/sidecar/logLevel"),
        (
            "sidecar.resources.requests.memory=16MB",
            "/sidecar/resources/requests/memory",
        ),
        ("sidecar.resources=small", "/sidecar/resources"),
        ("webhook.timeoutSeconds=31", "/webhook/timeoutSeconds"),
        ("webhook.timeoutSeconds=five", "/webhook/timeoutSeconds"),
        (
            "webhook.namespaceSelector.matchLabels=team",
            "/webhook/namespaceSelector/matchLabels",
        ),
        (
            "webhook.namespaceSelector.matchExpressions[0].operator=Has",
            "/webhook/namespaceSelector/matchExpressions/0",
        ),
    ] {
        let args = [
            "template",
            "podlock",
            CHART,
            "--kube-version",
            KUBE_VERSION,
            "--set",
            set,
        ];
        let (ok, _, err) = helm(&args);
        assert!(!ok, "--set {set} was accepted");
        assert!(
            err.contains(field),
            "--set {set}: error does not name {field}: {err}"
        );
    }
}

/// The oldest Kubernetes version the chart admits, from its `kubeVersion` (`>=1.29.0-0`): 1.29.0.
fn floor_version() -> String {
    let chart = std::fs::read_to_string(format!("{CHART}/Chart.yaml")).unwrap();
    let floor = chart
        .lines()
        .find_map(|l| l.strip_prefix("kubeVersion: \">="))
        .expect("kubeVersion");
    floor.split(['-', '"']).next().unwrap().to_string()
}

/// `manifests/` as `scripts/gen-manifests.sh` renders it: for the oldest Kubernetes the chart
/// admits, without Helm's hooks (the `helm test` objects, the pre-delete Job).
fn render_manifest(extra: &[&str]) -> String {
    let floor = floor_version();
    let mut args = vec!["template", "podlock", CHART, "--namespace", "podlock"];
    args.extend(["--kube-version", floor.as_str(), "--skip-tests", "--no-hooks"]);
    args.extend_from_slice(extra);
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm template {args:?}: {err}");
    out
}

#[test]
fn generated_files_are_in_step_with_the_chart_and_the_crd() {
    let crd = include_str!("../../crds/distributedlock.yaml");
    let chart_crd = std::fs::read_to_string(format!("{CHART}/crds/distributedlock.yaml")).unwrap();
    assert_eq!(
        chart_crd, crd,
        "the chart's CRD is stale: run scripts/gen-manifests.sh"
    );
    let manifest = include_str!("../../manifests/podlock.yaml");
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
        assert!(
            !kind.starts_with("ValidatingAdmissionPolicy"),
            "manifests/podlock.yaml has {name}, which Kubernetes {floor} does not serve"
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
    // The RBAC alone, with its 1.30+ Secret policy (which tests/integration/rbac.rs applies).
    let rbac = render(&["--show-only", "templates/rbac.yaml"]);
    assert_eq!(
        rbac,
        include_str!("../../manifests/rbac.yaml"),
        "manifests/rbac.yaml is stale: run scripts/gen-manifests.sh"
    );
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
        include_str!("../../charts/podlock/dashboards/podlock.json").trim_end()
    );
    assert!(dashboard["panels"].as_array().is_some_and(|p| p.len() >= 8));
    let rule = of_kind("PrometheusRule").expect("the PrometheusRule");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["labels"]["release"], "kps");
    // The default label is the one kube-prometheus-stack's Grafana sidecar looks for.
    let out = render(&["--set", "dashboards.enabled=true"]);
    assert!(out.contains("grafana_dashboard: \"1\""), "{out}");
}

#[test]
fn a_cluster_without_native_sidecars_is_refused() {
    let (ok, _, err) = helm(&["template", "podlock", CHART, "--kube-version", "1.28.9"]);
    assert!(!ok && err.contains("kubeVersion"), "{err}");
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
    let text = include_str!("kube-apis.txt");
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

/// Finding 4 of the day-two review: `kubeVersion` admits 1.29, but the default values rendered a
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

/// The chart's install notes, rendered. `helm template` leaves NOTES.txt out (and `helm install
/// --dry-run` takes no `--kube-version`): a copy of the chart renders it as a manifest, through
/// tpl, as the YAML block `notes`, whose value is the notes' text.
struct Notes {
    _copy: tempfile::TempDir,
    chart: std::path::PathBuf,
}

impl Notes {
    fn new() -> Self {
        let copy = tempfile::tempdir().unwrap();
        let chart = copy.path().join("podlock");
        let copied = Command::new("cp")
            .arg("-r")
            .arg(CHART)
            .arg(&chart)
            .status()
            .unwrap();
        assert!(copied.success());
        std::fs::copy(chart.join("templates/NOTES.txt"), chart.join("notes.txt")).unwrap();
        let notes = "notes: |\n{{ tpl (.Files.Get \"notes.txt\") . | indent 2 }}\n";
        std::fs::write(chart.join("templates/zz-notes.yaml"), notes).unwrap();
        Notes { _copy: copy, chart }
    }

    /// The notes' text for Kubernetes `version`, with `extra` arguments.
    fn render(&self, version: &str, extra: &[&str]) -> String {
        let mut args = vec![
            "template",
            "podlock",
            self.chart.to_str().unwrap(),
            "-n",
            "podlock",
        ];
        args.extend([
            "--kube-version",
            version,
            "--show-only",
            "templates/zz-notes.yaml",
        ]);
        args.extend_from_slice(extra);
        let (ok, out, err) = helm(&args);
        assert!(ok, "{err}");
        let doc: serde_yaml::Value = serde_yaml::from_str(&out).unwrap();
        doc["notes"].as_str().expect("the notes").to_string()
    }
}

/// Where `text`, pasted into a shell, opens a heredoc that no line closes: each `<<WORD` (or
/// `<<'WORD'`, `<<"WORD"`) must be followed by a line equal to WORD, at column 0. `<<-`, which
/// takes a tab-indented terminator, counts as unclosed: a terminal's paste keeps no tabs.
fn unclosed_heredocs(text: &str) -> Vec<String> {
    let opener = regex::Regex::new(r#"<<(-?)\s*['"]?([A-Za-z_][A-Za-z0-9_]*)"#).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut unclosed = vec![];
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let opened: Vec<_> = (opener.captures_iter(line))
            .filter(|c| !line[..c.get(0).unwrap().start()].ends_with('<')) // <<<: a here-string
            .map(|c| (c[1].to_string(), c[2].to_string()))
            .collect();
        i += 1;
        for (dash, word) in opened {
            let closed = lines[i..].iter().position(|l| *l == word);
            match closed {
                Some(at) if dash.is_empty() => i += at + 1,
                _ => {
                    unclosed.push(format!("{line:?} opens {word}, which no line {word:?} ends"));
                    i = lines.len();
                }
            }
        }
    }
    unclosed
}

/// The install notes' commands can be pasted as they are: every heredoc they open is closed.
#[test]
fn the_notes_close_every_heredoc_they_open() {
    // The check finds the notes' old fault: a terminator indented with the command.
    let indented = "  kubectl apply -f - <<YAML\n  kind: X\n  YAML\n  kubectl get x\n";
    assert_eq!(unclosed_heredocs(indented).len(), 1);
    assert_eq!(unclosed_heredocs("cat <<-EOF\n\tx\n\tEOF\n").len(), 1);
    assert!(unclosed_heredocs("cat <<'EOF'\nx\nEOF\ncat <<<x\n").is_empty());
    let notes = Notes::new();
    let floor = floor_version();
    let bundled = ["--set", "etcd.bundled.enabled=true"];
    for (version, extra) in [("1.34.0", &[][..]), (floor.as_str(), &bundled[..])] {
        let text = notes.render(version, extra);
        let opened = text.matches("<<").count();
        assert!(opened > 0, "the notes open no heredoc any more? {text}");
        let unclosed = unclosed_heredocs(&text);
        assert!(
            unclosed.is_empty(),
            "{version} {extra:?}: {unclosed:?} in\n{text}"
        );
        eprintln!("the notes for {version} {extra:?}: {opened} heredoc(s), each closed");
    }
}

/// Where the Secret policy cannot be rendered, the install notes say what that costs.
#[test]
fn the_notes_say_when_the_secret_policy_is_left_out() {
    let notes = Notes::new();
    let render = |version: &str, extra: &[&str]| notes.render(version, extra);
    let left_out = "podlock-operator-secrets was left out";
    assert!(
        render("1.29.5", &[]).contains(left_out),
        "{}",
        render("1.29.5", &[])
    );
    assert!(!render("1.30.0", &[]).contains(left_out));
    assert!(!render("1.29.5", &["--set", "operator.secretPolicy=false"]).contains(left_out));
    let no_policy = ["--api-versions", "v1/Pod"]; // a cluster whose discovery lacks the kind
    assert!(render("1.34.0", &no_policy).contains(left_out));
}

/// The rendered documents of `rendered`, as JSON.
fn documents(rendered: &str) -> Vec<serde_json::Value> {
    serde_yaml::Deserializer::from_str(rendered)
        .map(|d| serde_json::Value::deserialize(d).unwrap())
        .filter(serde_json::Value::is_object)
        .collect()
}

/// The document of `kind` named `name`.
fn find<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// The value of the operator's environment variable `name`, if set.
fn operator_env(docs: &[serde_json::Value], name: &str) -> Option<String> {
    let spec = &find(docs, "Deployment", "podlock-operator")["spec"]["template"]["spec"];
    let env = spec["containers"][0]["env"].as_array().unwrap();
    let var = env.iter().find(|e| e["name"] == name)?;
    Some(var["value"].as_str().unwrap().to_string())
}

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
webhook:
  timeoutSeconds: 9
  namespaceSelector:
    matchExpressions: [{key: team, operator: In, values: [a, b]}]
metrics:
  serviceMonitor: {enabled: true, labels: {release: kps}}
  podMonitor: {enabled: true, labels: {release: kps, team: locks}}
prometheusRule: {enabled: true, labels: {release: kps}}
"#;

use serde_json::json;

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
    assert_eq!(
        operator_env(&docs, "PODLOCK_WEBHOOK_TIMEOUT_SECONDS").as_deref(),
        Some("5")
    );
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
    let run = |vars: &[(&str, String)]| {
        let missing = dir.path().join("no-kubeconfig");
        let out = Command::new(crate::common::podlock_bin())
            .args(["operator", "--etcd-endpoints", "http://127.0.0.1:1"])
            .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
            .env("KUBECONFIG", &missing)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
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
