//! Unit tests of the injected sidecar container: its etcd credentials and CA, cluster name,
//! namespace-wide injection, resources and log level, port, pull secrets and securityContext.

use super::*;

#[test]
fn with_etcd_tls_the_sidecar_gets_the_ca_from_its_namespaces_secret() {
    let tpl = SidecarTemplate {
        credentials_secret: Some("podlock-etcd".into()),
        etcd_ca: true,
        ..tpl()
    };
    let out = injected_pod(&tpl);
    assert_eq!(out["spec"]["volumes"][0]["secret"]["secretName"], "podlock-etcd");
    assert_eq!(out["spec"]["volumes"][0]["secret"]["optional"], true);
    let sc = &out["spec"]["initContainers"][0];
    assert_eq!(sc["volumeMounts"][0]["mountPath"], "/etc/podlock/etcd");
    let env = sc["env"].as_array().unwrap();
    assert!(env.contains(&json!({"name": "PODLOCK_ETCD_CA_FILE", "value": "/etc/podlock/etcd/ca.crt"})));
}

/// The sidecar reads its etcd user and password as files of the namespace's Secret, which the
/// kubelet refreshes in place: an environment variable would keep a pod on the password it
/// started with, locked out after a reinstall on a new etcd until it is restarted (#41).
#[test]
fn the_sidecar_reads_its_etcd_credentials_from_the_mounted_secret_not_its_environment() {
    for etcd_ca in [false, true] {
        let tpl = SidecarTemplate {
            credentials_secret: Some("podlock-etcd".into()),
            etcd_ca,
            ..tpl()
        };
        let out = injected_pod(&tpl);
        let sc = &out["spec"]["initContainers"][0];
        let env = sc["env"].as_array().unwrap();
        let names: Vec<&str> = env.iter().filter_map(|e| e["name"].as_str()).collect();
        assert!(
            !names.contains(&"PODLOCK_ETCD_PASSWORD") && !names.contains(&"PODLOCK_ETCD_USER"),
            "credentials in the environment (etcd TLS {etcd_ca}): {names:?}"
        );
        let dir = json!({"name": "PODLOCK_ETCD_CREDENTIALS_DIR", "value": "/etc/podlock/etcd"});
        assert!(env.contains(&dir), "etcd TLS {etcd_ca}: {names:?}");
        let volume = &out["spec"]["volumes"][0];
        assert_eq!(volume["secret"]["secretName"], "podlock-etcd");
        // Optional: a pod created before its namespace has a Secret still starts.
        assert_eq!(volume["secret"]["optional"], true);
        let keys: Vec<&str> = volume["secret"]["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| i["key"].as_str())
            .collect();
        let expected = if etcd_ca {
            vec!["username", "password", "ca.crt"]
        } else {
            vec!["username", "password"]
        };
        assert_eq!(keys, expected);
        let mount = &sc["volumeMounts"][0];
        assert_eq!(
            (&mount["name"], &mount["mountPath"]),
            (&volume["name"], &json!("/etc/podlock/etcd"))
        );
        assert_eq!(mount["readOnly"], true);
    }
    let without = injected_pod(&tpl());
    assert!(
        without["spec"]["volumes"].is_null(),
        "a volume without a Secret: {without}"
    );
}

#[test]
fn a_named_cluster_is_passed_to_the_sidecar_and_no_name_passes_nothing() {
    let env_of = |tpl: &SidecarTemplate| injected_sidecar(tpl)["env"].as_array().unwrap().clone();
    let named = SidecarTemplate {
        cluster: "east".into(),
        ..tpl()
    };
    assert!(env_of(&named).contains(&json!({"name": "PODLOCK_CLUSTER", "value": "east"})));
    assert!(!env_of(&tpl()).iter().any(|e| e["name"] == "PODLOCK_CLUSTER"));
}

#[test]
fn in_a_namespace_that_injects_every_new_pod_gets_the_sidecar_unless_it_opts_out() {
    let injected = |annotations: Value, namespace_injects: bool| {
        let m = mutate(&tpl(), "Pod", true, "app", namespace_injects, &pod(annotations)).unwrap();
        m.patch.is_some()
    };
    assert!(injected(json!({}), true), "an unannotated pod of the namespace");
    assert!(
        !injected(json!({INJECT: "false"}), true),
        "the pod's opt-out wins"
    );
    assert!(injected(json!({INJECT: "true"}), true));
    // Elsewhere the annotation alone decides, as before.
    assert!(!injected(json!({}), false));
    assert!(injected(json!({INJECT: "true"}), false));
    // Never on update, never in kube-system, never twice.
    assert!(
        mutate(&tpl(), "Pod", false, "app", true, &pod(json!({})))
            .unwrap()
            .patch
            .is_none()
    );
    assert!(
        mutate(&tpl(), "Pod", true, "kube-system", true, &pod(json!({})))
            .unwrap()
            .patch
            .is_none()
    );
    let p = mutate(&tpl(), "Pod", true, "app", true, &pod(json!({})))
        .unwrap()
        .patch
        .unwrap();
    let mut out = pod(json!({}));
    json_patch::patch(&mut out, &p).unwrap();
    assert!(
        mutate(&tpl(), "Pod", true, "app", true, &out)
            .unwrap()
            .patch
            .is_none()
    );
    // A workload of the namespace is not stamped: its pods are injected as they come.
    let plain = deployment(json!({}), json!({}));
    assert!(
        mutate(&tpl(), "Deployment", true, "app", true, &plain)
            .unwrap()
            .patch
            .is_none()
    );
}

#[test]
fn the_sidecars_resources_and_log_level_are_the_operators_to_set() {
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let sidecar_of = injected_sidecar;
    let default = sidecar_of(&tpl());
    assert_eq!(
        default["resources"],
        json!({"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}})
    );
    assert!(
        !default["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "PODLOCK_LOG")
    );
    let resources = ResourceRequirements {
        requests: Some([("memory".to_string(), Quantity("32Mi".into()))].into()),
        ..Default::default()
    };
    let set = SidecarTemplate {
        resources: Some(resources),
        log_level: Some("debug".into()),
        ..tpl()
    };
    let sc = sidecar_of(&set);
    assert_eq!(sc["resources"], json!({"requests": {"memory": "32Mi"}}));
    assert!(
        sc["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "PODLOCK_LOG", "value": "debug"}))
    );
}

#[test]
fn the_port_pull_secrets_and_security_context_flags_reach_injected_pods() {
    let openshift = k8s_openapi::api::core::v1::SecurityContext {
        run_as_non_root: Some(true),
        ..Default::default()
    };
    let set = SidecarTemplate {
        pod: flags::PodSettings {
            port: 4050,
            image_pull_secrets: vec!["regcred".into(), "mirror".into()],
            security_context: Some(openshift),
        },
        ..tpl()
    };
    let mut own = pod(json!({INJECT: "true"}));
    own["spec"]["imagePullSecrets"] = json!([{"name": "mirror"}]);
    let p = mutate(&set, "Pod", true, "app", false, &own)
        .unwrap()
        .patch
        .unwrap();
    let mut out = own.clone();
    json_patch::patch(&mut out, &p).unwrap();
    assert_eq!(
        out["spec"]["imagePullSecrets"],
        json!([{"name": "mirror"}, {"name": "regcred"}])
    );
    let sc = &out["spec"]["initContainers"][0];
    assert_eq!(sc["securityContext"], json!({"runAsNonRoot": true}));
    let env = sc["env"].as_array().unwrap();
    assert!(env.contains(&json!({"name": "PODLOCK_LISTEN", "value": "127.0.0.1:4050"})));
    let app = out["spec"]["containers"][0]["env"].as_array().unwrap();
    assert!(app.contains(&json!({"name": "PODLOCK_ADDR", "value": "http://127.0.0.1:4050"})));
    // Without the flags: no pull secret added, the restricted profile.
    let annotated = injected_pod(&tpl());
    assert!(annotated["spec"]["imagePullSecrets"].is_null());
    assert_eq!(
        annotated["spec"]["initContainers"][0]["securityContext"]["runAsUser"],
        65532
    );
}
