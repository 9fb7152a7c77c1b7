//! The knobs platform teams expect (issue #55, item 6), each landing in the objects it is for:
//! pod labels and annotations, security contexts that OpenShift can take (no fixed UID),
//! topology spread, extra operator flags, the sidecar's image, `global` of a parent chart and
//! the `helm test` pod's scheduling.

use serde_json::{Value, json};

use super::values::run_operator;
use super::{documents, find, operator_env, render};

/// The pod template of the operator's Deployment and of the bundled etcd's StatefulSet, and the
/// `helm test` pod, rendered with `extra`.
fn pods(extra: &[&str]) -> (Value, Value, Value) {
    let bundled = ["--set", "etcd.bundled.enabled=true"];
    let docs = documents(&render(&[&bundled[..], extra].concat()));
    let template = |kind, name| find(&docs, kind, name)["spec"]["template"].clone();
    (
        template("Deployment", "podlock-operator"),
        template("StatefulSet", "podlock-etcd"),
        find(&docs, "Pod", "podlock-test-operator-ready").clone(),
    )
}

/// Knobs for a platform: every one set, as a values file.
const PLATFORM_VALUES: &str = r#"
podLabels: {team: locks}
podAnnotations: {sidecar.istio.io/inject: "false"}
podSecurityContext: {runAsUser: null, runAsGroup: null}
containerSecurityContext: {privileged: false}
global: {imageRegistry: registry.example}
operator:
  topologySpreadConstraints:
    - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}
  extraArgs: [--shutdown-drain-seconds=10]
etcd:
  bundled:
    topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule}
sidecar:
  image: registry.example/podlock:0.1.0
  port: 4050
  imagePullSecrets: [{name: regcred}, {name: mirror}]
  securityContext: {runAsUser: null, runAsGroup: null}
test:
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{key: dedicated, operator: Exists}]
  affinity: {nodeAffinity: {}}
"#;

#[test]
fn platform_knobs_land_in_their_objects() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, PLATFORM_VALUES).unwrap();
    let (operator, etcd, test) = pods(&["-f", file.to_str().unwrap()]);
    for pod in [&operator, &etcd] {
        let meta = &pod["metadata"];
        assert_eq!(meta["labels"]["team"], "locks", "{meta}");
        assert_eq!(meta["labels"]["app.kubernetes.io/instance"], "podlock");
        assert_eq!(meta["annotations"]["sidecar.istio.io/inject"], "false");
        // OpenShift assigns the UID and the volume's group: none is fixed.
        let context = &pod["spec"]["securityContext"];
        assert_eq!(
            context,
            &json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}})
        );
        let container = &pod["spec"]["containers"][0]["securityContext"];
        assert_eq!(container["privileged"], false);
        assert_eq!(container["readOnlyRootFilesystem"], true, "the default is kept");
        let spread = &pod["spec"]["topologySpreadConstraints"][0];
        assert_eq!(spread["topologyKey"], "topology.kubernetes.io/zone");
    }
    assert_eq!(
        operator["spec"]["containers"][0]["args"],
        json!(["operator", "--shutdown-drain-seconds=10"])
    );
    let test = &test["spec"];
    assert_eq!(test["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(test["tolerations"][0]["key"], "dedicated");
    assert!(test["affinity"]["nodeAffinity"].is_object());
    assert!(test["securityContext"]["runAsUser"].is_null());

    // What reaches injected pods goes to the operator's --sidecar-* flags.
    let docs = documents(&render(&["-f", file.to_str().unwrap()]));
    let env = |name| operator_env(&docs, name);
    assert_eq!(
        env("PODLOCK_SIDECAR_IMAGE").as_deref(),
        Some("registry.example/podlock:0.1.0")
    );
    assert_eq!(env("PODLOCK_SIDECAR_PORT").as_deref(), Some("4050"));
    assert_eq!(
        env("PODLOCK_SIDECAR_IMAGE_PULL_SECRETS").as_deref(),
        Some("regcred,mirror")
    );
    let context: Value = serde_json::from_str(&env("PODLOCK_SIDECAR_SECURITY_CONTEXT").unwrap()).unwrap();
    assert!(
        context["runAsUser"].is_null() && context["runAsGroup"].is_null(),
        "{context}"
    );
    assert_eq!(context["readOnlyRootFilesystem"], true);
}

/// Without the knobs, the pods render as before them: the fixed UID (and the bundled etcd's
/// volume group), no spread, no extra flag, the sidecar on the operator's image.
#[test]
fn the_knobs_defaults_keep_what_the_chart_rendered() {
    let (operator, etcd, test) = pods(&[]);
    let fixed = json!({"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"}});
    assert_eq!(operator["spec"]["securityContext"], fixed);
    assert_eq!(test["spec"]["securityContext"], fixed);
    assert_eq!(etcd["spec"]["securityContext"]["fsGroup"], 65532);
    for pod in [&operator["spec"], &etcd["spec"], &test["spec"]] {
        assert_eq!(
            pod["containers"][0]["securityContext"],
            json!({"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]}})
        );
        assert!(pod["topologySpreadConstraints"].is_null());
    }
    assert!(operator["metadata"]["annotations"].is_null());
    assert!(test["spec"]["nodeSelector"].is_null());
    assert_eq!(operator["spec"]["containers"][0]["args"], json!(["operator"]));
    let docs = documents(&render(&[]));
    let env = |name| operator_env(&docs, name);
    assert_eq!(
        env("PODLOCK_SIDECAR_IMAGE").as_deref(),
        Some("ghcr.io/podlock/podlock:0.1.0")
    );
    assert_eq!(env("PODLOCK_SIDECAR_PORT").as_deref(), Some("4040"));
    assert!(env("PODLOCK_SIDECAR_IMAGE_PULL_SECRETS").is_none());
    // The restricted profile, as the operator's own default (src/operator/inject/container.rs).
    let context: Value = serde_json::from_str(&env("PODLOCK_SIDECAR_SECURITY_CONTEXT").unwrap()).unwrap();
    assert_eq!(
        context,
        json!({"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
            "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}})
    );
}

/// `operator.extraArgs` reach `podlock operator`, which takes them, or stops naming the flag.
#[test]
fn the_operator_takes_its_extra_args() {
    let args = |extra: &str| {
        let docs = documents(&render(&["--set", &format!("operator.extraArgs[0]={extra}")]));
        let container =
            &find(&docs, "Deployment", "podlock-operator")["spec"]["template"]["spec"]["containers"][0];
        let args = container["args"].as_array().unwrap().iter();
        args.map(|a| a.as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    let taken = args("--shutdown-drain-seconds=10");
    let taken: Vec<&str> = taken.iter().map(String::as_str).collect();
    let err = run_operator(&taken, &[]);
    assert!(
        err.contains("cannot reach the Kubernetes API"),
        "{taken:?}: {err}"
    );
    let refused = args("--shutdown-drain-secs=10");
    let refused: Vec<&str> = refused.iter().map(String::as_str).collect();
    let err = run_operator(&refused, &[]);
    assert!(
        err.contains("--shutdown-drain-secs") && !err.contains("cannot reach"),
        "{err}"
    );
}
