//! Sidecar injection as a pure function: given an admitted object, the JSON patch that adds the
//! podlock sidecar to its pod template, or `None` when it must be left alone.
//!
//! `podlock.io/inject: "true"` on a Pod, or on a Deployment, StatefulSet, DaemonSet or Job
//! (its metadata or its pod template), adds a native sidecar (an init container with
//! `restartPolicy: Always`) named `podlock`, labels the pod `podlock.io/sidecar=true` (so the
//! operator's pod watch sees it) and gives every app container `PODLOCK_ADDR`. Injection is
//! idempotent; objects without the annotation, in `kube-system`, or of the operator itself are
//! never changed.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector, Probe,
    ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The annotation that asks for injection.
pub const INJECT: &str = "podlock.io/inject";
/// The annotation that sets the sidecar's API port (default 4040).
pub const PORT: &str = "podlock.io/port";
/// The annotation that sets a default heartbeat window for the pod's holds.
pub const HEARTBEAT: &str = "podlock.io/heartbeat-timeout";
/// The variable that tells each app container its own name, to pass as `container`.
pub const CONTAINER_ENV: &str = "PODLOCK_CONTAINER";
/// The label that marks the operator's own pods, which are never injected.
pub const OPERATOR_LABEL: (&str, &str) = ("app.kubernetes.io/component", "podlock-operator");
/// The label that marks pods with a podlock sidecar (the operator's pod watch selects on it).
pub const SIDECAR_LABEL: &str = "podlock.io/sidecar";
/// The sidecar container's name.
pub const SIDECAR_CONTAINER: &str = "podlock";

/// What the injected sidecar looks like.
#[derive(Debug, Clone)]
pub struct SidecarTemplate {
    /// The podlock image.
    pub image: String,
    /// etcd endpoints for the sidecar, comma-separated.
    pub etcd_endpoints: String,
    /// A Secret with the namespace's etcd credentials (`username`, `password`), if any.
    pub credentials_secret: Option<String>,
}

/// Where an object of a kind keeps its pod's metadata and spec (JSON pointers).
struct PodPaths {
    meta: &'static str,
    spec: &'static str,
}

/// What a pod's annotations ask of its sidecar.
struct Options {
    port: u16,
    heartbeat: Option<u32>,
}

/// The patch that injects the sidecar into `object` (of `kind`, in `namespace`), if any.
pub fn patch(
    tpl: &SidecarTemplate,
    kind: &str,
    namespace: &str,
    object: &Value,
) -> Result<Option<json_patch::Patch>, String> {
    let Some(paths) = pod_paths(kind) else {
        return Ok(None);
    };
    if !wants_sidecar(object, &paths, namespace) {
        return Ok(None);
    }
    let options = options(object, &paths)?;
    let mut mutated = object.clone();
    let labels = ensure_object(&mut mutated, &format!("{}/labels", paths.meta));
    labels.insert(SIDECAR_LABEL.into(), json!("true"));
    let pod_spec = ensure_object(&mut mutated, paths.spec);
    give_app_containers_their_env(pod_spec, options.port);
    let sidecar = serde_json::to_value(sidecar(tpl, &options)).expect("a container serializes");
    let init = pod_spec.entry("initContainers").or_insert(json!([]));
    if let Some(init) = init.as_array_mut() {
        init.insert(0, sidecar);
    }
    Ok(Some(json_patch::diff(object, &mutated)))
}

fn pod_paths(kind: &str) -> Option<PodPaths> {
    match kind {
        "Pod" => Some(PodPaths {
            meta: "/metadata",
            spec: "/spec",
        }),
        "Deployment" | "StatefulSet" | "DaemonSet" | "Job" => Some(PodPaths {
            meta: "/spec/template/metadata",
            spec: "/spec/template/spec",
        }),
        _ => None,
    }
}

/// Whether `object` asks for the sidecar and may get it: annotated, not in `kube-system`, not
/// the operator itself, and not injected already.
fn wants_sidecar(object: &Value, paths: &PodPaths, namespace: &str) -> bool {
    let annotated = |path: &str| {
        object.pointer(&format!("{path}/annotations/{}", escape(INJECT))) == Some(&json!("true"))
    };
    let labelled_operator = |path: &str| {
        object.pointer(&format!("{path}/labels/{}", escape(OPERATOR_LABEL.0)))
            == Some(&json!(OPERATOR_LABEL.1))
    };
    let has_sidecar = object
        .pointer(&format!("{}/initContainers", paths.spec))
        .and_then(Value::as_array)
        .is_some_and(|c| c.iter().any(|c| c["name"] == SIDECAR_CONTAINER));
    namespace != "kube-system"
        && (annotated("/metadata") || annotated(paths.meta))
        && !(labelled_operator("/metadata") || labelled_operator(paths.meta))
        && !has_sidecar
}

/// The port and heartbeat annotations (the pod template's, else the object's).
fn options(object: &Value, paths: &PodPaths) -> Result<Options, String> {
    let annotation = |name: &str| {
        object
            .pointer(&format!("{}/annotations/{}", paths.meta, escape(name)))
            .or_else(|| object.pointer(&format!("/metadata/annotations/{}", escape(name))))
            .and_then(Value::as_str)
    };
    let port = match annotation(PORT) {
        Some(p) => p
            .parse()
            .map_err(|_| format!("{PORT} must be a port number, got {p:?}"))?,
        None => 4040,
    };
    let heartbeat = match annotation(HEARTBEAT) {
        Some(h) => Some(
            h.parse::<u32>()
                .map_err(|_| format!("{HEARTBEAT} must be whole seconds, got {h:?}"))?,
        ),
        None => None,
    };
    Ok(Options { port, heartbeat })
}

/// Gives every app container `PODLOCK_ADDR` and its own name in `PODLOCK_CONTAINER`.
fn give_app_containers_their_env(pod_spec: &mut serde_json::Map<String, Value>, port: u16) {
    let addr = json!({"name": "PODLOCK_ADDR", "value": format!("http://127.0.0.1:{port}")});
    let containers = pod_spec.get_mut("containers").and_then(Value::as_array_mut);
    for c in containers.into_iter().flatten() {
        // Kubernetes cannot tell a container its own name: the app passes this with its
        // acquires so that its holds follow its own restarts only.
        let own = json!({"name": CONTAINER_ENV, "value": c["name"].clone()});
        let env = c
            .as_object_mut()
            .expect("container")
            .entry("env")
            .or_insert(json!([]));
        if let Some(env) = env.as_array_mut() {
            for var in [&addr, &own] {
                if !env.iter().any(|e| e["name"] == var["name"]) {
                    env.push(var.clone());
                }
            }
        }
    }
}

/// The sidecar container: a native sidecar, non-root, read-only, no capabilities.
fn sidecar(tpl: &SidecarTemplate, options: &Options) -> Container {
    let health = options.port.checked_add(1).unwrap_or(options.port - 1);
    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(health.into()),
            ..Default::default()
        }),
        period_seconds: Some(2),
        failure_threshold: Some(3),
        ..Default::default()
    };
    let quantities = |cpu: &str, memory: &str| {
        let q = |v: &str| Quantity(v.into());
        Some(BTreeMap::from([
            ("cpu".into(), q(cpu)),
            ("memory".into(), q(memory)),
        ]))
    };
    Container {
        name: SIDECAR_CONTAINER.into(),
        image: Some(tpl.image.clone()),
        args: Some(vec!["sidecar".into()]),
        restart_policy: Some("Always".into()),
        env: Some(sidecar_env(tpl, options, health)),
        startup_probe: Some(probe("/healthz")),
        readiness_probe: Some(probe("/readyz")),
        resources: Some(ResourceRequirements {
            requests: quantities("10m", "16Mi"),
            limits: quantities("200m", "64Mi"),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            run_as_group: Some(65532),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The sidecar's environment: the pod's identity from the downward API, its listeners, etcd.
fn sidecar_env(tpl: &SidecarTemplate, options: &Options, health: u16) -> Vec<EnvVar> {
    let value = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        ..Default::default()
    };
    let from = |name: &str, source: EnvVarSource| EnvVar {
        name: name.into(),
        value_from: Some(source),
        ..Default::default()
    };
    let field = |name: &str, path: &str| {
        let field_ref = ObjectFieldSelector {
            field_path: path.into(),
            ..Default::default()
        };
        from(
            name,
            EnvVarSource {
                field_ref: Some(field_ref),
                ..Default::default()
            },
        )
    };
    let mut env = vec![
        field("PODLOCK_POD_NAME", "metadata.name"),
        field("PODLOCK_NAMESPACE", "metadata.namespace"),
        field("PODLOCK_POD_UID", "metadata.uid"),
        value("PODLOCK_LISTEN", format!("127.0.0.1:{}", options.port)),
        value("PODLOCK_HEALTH_LISTEN", format!("0.0.0.0:{health}")),
        value("PODLOCK_ETCD_ENDPOINTS", tpl.etcd_endpoints.clone()),
    ];
    if let Some(h) = options.heartbeat {
        env.push(value("PODLOCK_HEARTBEAT_TIMEOUT_SECONDS", h.to_string()));
    }
    for (var, key) in [
        ("PODLOCK_ETCD_USER", "username"),
        ("PODLOCK_ETCD_PASSWORD", "password"),
    ] {
        let Some(secret) = &tpl.credentials_secret else {
            break;
        };
        // Optional: a namespace without locks has no Secret yet; its sidecar then reports 403.
        let secret_key_ref = SecretKeySelector {
            name: secret.clone(),
            key: key.into(),
            optional: Some(true),
        };
        env.push(from(
            var,
            EnvVarSource {
                secret_key_ref: Some(secret_key_ref),
                ..Default::default()
            },
        ));
    }
    env
}

/// The object at `path`, created (with its parents) when missing.
fn ensure_object<'a>(root: &'a mut Value, path: &str) -> &'a mut serde_json::Map<String, Value> {
    let mut node = root;
    for part in path.split('/').skip(1) {
        node = node
            .as_object_mut()
            .expect("objects along the path")
            .entry(part)
            .or_insert(json!({}));
    }
    node.as_object_mut().expect("an object")
}

/// Escapes a key for a JSON pointer.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tpl() -> SidecarTemplate {
        SidecarTemplate {
            image: "podlock:test".into(),
            etcd_endpoints: "http://etcd:2379".into(),
            credentials_secret: None,
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

    fn apply(obj: &Value, kind: &str, ns: &str) -> Option<Value> {
        let p = patch(&tpl(), kind, ns, obj).unwrap()?;
        let mut out = obj.clone();
        json_patch::patch(&mut out, &p).unwrap();
        Some(out)
    }

    #[test]
    fn annotated_deployment_gets_one_native_sidecar() {
        let obj = deployment(json!({INJECT: "true"}), json!({}));
        let out = apply(&obj, "Deployment", "app").expect("injected");
        let spec = &out["spec"]["template"]["spec"];
        assert_eq!(spec["initContainers"].as_array().unwrap().len(), 1);
        let sc = &spec["initContainers"][0];
        assert_eq!(
            (sc["name"].as_str(), sc["restartPolicy"].as_str()),
            (Some("podlock"), Some("Always"))
        );
        assert_eq!(sc["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(
            spec["containers"][0]["env"],
            json!([{"name": "PODLOCK_ADDR", "value": "http://127.0.0.1:4040"},
                   {"name": CONTAINER_ENV, "value": "web"}])
        );
        assert_eq!(
            out["spec"]["template"]["metadata"]["labels"][SIDECAR_LABEL],
            "true"
        );
        assert_eq!(out["spec"]["template"]["metadata"]["labels"]["app"], "web");
        // Idempotent: a second pass changes nothing.
        assert!(apply(&out, "Deployment", "app").is_none());
    }

    #[test]
    fn template_annotation_port_and_heartbeat() {
        let obj = deployment(json!({}), json!({INJECT: "true", PORT: "5050", HEARTBEAT: "20"}));
        let out = apply(&obj, "Deployment", "app").expect("injected");
        let spec = &out["spec"]["template"]["spec"];
        assert_eq!(spec["containers"][0]["env"][0]["value"], "http://127.0.0.1:5050");
        let env = spec["initContainers"][0]["env"].as_array().unwrap();
        assert!(env.contains(&json!({"name": "PODLOCK_LISTEN", "value": "127.0.0.1:5050"})));
        assert!(env.contains(&json!({"name": "PODLOCK_HEARTBEAT_TIMEOUT_SECONDS", "value": "20"})));
        let bad = deployment(json!({}), json!({INJECT: "true", PORT: "http"}));
        assert!(
            patch(&tpl(), "Deployment", "app", &bad)
                .unwrap_err()
                .contains(PORT)
        );
    }

    #[test]
    fn leaves_alone_what_it_must() {
        assert!(apply(&deployment(json!({}), json!({})), "Deployment", "app").is_none());
        assert!(
            apply(
                &deployment(json!({INJECT: "false"}), json!({})),
                "Deployment",
                "app"
            )
            .is_none()
        );
        assert!(
            apply(
                &deployment(json!({INJECT: "true"}), json!({})),
                "Deployment",
                "kube-system"
            )
            .is_none()
        );
        assert!(apply(&deployment(json!({INJECT: "true"}), json!({})), "Service", "app").is_none());
        let mut op = deployment(json!({INJECT: "true"}), json!({}));
        op["spec"]["template"]["metadata"]["labels"][OPERATOR_LABEL.0] = json!(OPERATOR_LABEL.1);
        assert!(apply(&op, "Deployment", "app").is_none());
    }

    #[test]
    fn pods_are_injected_from_their_own_annotation() {
        let pod = json!({"metadata": {"name": "p", "annotations": {INJECT: "true"}},
                         "spec": {"containers": [{"name": "a", "image": "a", "env": [{"name": "X", "value": "1"}]},
                                                 {"name": "istio-proxy", "image": "proxy"}]}});
        let out = apply(&pod, "Pod", "app").expect("injected");
        assert_eq!(out["spec"]["initContainers"][0]["name"], "podlock");
        let env = |i: usize| out["spec"]["containers"][i]["env"].as_array().unwrap().clone();
        assert_eq!(env(0).len(), 3);
        // Each container is told its own name.
        assert!(env(0).contains(&json!({"name": CONTAINER_ENV, "value": "a"})));
        assert!(env(1).contains(&json!({"name": CONTAINER_ENV, "value": "istio-proxy"})));
        assert_eq!(out["metadata"]["labels"][SIDECAR_LABEL], "true");
    }
}
