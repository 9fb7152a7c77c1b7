//! Sidecar injection through the mutating webhook, on a real kube-apiserver with
//! kube-controller-manager turning Deployments into ReplicaSets and Pods.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use std::time::Duration;

use crate::common::kube::{ControlPlane, Operator, with_crd};
use crate::common::wait_until;

fn deployment(ns: &str, name: &str, annotations: Value) -> String {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "app", "image": "app:1"}]}}}
    })
    .to_string()
}

/// The pods of Deployment `app`, once some exist, `all` holds for all of them and `any` for one.
async fn pods_of(
    pods: &Api<Pod>,
    app: &str,
    all: impl Fn(&Pod) -> bool,
    any: impl Fn(&Pod) -> bool,
) -> Vec<Pod> {
    let params = ListParams::default().labels(&format!("app={app}"));
    let start = std::time::Instant::now();
    loop {
        let found = pods.list(&params).await.map(|l| l.items).unwrap_or_default();
        if found.iter().all(&all) && found.iter().any(&any) {
            return found;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "pods of {app}: {:?}",
            found.iter().map(|p| &p.spec).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn sidecars(pod: &Pod) -> usize {
    let spec = pod.spec.as_ref().unwrap();
    spec.init_containers
        .iter()
        .flatten()
        .filter(|c| c.name == "podlock")
        .count()
}

/// The init containers' names in the pod template of `kind`/`name`.
fn template_init_containers(plane: &ControlPlane, kind: &str, name: &str, ns: &str) -> String {
    let path = "jsonpath={.spec.template.spec.initContainers[*].name}";
    plane
        .kubectl(&["get", kind, name, "-n", ns, "-o", path])
        .1
        .trim()
        .to_string()
}

/// Waits until the webhook configuration of the operator of `ns` carries a caBundle.
pub async fn webhook_ready(plane: &ControlPlane, ns: &str) {
    let name = format!("podlock-{ns}");
    wait_until(Duration::from_secs(15), || async {
        let (ok, out, _) = plane.kubectl(&[
            "get",
            "mutatingwebhookconfiguration",
            &name,
            "-o",
            "jsonpath={.webhooks[0].clientConfig.caBundle}",
        ]);
        ok && !out.is_empty()
    })
    .await
    .expect("webhook configuration with a caBundle");
}

#[tokio::test]
async fn annotating_a_deployment_rolls_out_pods_with_exactly_one_sidecar() {
    let plane = with_crd();
    let ns = plane.namespace("inject");
    let _op = Operator::start(plane, &ns).await;
    webhook_ready(plane, &ns).await;
    let pods: Api<Pod> = Api::namespaced(plane.client().await, &ns);

    // Without the annotation, nothing changes.
    assert!(
        plane
            .kubectl_stdin(&["apply", "-f", "-"], &deployment(&ns, "web", json!({})))
            .0
    );
    pods_of(&pods, "web", |p| sidecars(p) == 0, |_| true).await;

    // `kubectl annotate deployment web podlock.io/inject=true` alone rolls out injected pods.
    let (ok, _, err) = plane.kubectl(&[
        "annotate",
        "deployment",
        "web",
        "-n",
        &ns,
        "podlock.io/inject=true",
    ]);
    assert!(ok, "{err}");
    // No kubelet: the old pod stays; the rollout's new pod carries the sidecar.
    let injected = pods_of(&pods, "web", |p| sidecars(p) <= 1, |p| sidecars(p) == 1).await;
    let pod = injected.iter().find(|p| sidecars(p) == 1).unwrap();
    let spec = pod.spec.as_ref().unwrap();
    let sc = spec
        .init_containers
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.name == "podlock")
        .unwrap();
    assert_eq!(sc.restart_policy.as_deref(), Some("Always"), "a native sidecar");
    assert_eq!(sc.image.as_deref(), Some("podlock:test"));
    let env = |name: &str| sc.env.iter().flatten().find(|e| e.name == name).cloned();
    for (var, path) in [
        ("PODLOCK_POD_NAME", "metadata.name"),
        ("PODLOCK_NAMESPACE", "metadata.namespace"),
        ("PODLOCK_POD_UID", "metadata.uid"),
    ] {
        let field = env(var)
            .and_then(|e| e.value_from)
            .and_then(|v| v.field_ref)
            .map(|f| f.field_path);
        assert_eq!(field.as_deref(), Some(path), "{var} from the downward API");
    }
    let ready = sc
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .map(|h| h.path.clone());
    assert_eq!(ready, Some(Some("/readyz".into())));
    let resources = sc.resources.as_ref().unwrap();
    assert!(resources.requests.is_some() && resources.limits.is_some());
    let sec = sc.security_context.as_ref().unwrap();
    assert_eq!(
        (sec.run_as_non_root, sec.read_only_root_filesystem),
        (Some(true), Some(true))
    );
    assert_eq!(
        sec.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_string()][..])
    );
    let app = &spec.containers[0];
    let addr = app
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "PODLOCK_ADDR")
        .and_then(|e| e.value.clone());
    assert_eq!(addr.as_deref(), Some("http://127.0.0.1:4040"));
    assert_eq!(
        pod.metadata.labels.as_ref().unwrap()["podlock.io/sidecar"],
        "true"
    );

    // Applying the annotated Deployment again keeps exactly one sidecar in its template.
    let annotated = deployment(&ns, "web", json!({"podlock.io/inject": "true"}));
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &annotated).0);
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &annotated).0);
    assert_eq!(
        template_init_containers(plane, "deployment", "web", &ns),
        "podlock"
    );
}

#[tokio::test]
async fn pods_and_jobs_are_injected_only_when_annotated() {
    let plane = with_crd();
    let ns = plane.namespace("inject-kinds");
    let _op = Operator::start(plane, &ns).await;
    webhook_ready(plane, &ns).await;
    let pod = |name: &str, annotations: Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "annotations": annotations},
               "spec": {"containers": [{"name": "app", "image": "app"}]}})
        .to_string()
    };
    let port =
        json!({"podlock.io/inject": "true", "podlock.io/port": "5050", "podlock.io/heartbeat-timeout": "20"});
    assert!(
        plane
            .kubectl_stdin(&["apply", "-f", "-"], &pod("plain", json!({})))
            .0
    );
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &pod("locked", port)).0);
    let pods: Api<Pod> = Api::namespaced(plane.client().await, &ns);
    assert_eq!(sidecars(&pods.get("plain").await.unwrap()), 0);
    let locked = pods.get("locked").await.unwrap();
    assert_eq!(sidecars(&locked), 1);
    let spec = locked.spec.unwrap();
    let sc = &spec.init_containers.unwrap()[0];
    let env: Vec<_> = sc
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect();
    assert!(
        env.contains(&("PODLOCK_LISTEN".into(), Some("127.0.0.1:5050".into()))),
        "{env:?}"
    );
    assert!(
        env.contains(&("PODLOCK_HEARTBEAT_TIMEOUT_SECONDS".into(), Some("20".into()))),
        "{env:?}"
    );

    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "migrate", "namespace": ns},
        "spec": {"template": {"metadata": {"annotations": {"podlock.io/inject": "true"}},
                 "spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "m"}]}}}});
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &job.to_string()).0);
    assert_eq!(template_init_containers(plane, "job", "migrate", &ns), "podlock");
}

#[tokio::test]
async fn a_supplied_certificate_wins_over_the_self_made_one() {
    let plane = with_crd();
    let ns = plane.namespace("own-cert");
    let dir = tempfile::tempdir().unwrap();
    crate::certs::make_certificate(dir.path(), "IP:127.0.0.1", 2);
    let file = |f: &str| dir.path().join(f).display().to_string();
    let flags = [
        "--tls-cert-file",
        &file("tls.crt"),
        "--tls-key-file",
        &file("tls.key"),
        "--tls-ca-file",
        &file("ca.crt"),
    ];
    let _op = Operator::start_with(plane, &ns, &plane.etcd.endpoint, &flags).await;
    webhook_ready(plane, &ns).await;
    let (_, bundle, _) = plane.kubectl(&[
        "get",
        "mutatingwebhookconfiguration",
        &format!("podlock-{ns}"),
        "-o",
        "jsonpath={.webhooks[0].clientConfig.caBundle}",
    ]);
    let ca = std::fs::read_to_string(dir.path().join("ca.crt")).unwrap();
    use k8s_openapi::ByteString;
    let expected = serde_json::to_value(ByteString(ca.into_bytes())).unwrap();
    assert_eq!(json!(bundle.trim()), expected, "caBundle is the supplied CA");
    assert!(
        !plane
            .kubectl(&["get", "secret", "podlock-webhook-tls", "-n", &ns])
            .0,
        "no self-made certificate"
    );
    // And the API server trusts the webhook through it: an annotated pod is injected.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns,
        "annotations": {"podlock.io/inject": "true"}}, "spec": {"containers": [{"name": "app", "image": "app"}]}});
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &pod.to_string()).0);
    let pods: Api<Pod> = Api::namespaced(plane.client().await, &ns);
    assert_eq!(sidecars(&pods.get("p").await.unwrap()), 1);
}
