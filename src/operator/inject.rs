//! Sidecar injection as a pure function: given an admitted object, the JSON patch that adds the
//! podlock sidecar to its pod template, or `None` when it must be left alone.
//!
//! `podlock.io/inject: "true"` on a Pod, or on a Deployment, StatefulSet, DaemonSet or Job
//! (its metadata or its pod template), adds a native sidecar (an init container with
//! `restartPolicy: Always`) named `podlock`, labels the pod `podlock.io/sidecar=true` (so the
//! operator's pod watch sees it) and gives every app container `PODLOCK_ADDR`. Injection is
//! idempotent; objects without the annotation, in `kube-system`, or of the operator itself are
//! never changed.

use serde_json::{Value, json};

use super::liveness::{SIDECAR_CONTAINER, SIDECAR_LABEL};

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

/// The patch that injects the sidecar into `object` (of `kind`, in `namespace`), if any.
pub fn patch(
    tpl: &SidecarTemplate,
    kind: &str,
    namespace: &str,
    object: &Value,
) -> Result<Option<json_patch::Patch>, String> {
    let (meta, spec) = match kind {
        "Pod" => ("/metadata", "/spec"),
        "Deployment" | "StatefulSet" | "DaemonSet" | "Job" => {
            ("/spec/template/metadata", "/spec/template/spec")
        }
        _ => return Ok(None),
    };
    let annotated = |path: &str| {
        object.pointer(&format!("{path}/annotations/{}", escape(INJECT))) == Some(&json!("true"))
    };
    let labelled_operator = |path: &str| {
        object.pointer(&format!("{path}/labels/{}", escape(OPERATOR_LABEL.0)))
            == Some(&json!(OPERATOR_LABEL.1))
    };
    if namespace == "kube-system" || !(annotated("/metadata") || annotated(meta)) {
        return Ok(None);
    }
    if labelled_operator("/metadata") || labelled_operator(meta) {
        return Ok(None);
    }
    let has_sidecar = object
        .pointer(&format!("{spec}/initContainers"))
        .and_then(Value::as_array)
        .is_some_and(|c| c.iter().any(|c| c["name"] == SIDECAR_CONTAINER));
    if has_sidecar {
        return Ok(None);
    }
    let annotation = |name: &str| {
        object
            .pointer(&format!("{meta}/annotations/{}", escape(name)))
            .or_else(|| object.pointer(&format!("/metadata/annotations/{}", escape(name))))
            .and_then(Value::as_str)
    };
    let port: u16 = match annotation(PORT) {
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
    let mut mutated = object.clone();
    let labels = ensure_object(&mut mutated, &format!("{meta}/labels"));
    labels.insert(SIDECAR_LABEL.into(), json!("true"));
    let pod_spec = ensure_object(&mut mutated, spec);
    let addr = json!({"name": "PODLOCK_ADDR", "value": format!("http://127.0.0.1:{port}")});
    for c in pod_spec
        .get_mut("containers")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
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
    let init = pod_spec.entry("initContainers").or_insert(json!([]));
    if let Some(init) = init.as_array_mut() {
        init.insert(0, sidecar(tpl, port, heartbeat));
    }
    Ok(Some(json_patch::diff(object, &mutated)))
}

/// The sidecar container: a native sidecar, non-root, read-only, no capabilities.
fn sidecar(tpl: &SidecarTemplate, port: u16, heartbeat: Option<u32>) -> Value {
    let field =
        |name: &str, path: &str| json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}});
    let health = port.checked_add(1).unwrap_or(port - 1);
    let mut env = vec![
        field("PODLOCK_POD_NAME", "metadata.name"),
        field("PODLOCK_NAMESPACE", "metadata.namespace"),
        field("PODLOCK_POD_UID", "metadata.uid"),
        json!({"name": "PODLOCK_LISTEN", "value": format!("127.0.0.1:{port}")}),
        json!({"name": "PODLOCK_HEALTH_LISTEN", "value": format!("0.0.0.0:{health}")}),
        json!({"name": "PODLOCK_ETCD_ENDPOINTS", "value": tpl.etcd_endpoints}),
    ];
    if let Some(h) = heartbeat {
        env.push(json!({"name": "PODLOCK_HEARTBEAT_TIMEOUT_SECONDS", "value": h.to_string()}));
    }
    if let Some(secret) = &tpl.credentials_secret {
        for (var, key) in [
            ("PODLOCK_ETCD_USER", "username"),
            ("PODLOCK_ETCD_PASSWORD", "password"),
        ] {
            // Optional: a namespace without locks has no Secret yet; its sidecar then reports 403.
            env.push(json!({"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": true}}}));
        }
    }
    let probe = |path: &str| json!({"httpGet": {"path": path, "port": health}, "periodSeconds": 2, "failureThreshold": 3});
    json!({
        "name": SIDECAR_CONTAINER,
        "image": tpl.image,
        "args": ["sidecar"],
        "restartPolicy": "Always",
        "env": env,
        "startupProbe": probe("/healthz"),
        "readinessProbe": probe("/readyz"),
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}},
        "securityContext": {
            "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
            "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}
        }
    })
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
