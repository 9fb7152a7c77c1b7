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

/// The pods that `selector` selects, once some exist, `all` holds for all of them and `any`
/// for one.
async fn pods_of(
    pods: &Api<Pod>,
    selector: &str,
    all: impl Fn(&Pod) -> bool,
    any: impl Fn(&Pod) -> bool,
) -> Vec<Pod> {
    let params = ListParams::default().labels(selector);
    let start = std::time::Instant::now();
    loop {
        let found = pods.list(&params).await.map(|l| l.items).unwrap_or_default();
        if found.iter().all(&all) && found.iter().any(&any) {
            return found;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "pods of {selector}: {:?}",
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

/// The pod's `podlock` container is a native sidecar with the pod's identity, a probe inside
/// it, resources and a restricted security context.
fn assert_sidecar_as_injected(pod: &Pod) {
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
        .and_then(|p| p.exec.as_ref())
        .and_then(|e| e.command.clone());
    assert_eq!(
        ready,
        Some(vec!["/usr/local/bin/podlock".into(), "probe".into()]),
        "a probe on loopback, inside the sidecar"
    );
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
    pods_of(&pods, "app=web", |p| sidecars(p) == 0, |_| true).await;

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
    let injected = pods_of(&pods, "app=web", |p| sidecars(p) <= 1, |p| sidecars(p) == 1).await;
    let pod = injected.iter().find(|p| sidecars(p) == 1).unwrap();
    assert_sidecar_as_injected(pod);
    let spec = pod.spec.as_ref().unwrap();
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

    // The Deployment carries no sidecar, only the annotation copied into its template, so a
    // new podlock version reaches its next pods.
    assert_eq!(template_init_containers(plane, "deployment", "web", &ns), "");
    assert_eq!(
        template_annotations(plane, "deployment", "web", &ns),
        json!({"podlock.io/inject": "true", "podlock.io/inject-stamp": "podlock.io/inject"})
    );
    // Removing the annotation rolls out pods without the sidecar.
    let (ok, _, err) = plane.kubectl(&["annotate", "deployment", "web", "-n", &ns, "podlock.io/inject-"]);
    assert!(ok, "{err}");
    assert_eq!(template_annotations(plane, "deployment", "web", &ns), json!(null));
    // (The template is the first one again: its ReplicaSet becomes the current revision.)
    wait_until(Duration::from_secs(30), || async {
        current_revision_template(plane, &ns).is_empty()
    })
    .await
    .expect("a rollout back to pods without the sidecar");
}

/// The pod template annotations of `kind`/`name` (`null` when there are none).
fn template_annotations(plane: &ControlPlane, kind: &str, name: &str, ns: &str) -> Value {
    let path = "jsonpath={.spec.template.metadata.annotations}";
    let out = plane.kubectl(&["get", kind, name, "-n", ns, "-o", path]).1;
    serde_json::from_str(out.trim()).unwrap_or(Value::Null)
}

/// The pod template annotations of the ReplicaSet of the highest revision in `ns`.
fn current_revision_template(plane: &ControlPlane, ns: &str) -> String {
    let path = r#"jsonpath={range .items[*]}{.metadata.annotations.deployment\.kubernetes\.io/revision} {.spec.template.metadata.annotations}{"\n"}{end}"#;
    let out = plane.kubectl(&["get", "rs", "-n", ns, "-o", path]).1;
    let mut revisions: Vec<(u32, String)> = out
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(rev, annotations)| (rev.parse().unwrap_or(0), annotations.trim().to_string()))
        .collect();
    revisions.sort();
    revisions.pop().map(|(_, a)| a).unwrap_or_else(|| "none".into())
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

    // A hostNetwork pod gets no sidecar, and its creator is told why.
    let mut host = serde_json::from_str::<Value>(&pod("host", json!({"podlock.io/inject": "true"}))).unwrap();
    host["spec"]["hostNetwork"] = json!(true);
    let (ok, _, stderr) = plane.kubectl_stdin(&["apply", "-f", "-"], &host.to_string());
    assert!(
        ok && stderr.contains("hostNetwork pods get no sidecar"),
        "{stderr}"
    );
    assert_eq!(sidecars(&pods.get("host").await.unwrap()), 0);

    // A Job's pods get the sidecar; the Job itself only the copied annotation (at creation:
    // its template is immutable), and annotating it later is not refused.
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "migrate", "namespace": ns, "annotations": {"podlock.io/inject": "true"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "m", "image": "m"}]}}}});
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &job.to_string()).0);
    assert_eq!(template_init_containers(plane, "job", "migrate", &ns), "");
    let job_pods = pods_of(&pods, "job-name=migrate", |_| true, |_| true).await;
    assert_eq!(sidecars(&job_pods[0]), 1);
    let (ok, _, err) = plane.kubectl(&["annotate", "job", "migrate", "-n", &ns, "team=db"]);
    assert!(ok, "annotating a Job is not refused: {err}");
}

#[tokio::test]
async fn a_pod_created_while_the_webhook_was_away_stays_updatable() {
    let plane = with_crd();
    let ns = plane.namespace("inject-update");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "early", "namespace": ns,
        "annotations": {"podlock.io/inject": "true"}}, "spec": {"containers": [{"name": "app", "image": "app"}]}});
    assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &pod.to_string()).0);
    let _op = Operator::start(plane, &ns).await;
    webhook_ready(plane, &ns).await;
    let (ok, _, err) = plane.kubectl(&["label", "pod", "early", "-n", &ns, "updated=yes"]);
    assert!(ok, "a pod update is never mutated, so never refused: {err}");
    let pods: Api<Pod> = Api::namespaced(plane.client().await, &ns);
    assert_eq!(sidecars(&pods.get("early").await.unwrap()), 0);
}

#[tokio::test]
async fn a_supplied_certificate_wins_over_the_self_made_one() {
    let plane = with_crd();
    let ns = plane.namespace("own-cert");
    let dir = tempfile::tempdir().unwrap();
    crate::certs::make_certificate(dir.path(), "IP:127.0.0.1", 2);
    let flags = crate::certs::tls_flags(dir.path());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
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

#[tokio::test]
async fn only_objects_with_podlock_annotations_are_sent_to_the_webhook() {
    let plane = with_crd();
    let ns = plane.namespace("inject-only");
    let op = Operator::start(plane, &ns).await;
    webhook_ready(plane, &ns).await;
    let pod = |name: &str, annotations: Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "annotations": annotations},
               "spec": {"containers": [{"name": "app", "image": "app"}]}})
        .to_string()
    };
    for name in ["a", "b", "c"] {
        assert!(
            plane
                .kubectl_stdin(&["apply", "-f", "-"], &pod(name, json!({})))
                .0
        );
    }
    assert!(
        plane
            .kubectl_stdin(&["apply", "-f", "-"], &deployment(&ns, "plain", json!({})))
            .0
    );
    assert!(
        plane
            .kubectl_stdin(
                &["apply", "-f", "-"],
                &pod("locked", json!({"podlock.io/inject": "true"}))
            )
            .0
    );
    let pods: Api<Pod> = Api::namespaced(plane.client().await, &ns);
    pods_of(&pods, "app=plain", |_| true, |_| true).await;
    let metrics = op.metrics().await;
    let sent = crate::common::sum_metric(&metrics, "podlock_webhook_admissions_total");
    // The annotated pod, and at most once more when the API server reinvokes the webhook
    // (`IfNeeded`) after its own plugins changed the pod (the ServiceAccount plugin mounts a
    // token into the new sidecar). Without matchConditions every pod above came here too.
    assert!(
        sent <= 2.0,
        "the API server called the webhook for unannotated objects:\n{metrics}"
    );
    assert!(metrics.contains(r#"podlock_webhook_admissions_total{kind="Pod",outcome="changed"} 1"#));
}

/// Namespace-wide opt-in (issue #41): in a namespace labelled `podlock.io/inject=enabled` every
/// new pod gets the sidecar without an annotation, but one annotated `podlock.io/inject:
/// "false"`; the sidecar carries the operator's `--sidecar-resources` and `--sidecar-log-level`.
#[tokio::test]
async fn a_namespace_labelled_for_injection_injects_every_pod_but_those_that_opt_out() {
    let plane = with_crd();
    let ns = plane.namespace("inject-ns");
    let resources = r#"{"requests": {"cpu": "20m", "memory": "24Mi"}, "limits": {"memory": "96Mi"}}"#;
    let flags = [
        "--sidecar-resources",
        resources,
        "--sidecar-log-level",
        "info,podlock=debug",
    ];
    let _op = Operator::start_with(plane, &ns, &plane.etcd.endpoint, &flags).await;
    webhook_ready(plane, &ns).await;
    let pod = |name: &str, annotations: Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "annotations": annotations},
               "spec": {"containers": [{"name": "app", "image": "app"}]}})
        .to_string()
    };
    let apply = |text: String| assert!(plane.kubectl_stdin(&["apply", "-f", "-"], &text).0);
    let pods: Api<Pod> = Api::namespaced(plane.client().await, &ns);
    // Before the label, an unannotated pod is left alone.
    apply(pod("before", json!({})));
    assert_eq!(sidecars(&pods.get("before").await.unwrap()), 0);
    let (ok, _, err) = plane.kubectl(&["label", "namespace", &ns, "podlock.io/inject=enabled"]);
    assert!(ok, "{err}");
    apply(pod("plain", json!({})));
    apply(pod("out", json!({"podlock.io/inject": "false"})));
    apply(pod("asked", json!({"podlock.io/inject": "true"})));
    let plain = pods.get("plain").await.unwrap();
    assert_eq!(sidecars(&plain), 1, "an unannotated pod of the namespace");
    assert_sidecar_as_injected(&plain);
    assert_eq!(sidecars(&pods.get("out").await.unwrap()), 0, "the pod's opt-out");
    assert_eq!(sidecars(&pods.get("asked").await.unwrap()), 1);
    let spec = plain.spec.unwrap();
    let sc = spec
        .init_containers
        .unwrap()
        .into_iter()
        .find(|c| c.name == "podlock")
        .unwrap();
    let resources = serde_json::to_value(sc.resources.unwrap()).unwrap();
    assert_eq!(
        resources,
        json!({"requests": {"cpu": "20m", "memory": "24Mi"}, "limits": {"memory": "96Mi"}})
    );
    let log = sc
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "PODLOCK_LOG")
        .and_then(|e| e.value.clone());
    assert_eq!(log.as_deref(), Some("info,podlock=debug"));
    // Removing the label ends it: the annotation alone decides again.
    let (ok, _, err) = plane.kubectl(&["label", "namespace", &ns, "podlock.io/inject-"]);
    assert!(ok, "{err}");
    apply(pod("after", json!({})));
    assert_eq!(sidecars(&pods.get("after").await.unwrap()), 0);
}
