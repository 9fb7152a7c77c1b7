//! The injected sidecar container and what it changes in the pod's other containers.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, ExecAction, KeyToPath, ObjectFieldSelector,
    Probe, ResourceRequirements, SeccompProfile, SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::Value;
use std::collections::BTreeMap;

use super::names::{CONTAINER_ENV, SIDECAR_CONTAINER};
use super::template::SidecarTemplate;

/// What a pod's annotations ask of its sidecar.
pub(super) struct Options {
    pub port: u16,
    pub heartbeat: Option<u32>,
}

/// Where the sidecar finds its etcd credentials and etcd's CA (the namespace's Secret).
const ETCD_DIR: &str = "/etc/podlock/etcd";
/// The pod volume with them.
const ETCD_VOLUME: &str = "podlock-etcd";

/// The pod volume with the namespace's credentials Secret: the etcd user name and password,
/// and with etcd TLS etcd's CA. Files, not environment variables: the kubelet rewrites them
/// when the operator rewrites the Secret (a reinstall on a new etcd), and the sidecar reads
/// them again when etcd refuses its old ones, so the pod locks again without a restart.
/// Optional: a pod started before its namespace has a Secret still starts, and its sidecar
/// says why it cannot reach etcd until the files appear.
pub(super) fn etcd_volume(tpl: &SidecarTemplate) -> Option<Volume> {
    let secret = tpl.credentials_secret.as_ref()?;
    let ca = tpl.etcd_ca.then_some("ca.crt");
    let items = ["username", "password"]
        .into_iter()
        .chain(ca)
        .map(|key| KeyToPath {
            key: key.into(),
            path: key.into(),
            mode: None,
        });
    let source = SecretVolumeSource {
        secret_name: Some(secret.clone()),
        optional: Some(true),
        items: Some(items.collect()),
        default_mode: None,
    };
    Some(Volume {
        name: ETCD_VOLUME.into(),
        secret: Some(source),
        ..Volume::default()
    })
}

/// The image's own path to the binary (the Dockerfile's ENTRYPOINT), for the exec probes.
const BINARY: &str = "/usr/local/bin/podlock";

/// Gives every container of the pod, app and init containers alike, `PODLOCK_ADDR` and its
/// own name in `PODLOCK_CONTAINER`, unless it sets them itself. Called before the sidecar is
/// added, so the sidecar gets neither.
pub(super) fn give_containers_their_env(pod_spec: &mut serde_json::Map<String, Value>, port: u16) {
    let json = |var: EnvVar| serde_json::to_value(var).expect("a variable serializes");
    let addr = json(env_var("PODLOCK_ADDR", format!("http://127.0.0.1:{port}")));
    let lists = pod_spec
        .iter_mut()
        .filter(|(list, _)| *list == "containers" || *list == "initContainers");
    let containers = lists.filter_map(|(_, list)| list.as_array_mut()).flatten();
    for c in containers {
        // Kubernetes cannot tell a container its own name: the app passes this with its
        // acquires so that its holds follow its own restarts only.
        let own = json(env_var(
            CONTAINER_ENV,
            c["name"].as_str().unwrap_or_default().into(),
        ));
        let env = c
            .as_object_mut()
            .expect("container")
            .entry("env")
            .or_insert(Value::Array(vec![]));
        if let Some(env) = env.as_array_mut() {
            for var in [&addr, &own] {
                if !env.iter().any(|e| e["name"] == var["name"]) {
                    env.push(var.clone());
                }
            }
        }
    }
}

/// Adds the pull secrets `names` (`--sidecar-image-pull-secrets`) to the pod's, but those it
/// has already.
pub(super) fn add_pull_secrets(pod_spec: &mut serde_json::Map<String, Value>, names: &[String]) {
    if names.is_empty() {
        return;
    }
    let secrets = pod_spec.entry("imagePullSecrets").or_insert(Value::Array(vec![]));
    if let Some(secrets) = secrets.as_array_mut() {
        for name in names {
            if !secrets.iter().any(|s| s["name"] == name.as_str()) {
                secrets.push(serde_json::json!({"name": name}));
            }
        }
    }
}

/// The variable `name` set to `value`.
fn env_var(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value),
        ..EnvVar::default()
    }
}

/// Where the sidecar goes among the init containers: after the native sidecars already there
/// (a mesh proxy must be up before the sidecar reaches etcd), before the other init containers
/// (so that they may take locks too).
pub(super) fn position(init: &[Value]) -> usize {
    init.iter()
        .rposition(|c| c["restartPolicy"] == "Always")
        .map_or(0, |last| last + 1)
}

/// The sidecar container: a native sidecar, non-root, read-only, no capabilities.
pub(super) fn sidecar(tpl: &SidecarTemplate, options: &Options) -> Container {
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
        env: Some(sidecar_env(tpl, options)),
        // Named, so that a PodMonitor (the chart's `metrics.podMonitor`) finds the metrics.
        ports: Some(vec![ContainerPort {
            name: Some("podlock-metrics".into()),
            container_port: metrics_port(options).into(),
            ..Default::default()
        }]),
        // The app containers start once the API serves; the pod stays Ready while it does.
        // Neither depends on etcd: an etcd election must not take every pod out of its
        // Services (etcd's health is in the API's /readyz and in the metrics).
        startup_probe: Some(probe(1, 60)),
        readiness_probe: Some(probe(10, 3)),
        resources: Some(tpl.resources.clone().unwrap_or_else(|| ResourceRequirements {
            requests: quantities("10m", "16Mi"),
            limits: quantities("200m", "64Mi"),
            ..Default::default()
        })),
        security_context: Some(tpl.pod.security_context.clone().unwrap_or_else(restricted)),
        volume_mounts: etcd_volume(tpl).map(|_| {
            vec![VolumeMount {
                name: ETCD_VOLUME.into(),
                mount_path: ETCD_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            }]
        }),
        ..Default::default()
    }
}

/// `podlock probe` run inside the sidecar: it asks the API on loopback, where no mesh's
/// traffic capture and no IP family of the cluster can get in the way, as an HTTP probe from
/// the kubelet to the pod's address could.
fn probe(period_seconds: i32, failure_threshold: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec![BINARY.into(), "probe".into()]),
        }),
        period_seconds: Some(period_seconds),
        failure_threshold: Some(failure_threshold),
        timeout_seconds: Some(2),
        ..Default::default()
    }
}

/// The Pod Security Standards' `restricted` profile.
fn restricted() -> SecurityContext {
    SecurityContext {
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
    }
}

/// The sidecar's environment: the pod's identity from the downward API, its listeners, etcd.
fn sidecar_env(tpl: &SidecarTemplate, options: &Options) -> Vec<EnvVar> {
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
        let source = EnvVarSource {
            field_ref: Some(field_ref),
            ..Default::default()
        };
        from(name, source)
    };
    // Metrics on every address of either family, for Prometheus; the API on loopback only.
    let metrics = metrics_port(options);
    let mut env = vec![
        field("PODLOCK_POD_NAME", "metadata.name"),
        field("PODLOCK_NAMESPACE", "metadata.namespace"),
        field("PODLOCK_POD_UID", "metadata.uid"),
        env_var("PODLOCK_LISTEN", format!("127.0.0.1:{}", options.port)),
        env_var("PODLOCK_HEALTH_LISTEN", format!("[::]:{metrics}")),
        env_var("PODLOCK_ETCD_ENDPOINTS", tpl.etcd_endpoints.clone()),
    ];
    if let Some(h) = options.heartbeat {
        env.push(env_var("PODLOCK_HEARTBEAT_TIMEOUT_SECONDS", h.to_string()));
    }
    if !tpl.cluster.is_empty() {
        env.push(env_var("PODLOCK_CLUSTER", tpl.cluster.clone()));
    }
    if let Some(level) = &tpl.log_level {
        env.push(env_var("PODLOCK_LOG", level.clone()));
    }
    if tpl.credentials_secret.is_some() {
        env.push(env_var("PODLOCK_ETCD_CREDENTIALS_DIR", ETCD_DIR.into()));
        if tpl.etcd_ca {
            env.push(env_var("PODLOCK_ETCD_CA_FILE", format!("{ETCD_DIR}/ca.crt")));
        }
    }
    env
}

/// The metrics port: the one after the API's.
fn metrics_port(options: &Options) -> u16 {
    options.port.checked_add(1).unwrap_or(options.port - 1)
}
