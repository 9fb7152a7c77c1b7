//! The chart's bundled etcd is secure by default: TLS for clients and peers with certificates
//! generated at install and kept across upgrades, a root password the operator uses to turn
//! auth on, and a NetworkPolicy whose selectors admit the operator, injected pods and the
//! members, and nobody else (its enforcement needs a CNI: `tests/node` runs the rest).

use k8s_openapi::api::core::v1::Secret;
use serde_json::{Value, json};
use std::collections::BTreeSet;

use super::{CHART, KUBE_VERSION, documents, find, helm, operator_env, render};
use crate::common::kube::{ControlPlane, with_crd};
use podlock::operator::inject::{INSTANCE_LABEL, SIDECAR_LABEL};

/// The data of Secret `name`, decoded.
fn secret_data(docs: &[Value], name: &str) -> std::collections::BTreeMap<String, String> {
    let secret: Secret = serde_json::from_value(find(docs, "Secret", name).clone()).unwrap();
    let data = secret.data.unwrap_or_default().into_iter();
    data.map(|(k, v)| (k, String::from_utf8(v.0).unwrap())).collect()
}

#[test]
fn the_bundled_etcd_serves_tls_and_the_operator_turns_auth_on() {
    let docs = documents(&render(&["--set", "etcd.bundled.enabled=true"]));
    let etcd = &find(&docs, "StatefulSet", "podlock-etcd")["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = etcd["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for arg in [
        "--listen-client-urls=https://0.0.0.0:2379",
        "--listen-peer-urls=https://0.0.0.0:2380",
        "--cert-file=/etc/etcd/tls/tls.crt",
        "--peer-client-cert-auth=true",
    ] {
        assert!(args.contains(&arg), "{arg} missing: {args:?}");
    }
    assert!(
        !args.iter().any(|a| a.contains("http://")),
        "plain HTTP: {args:?}"
    );
    let endpoints = operator_env(&docs, "PODLOCK_ETCD_ENDPOINTS").unwrap();
    assert!(
        endpoints.split(',').all(|e| e.starts_with("https://")),
        "{endpoints}"
    );
    assert_eq!(
        operator_env(&docs, "PODLOCK_ETCD_ENABLE_AUTH").as_deref(),
        Some("true")
    );
    // The root credentials reach the operator as files of the mounted Secret, never as
    // environment variables.
    let credentials = operator_env(&docs, "PODLOCK_ETCD_CREDENTIALS_DIR");
    assert_eq!(credentials.as_deref(), Some("/etc/podlock/etcd-auth"));
    let pod = &find(&docs, "Deployment", "podlock-operator")["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "etcd-auth");
    assert_eq!(
        volume.unwrap()["secret"],
        json!({"secretName": "podlock-etcd-root",
               "items": [{"key": "username", "path": "username"}, {"key": "password", "path": "password"}]})
    );
    let env = pod["containers"][0]["env"].as_array().unwrap();
    assert!(
        !env.iter().any(|e| e["valueFrom"]["secretKeyRef"].is_object()),
        "a Secret in the operator's environment: {env:?}"
    );
    assert_eq!(
        operator_env(&docs, "PODLOCK_ETCD_CA_FILE").as_deref(),
        Some("/etc/podlock/etcd/ca.crt")
    );

    let root = secret_data(&docs, "podlock-etcd-root");
    assert_eq!(root["username"], "root");
    assert!(root["password"].len() >= 32, "a short root password");
    let again = documents(&render(&["--set", "etcd.bundled.enabled=true"]));
    assert_ne!(
        secret_data(&again, "podlock-etcd-root")["password"],
        root["password"]
    );
    let tls = secret_data(&docs, "podlock-etcd-tls");
    let names = certificate_names(&tls["tls.crt"]);
    for name in [
        "*.podlock-etcd.podlock.svc",
        "*.podlock-etcd.podlock.svc.cluster.local",
    ] {
        assert!(names.contains(name), "{name} not in the certificate: {names:?}");
    }
    assert!(tls["ca.crt"].starts_with("-----BEGIN CERTIFICATE"));
}

/// The DNS names of a PEM certificate.
fn certificate_names(pem: &str) -> BTreeSet<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let cert = pem.parse_x509().unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap();
    let dns = san.value.general_names.iter().filter_map(|n| match n {
        x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
        _ => None,
    });
    dns.collect()
}

/// `helm template --dry-run=server` in `ns`: lookups see the cluster, as in `helm upgrade`.
fn render_against(plane: &ControlPlane, ns: &str) -> Vec<Value> {
    let kubeconfig = plane.kubeconfig.to_str().unwrap();
    let (ok, out, err) = helm(&[
        "template",
        "podlock",
        CHART,
        "--namespace",
        ns,
        "--kube-version",
        KUBE_VERSION,
        "--kubeconfig",
        kubeconfig,
        "--dry-run=server",
        "--set",
        "etcd.bundled.enabled=true",
        "--show-only",
        "templates/etcd-security.yaml",
    ]);
    assert!(ok, "helm template --dry-run=server: {err}");
    documents(&out)
}

#[tokio::test]
async fn the_bundled_etcds_certificates_and_root_password_survive_an_upgrade() {
    let plane = with_crd();
    let ns = plane.namespace("etcd-keep");
    let installed = render_against(plane, &ns);
    let secrets: Vec<&Value> = installed.iter().filter(|d| d["kind"] == "Secret").collect();
    assert_eq!(secrets.len(), 2, "{installed:?}");
    for secret in secrets {
        let (ok, _, err) = plane.kubectl_stdin(&["apply", "-f", "-"], &secret.to_string());
        assert!(ok, "{err}");
    }
    let upgraded = render_against(plane, &ns);
    for name in ["podlock-etcd-tls", "podlock-etcd-root"] {
        assert_eq!(
            secret_data(&upgraded, name),
            secret_data(&installed, name),
            "{name} was generated again by an upgrade"
        );
    }
}

/// Creates pod `name` in `ns` with `labels` (it never runs: there is no kubelet).
fn pod(plane: &ControlPlane, ns: &str, name: &str, labels: &Value) {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "none"}]}});
    let (ok, _, err) = plane.kubectl_stdin(&["apply", "-f", "-"], &pod.to_string());
    assert!(ok, "pod {ns}/{name}: {err}");
}

/// `k=v,...` of a `matchLabels` (`None`: the selector selects nothing).
fn selector(match_labels: &Value) -> String {
    let labels = match_labels.as_object().into_iter().flatten();
    labels
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
        .collect::<Vec<_>>()
        .join(",")
}

/// The names (`ns/name`) of what `kubectl get KIND -l SELECTOR` lists in `scope`.
fn listed(plane: &ControlPlane, kind: &str, scope: &[&str], match_labels: &Value) -> BTreeSet<String> {
    let mut args = vec!["get", kind, "-l"];
    let selector = selector(match_labels);
    args.push(&selector);
    args.extend_from_slice(scope);
    args.extend([
        "-o",
        "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{\"\\n\"}{end}",
    ]);
    let (ok, out, err) = plane.kubectl(&args);
    assert!(ok, "{args:?}: {err}");
    out.lines()
        .map(|l| l.trim_start_matches('/').to_string())
        .collect()
}

/// The pods one ingress rule's `from` admits, as the API server evaluates its selectors.
fn admitted(plane: &ControlPlane, policy_ns: &str, rule: &Value) -> BTreeSet<String> {
    let mut pods = BTreeSet::new();
    for peer in rule["from"].as_array().unwrap() {
        let namespaces: Vec<String> = match peer.get("namespaceSelector") {
            None => vec![policy_ns.to_string()],
            Some(sel) => listed(plane, "namespaces", &[], &sel["matchLabels"])
                .into_iter()
                .collect(),
        };
        for ns in namespaces {
            pods.extend(listed(
                plane,
                "pods",
                &["-n", &ns],
                &peer["podSelector"]["matchLabels"],
            ));
        }
    }
    pods
}

#[tokio::test]
async fn the_network_policy_admits_only_the_operator_this_releases_injected_pods_and_members() {
    let plane = with_crd();
    let (release, app) = (plane.namespace("np-release"), plane.namespace("np-app"));
    let (ok, out, err) = helm(&[
        "template",
        "podlock",
        CHART,
        "--namespace",
        &release,
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "etcd.bundled.enabled=true",
    ]);
    assert!(ok, "{err}");
    let docs = documents(&out);
    let template_labels =
        |kind, name| find(&docs, kind, name)["spec"]["template"]["metadata"]["labels"].clone();
    pod(
        plane,
        &release,
        "operator",
        &template_labels("Deployment", "podlock-operator"),
    );
    pod(
        plane,
        &release,
        "etcd",
        &template_labels("StatefulSet", "podlock-etcd"),
    );
    pod(plane, &release, "other", &json!({"app": "other"}));
    pod(
        plane,
        &app,
        "injected",
        &json!({SIDECAR_LABEL: "true", INSTANCE_LABEL: "podlock", "app": "web"}),
    );
    // Injected by another release's webhook: labelled with that release.
    pod(
        plane,
        &app,
        "other-release",
        &json!({SIDECAR_LABEL: "true", INSTANCE_LABEL: "other", "app": "web"}),
    );
    pod(plane, &app, "plain", &json!({"app": "web"}));
    pod(
        plane,
        &app,
        "operator-lookalike",
        &template_labels("Deployment", "podlock-operator"),
    );
    let policy = find(&docs, "NetworkPolicy", "podlock-etcd");
    let (ok, _, err) = plane.kubectl_stdin(&["apply", "-f", "-"], &policy.to_string());
    assert!(ok, "the API server refused the NetworkPolicy: {err}");
    let (ok, stored, err) = plane.kubectl(&[
        "get",
        "networkpolicy",
        "podlock-etcd",
        "-n",
        &release,
        "-o",
        "json",
    ]);
    assert!(ok, "{err}");
    let spec = serde_json::from_str::<Value>(&stored).unwrap()["spec"].clone();
    assert_eq!(spec["policyTypes"], json!(["Ingress"]));
    let ours = |pods: BTreeSet<String>| -> BTreeSet<String> {
        let ours = |p: &String| p.starts_with(&format!("{release}/")) || p.starts_with(&format!("{app}/"));
        pods.into_iter().filter(ours).collect()
    };
    assert_eq!(
        ours(listed(
            plane,
            "pods",
            &["-n", &release],
            &spec["podSelector"]["matchLabels"]
        )),
        BTreeSet::from([format!("{release}/etcd")]),
        "the policy's pods"
    );
    let mut by_port = std::collections::BTreeMap::new();
    for rule in spec["ingress"].as_array().unwrap() {
        let port = rule["ports"][0]["port"].as_i64().unwrap();
        by_port.insert(port, ours(admitted(plane, &release, rule)));
    }
    eprintln!("etcd's NetworkPolicy admits, by port: {by_port:?}");
    let client = BTreeSet::from([format!("{release}/operator"), format!("{app}/injected")]);
    assert_eq!(by_port[&2379], client, "client port");
    assert_eq!(
        by_port[&2380],
        BTreeSet::from([format!("{release}/etcd")]),
        "peer port"
    );
    assert_eq!(by_port.len(), 2, "{by_port:?}");
}

/// Issue #55, item 5: GitOps tools render without `lookup`. With the bundled etcd's Secrets
/// named (made once, outside the release), two renders are the same, the chart makes no Secret
/// of its own, and the operator and the members mount the named ones; without, each render
/// makes a new root password.
#[test]
fn existing_secrets_make_the_bundled_etcd_render_the_same_every_time() {
    let named = [
        "--set",
        "etcd.bundled.enabled=true",
        "--set",
        "etcd.bundled.tlsSecret=etcd-tls-kept",
        "--set",
        "etcd.bundled.authSecret=etcd-root-kept",
    ];
    let first = render(&named);
    assert_eq!(first, render(&named), "two renders differ");
    let docs = documents(&first);
    let secrets: Vec<_> = docs.iter().filter(|d| d["kind"] == "Secret").collect();
    assert!(secrets.is_empty(), "the chart made {secrets:?}");
    let operator = &find(&docs, "Deployment", "podlock-operator")["spec"]["template"]["spec"];
    let volume = |pod: &Value, name: &str| {
        let volumes = pod["volumes"].as_array().unwrap();
        let found = volumes.iter().find(|v| v["name"] == name);
        found.unwrap()["secret"]["secretName"].clone()
    };
    assert_eq!(volume(operator, "etcd-auth"), "etcd-root-kept");
    assert_eq!(volume(operator, "etcd-tls"), "etcd-tls-kept");
    let members = &find(&docs, "StatefulSet", "podlock-etcd")["spec"]["template"]["spec"];
    assert_eq!(volume(members, "tls"), "etcd-tls-kept");
    let bundled = ["--set", "etcd.bundled.enabled=true"];
    assert_ne!(
        render(&bundled),
        render(&bundled),
        "generated Secrets change at each render"
    );
}

/// Issue #55, item 1: the bundled etcd keeps lease checkpoints (on, and persisted) through an
/// environment variable that etcd 3.6 reads as `--feature-gates` and the 3.5 images of an
/// upgrade from the chart's previous etcd only log; no flag that either refuses to start on
/// (`--feature-gates` in 3.5, `--experimental-enable-lease-checkpoint*` from 3.7).
#[test]
fn the_bundled_etcd_checkpoints_leases_through_a_variable_every_etcd_starts_with() {
    let docs = documents(&render(&["--set", "etcd.bundled.enabled=true"]));
    let etcd = &find(&docs, "StatefulSet", "podlock-etcd")["spec"]["template"]["spec"]["containers"][0];
    let env = etcd["env"].as_array().unwrap();
    let gates = env.iter().find(|e| e["name"] == "ETCD_FEATURE_GATES");
    let gates = gates.expect("no ETCD_FEATURE_GATES")["value"].as_str().unwrap();
    let gates: BTreeSet<&str> = gates.split(',').collect();
    assert_eq!(
        gates,
        BTreeSet::from(["LeaseCheckpoint=true", "LeaseCheckpointPersist=true"])
    );
    let args = etcd["args"].as_array().unwrap();
    let refused = ["--feature-gates", "--experimental-enable-lease-checkpoint"];
    assert!(
        !args
            .iter()
            .any(|a| refused.iter().any(|r| a.as_str().unwrap().starts_with(r))),
        "a flag some etcd of the upgrade refuses: {args:?}"
    );
}
