//! Unit tests of injection: which objects are changed and how; the sidecar's own container
//! is tested in `sidecar.rs`.

use super::*;

mod sidecar;

fn tpl() -> SidecarTemplate {
    SidecarTemplate {
        image: "podlock:test".into(),
        instance: "podlock".into(),
        etcd_endpoints: "http://etcd:2379".into(),
        credentials_secret: None,
        etcd_ca: false,
        cluster: String::new(),
        resources: None,
        log_level: None,
        pod: flags::PodSettings::default(),
    }
}

fn deployment(meta_annotations: Value, template_annotations: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "app", "annotations": meta_annotations},
        "spec": {"template": {"metadata": {"annotations": template_annotations, "labels": {"app": "web"}},
                 "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}
    })
}

fn pod(annotations: Value) -> Value {
    json!({"metadata": {"name": "p", "annotations": annotations},
           "spec": {"containers": [{"name": "a", "image": "a", "env": [{"name": "X", "value": "1"}]},
                                   {"name": "istio-proxy", "image": "proxy"}]}})
}

/// `obj` as the webhook leaves it, or `None` when it is left alone.
fn apply(obj: &Value, kind: &str, creating: bool, ns: &str) -> Option<Value> {
    let p = mutate(&tpl(), kind, creating, ns, false, obj).unwrap().patch?;
    let mut out = obj.clone();
    json_patch::patch(&mut out, &p).unwrap();
    Some(out)
}

#[test]
fn an_annotated_pod_gets_one_native_sidecar_when_created() {
    let out = apply(&pod(json!({INJECT: "true"})), "Pod", true, "app").expect("injected");
    let sc = &out["spec"]["initContainers"][0];
    assert_eq!(
        (sc["name"].as_str(), sc["restartPolicy"].as_str()),
        (Some("podlock"), Some("Always"))
    );
    assert_eq!(sc["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        sc["readinessProbe"]["exec"]["command"],
        json!(["/usr/local/bin/podlock", "probe"])
    );
    let env = |i: usize| out["spec"]["containers"][i]["env"].as_array().unwrap().clone();
    assert_eq!(env(0).len(), 3);
    assert!(env(0).contains(&json!({"name": "PODLOCK_ADDR", "value": "http://127.0.0.1:4040"})));
    // Each container is told its own name.
    assert!(env(0).contains(&json!({"name": CONTAINER_ENV, "value": "a"})));
    assert!(env(1).contains(&json!({"name": CONTAINER_ENV, "value": "istio-proxy"})));
    assert_eq!(out["metadata"]["labels"][SIDECAR_LABEL], "true");
    assert_eq!(out["metadata"]["labels"][INSTANCE_LABEL], "podlock");
    // Idempotent: a second pass changes nothing.
    assert!(apply(&out, "Pod", true, "app").is_none());
}

#[test]
fn pods_are_never_changed_on_update() {
    assert!(apply(&pod(json!({INJECT: "true"})), "Pod", false, "app").is_none());
}

#[test]
fn the_sidecar_goes_after_native_sidecars_already_there_and_before_other_init_containers() {
    let mut p = pod(json!({INJECT: "true"}));
    p["spec"]["initContainers"] = json!([
        {"name": "validation", "image": "v"},
        {"name": "mesh", "image": "m", "restartPolicy": "Always"},
        {"name": "migrate", "image": "m"},
    ]);
    let out = apply(&p, "Pod", true, "app").expect("injected");
    let names: Vec<_> = out["spec"]["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["validation", "mesh", "podlock", "migrate"]);
}

#[test]
fn init_containers_get_the_address_and_their_name_but_the_sidecar_does_not() {
    let mut p = pod(json!({INJECT: "true", PORT: "5050"}));
    p["spec"]["initContainers"] = json!([
        {"name": "mesh", "image": "m", "restartPolicy": "Always"},
        {"name": "migrate", "image": "m"},
        // Its own settings win, as in app containers.
        {"name": "custom", "image": "c", "env": [{"name": "PODLOCK_ADDR", "value": "http://elsewhere"},
                                                  {"name": CONTAINER_ENV, "value": "named-by-hand"}]},
    ]);
    let out = apply(&p, "Pod", true, "app").expect("injected");
    let init = out["spec"]["initContainers"].as_array().unwrap();
    let env = |name: &str| -> Vec<(String, String)> {
        let c = init.iter().find(|c| c["name"] == name).unwrap();
        let vars = c["env"].as_array().cloned().unwrap_or_default();
        let var = |v: &Value| {
            (
                v["name"].as_str().unwrap().into(),
                v["value"].as_str().unwrap_or("").into(),
            )
        };
        vars.iter()
            .filter(|v| v["name"].as_str().unwrap().starts_with("PODLOCK_"))
            .map(var)
            .collect()
    };
    let given = |own: &str| {
        vec![
            ("PODLOCK_ADDR".to_string(), "http://127.0.0.1:5050".to_string()),
            (CONTAINER_ENV.to_string(), own.to_string()),
        ]
    };
    assert_eq!(env("migrate"), given("migrate"));
    assert_eq!(env("mesh"), given("mesh"));
    let custom = vec![
        ("PODLOCK_ADDR".to_string(), "http://elsewhere".to_string()),
        (CONTAINER_ENV.to_string(), "named-by-hand".to_string()),
    ];
    assert_eq!(env("custom"), custom);
    let sidecar = env(SIDECAR_CONTAINER);
    assert!(
        !sidecar
            .iter()
            .any(|(name, _)| name == "PODLOCK_ADDR" || name == CONTAINER_ENV),
        "the sidecar got an app's variables: {sidecar:?}"
    );
}

#[test]
fn port_and_heartbeat_annotations() {
    let out = apply(
        &pod(json!({INJECT: "true", PORT: "5050", HEARTBEAT: "20"})),
        "Pod",
        true,
        "app",
    )
    .expect("injected");
    assert_eq!(
        out["spec"]["containers"][0]["env"][1]["value"],
        "http://127.0.0.1:5050"
    );
    let env = out["spec"]["initContainers"][0]["env"].as_array().unwrap();
    assert!(env.contains(&json!({"name": "PODLOCK_LISTEN", "value": "127.0.0.1:5050"})));
    assert!(env.contains(&json!({"name": "PODLOCK_HEALTH_LISTEN", "value": "[::]:5051"})));
    assert!(env.contains(&json!({"name": "PODLOCK_HEARTBEAT_TIMEOUT_SECONDS", "value": "20"})));
    let bad = mutate(
        &tpl(),
        "Pod",
        true,
        "app",
        false,
        &pod(json!({INJECT: "true", PORT: "http"})),
    );
    assert!(bad.unwrap_err().to_string().contains(PORT));
}

#[test]
fn a_host_network_pod_is_told_why_it_gets_no_sidecar() {
    let mut p = pod(json!({INJECT: "true"}));
    p["spec"]["hostNetwork"] = json!(true);
    let m = mutate(&tpl(), "Pod", true, "app", false, &p).unwrap();
    assert!(m.patch.is_none());
    assert!(m.warning.unwrap().contains("hostNetwork"));
}

#[test]
fn a_workload_gets_only_its_annotations_copied_into_its_template() {
    let obj = deployment(json!({INJECT: "true", PORT: "5050"}), json!({}));
    let out = apply(&obj, "Deployment", false, "app").expect("stamped");
    let template = &out["spec"]["template"];
    assert_eq!(
        template["metadata"]["annotations"],
        json!({INJECT: "true", PORT: "5050", STAMP: "podlock.io/inject,podlock.io/port"})
    );
    assert_eq!(template["spec"], obj["spec"]["template"]["spec"], "no container");
    assert_eq!(template["metadata"]["labels"], json!({"app": "web"}));
    assert!(apply(&out, "Deployment", false, "app").is_none(), "idempotent");

    // Removing the workload's annotation removes the copies, not the template's own.
    let mut removed = out.clone();
    removed["metadata"]["annotations"] = json!({});
    removed["spec"]["template"]["metadata"]["annotations"]["team"] = json!("a");
    let out = apply(&removed, "Deployment", false, "app").expect("unstamped");
    assert_eq!(
        out["spec"]["template"]["metadata"]["annotations"],
        json!({"team": "a"})
    );
}

#[test]
fn a_template_annotation_of_its_own_is_kept() {
    let obj = deployment(json!({INJECT: "true", PORT: "5050"}), json!({PORT: "6060"}));
    let out = apply(&obj, "Deployment", true, "app").expect("stamped");
    assert_eq!(
        out["spec"]["template"]["metadata"]["annotations"],
        json!({INJECT: "true", PORT: "6060", STAMP: "podlock.io/inject"})
    );
    let own = deployment(json!({}), json!({INJECT: "true"}));
    assert!(apply(&own, "Deployment", false, "app").is_none());
}

#[test]
fn a_job_is_stamped_when_created_only() {
    let job = deployment(json!({INJECT: "true"}), json!({}));
    assert!(apply(&job, "Job", true, "app").is_some());
    assert!(
        apply(&job, "Job", false, "app").is_none(),
        "its template is immutable"
    );
}

#[test]
fn leaves_alone_what_it_must() {
    let annotated = deployment(json!({INJECT: "true"}), json!({}));
    assert!(apply(&deployment(json!({}), json!({})), "Deployment", true, "app").is_none());
    assert!(
        apply(
            &deployment(json!({INJECT: "false"}), json!({})),
            "Deployment",
            true,
            "app"
        )
        .is_none()
    );
    assert!(apply(&annotated, "Deployment", true, "kube-system").is_none());
    assert!(apply(&annotated, "Service", true, "app").is_none());
    let mut op = annotated.clone();
    op["spec"]["template"]["metadata"]["labels"][OPERATOR_LABEL.0] = json!(OPERATOR_LABEL.1);
    assert!(apply(&op, "Deployment", true, "app").is_none());
    let mut by_hand = pod(json!({INJECT: "true"}));
    by_hand["spec"]["containers"][1]["name"] = json!(SIDECAR_CONTAINER);
    assert!(apply(&by_hand, "Pod", true, "app").is_none());
}

/// `missed` is the webhook's own rule turned round: each pod it would inject and that has no
/// sidecar was missed, and no pod it leaves alone on purpose.
#[test]
fn a_pod_missed_is_one_the_webhook_would_have_injected() {
    let annotated = pod(json!({INJECT: "true"}));
    assert!(missed("app", &annotated), "asked, and no sidecar");
    assert!(!missed("app", &injected_pod(&tpl())), "injected");
    assert!(!missed("app", &pod(json!({}))), "did not ask");
    assert!(!missed("app", &pod(json!({INJECT: "false"}))), "asked not to");
    assert!(!missed("kube-system", &annotated));
    let mut by_hand = annotated.clone();
    by_hand["spec"]["containers"][1]["name"] = json!(SIDECAR_CONTAINER);
    assert!(!missed("app", &by_hand), "a sidecar written by hand");
    let mut host = annotated.clone();
    host["spec"]["hostNetwork"] = json!(true);
    assert!(!missed("app", &host), "hostNetwork pods get none");
    let mut op = annotated;
    op["metadata"]["labels"] = json!({OPERATOR_LABEL.0: OPERATOR_LABEL.1});
    assert!(!missed("app", &op), "the operator's own");
}

/// The sidecar `tpl` injects into an annotated pod.
fn injected_sidecar(tpl: &SidecarTemplate) -> Value {
    injected_pod(tpl)["spec"]["initContainers"][0].clone()
}

/// An annotated pod as `tpl` injects it.
fn injected_pod(tpl: &SidecarTemplate) -> Value {
    let annotated = || pod(json!({INJECT: "true"}));
    let p = mutate(tpl, "Pod", true, "app", false, &annotated())
        .unwrap()
        .patch
        .unwrap();
    let mut out = annotated();
    json_patch::patch(&mut out, &p).unwrap();
    out
}
