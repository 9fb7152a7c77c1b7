//! Force release from `kubectl` alone: `kubectl annotate dlock NAME podlock.io/release=HOLDER`
//! (or `=*`) ends that hold on a real API server with the operator and real sidecars. The
//! holder's sidecar says `lost` (an administrator released it), the next waiter is granted, an
//! Event records it and the annotation is gone. Only who may patch the DistributedLock may do
//! it: the chart's aggregated roles give that to `edit`, not to `view`.

use kube::api::Api;
use podlock::crd::DistributedLock;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::chart::render;
use crate::common::events::Events;
use crate::common::kube::{ControlPlane, Operator, kubectl_as, with_crd};
use crate::common::{Sidecar, wait_until};
use crate::operator::{declare_until_free, status_until};

const ANNOTATION: &str = "podlock.io/release";

/// The Events of object `name` in `ns`: (type, reason, message).
pub(crate) fn events_of(plane: &ControlPlane, ns: &str, name: &str) -> Vec<(String, String, String)> {
    let selector = format!("involvedObject.name={name}");
    let (ok, out, err) = plane.kubectl(&[
        "get",
        "events",
        "-n",
        ns,
        "--field-selector",
        &selector,
        "-o",
        "json",
    ]);
    assert!(ok, "{err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (list["items"].as_array().unwrap().iter())
        .map(|e| (text(&e["type"]), text(&e["reason"]), text(&e["message"])))
        .collect()
}

/// Waits for an Event of `reason` on `name`; returns its type and message.
pub(crate) async fn event(plane: &ControlPlane, ns: &str, name: &str, reason: &str) -> (String, String) {
    let mut found = None;
    let waited = wait_until(Duration::from_secs(10), || {
        found = events_of(plane, ns, name).into_iter().find(|e| e.1 == reason);
        std::future::ready(found.is_some())
    })
    .await;
    waited.unwrap_or_else(|e| {
        panic!(
            "no {reason} Event on {name} ({e}): {:?}",
            events_of(plane, ns, name)
        )
    });
    let (kind, _, message) = found.unwrap();
    (kind, message)
}

/// Waits until the annotation is gone from `name`.
async fn annotation_gone(api: &Api<DistributedLock>, name: &str) {
    let gone = wait_until(Duration::from_secs(10), || async {
        let dl = api.get(name).await.unwrap();
        !dl.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(ANNOTATION)
    })
    .await;
    gone.expect("the operator removed the annotation");
}

/// Annotates `name` with `value` through kubectl with `kubeconfig`; returns (success, stderr).
fn annotate(kubeconfig: &std::path::Path, ns: &str, name: &str, value: &str) -> (bool, String) {
    let arg = format!("{ANNOTATION}={value}");
    let (ok, _, err) = kubectl_as(
        kubeconfig,
        &["annotate", "dlock", name, "-n", ns, &arg, "--overwrite"],
        "",
    );
    (ok, err)
}

/// Applies the chart's aggregated roles and returns kubeconfigs of a ServiceAccount bound to
/// the built-in `view` role and of one bound to `edit`, once aggregation has given each its
/// podlock rules.
async fn viewer_and_editor(plane: &ControlPlane, ns: &str) -> [(tempfile::TempDir, std::path::PathBuf); 2] {
    let roles = render(&["--show-only", "templates/user-roles.yaml"]);
    let (ok, _, err) = plane.kubectl_stdin(&["apply", "-f", "-"], &roles);
    assert!(ok, "{err}");
    ["view", "edit"].map(|role| {
        let account = format!("{role}er");
        let (ok, _, err) = plane.kubectl(&["create", "serviceaccount", &account, "-n", ns]);
        assert!(ok, "{err}");
        let subject = format!("--serviceaccount={ns}:{account}");
        let binding = [
            "create",
            "rolebinding",
            &account,
            "-n",
            ns,
            "--clusterrole",
            role,
            &subject,
        ];
        let (ok, _, err) = plane.kubectl(&binding);
        assert!(ok, "{err}");
        plane.token_kubeconfig(ns, &account)
    })
}

/// Whether the identity of `kubeconfig` may `verb` DistributedLocks in `ns`.
fn can(kubeconfig: &std::path::Path, ns: &str, verb: &str) -> bool {
    let (_, out, _) = kubectl_as(
        kubeconfig,
        &["auth", "can-i", verb, "distributedlocks.podlock.io", "-n", ns],
        "",
    );
    out.trim() == "yes"
}

#[tokio::test]
async fn an_editor_ends_a_named_hold_with_kubectl_annotate_and_the_next_waiter_is_granted() {
    let plane = with_crd();
    let ns = plane.namespace("force-release");
    let [(_v, viewer), (_e, editor)] = viewer_and_editor(plane, &ns).await;
    let aggregated = wait_until(Duration::from_secs(20), || async {
        can(&viewer, &ns, "get") && can(&editor, &ns, "patch")
    })
    .await;
    aggregated.expect("the aggregation controller gave view and edit the chart's podlock rules");
    assert!(!can(&viewer, &ns, "patch"), "a viewer may patch DistributedLocks");

    let _op = Operator::start(plane, &ns).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    declare_until_free(plane, &api, &ns, "db", "{ttlSeconds: 30}").await;
    let sidecar =
        |pod: &'static str| Sidecar::start(&plane.etcd.endpoint, pod, &["--namespace", "force-release"]);
    let (a, b) = (sidecar("pod-a").await, Arc::new(sidecar("pod-b").await));
    let mut a_events = Events::open(&a, "db").await;
    let token = a.must_acquire("db", json!({})).await;
    assert_eq!(a_events.next(Duration::from_secs(2)).await["type"], "acquired");
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            (
                b.post("db", "acquire", json!({"waitSeconds": 30})).await,
                Instant::now(),
            )
        }
    });
    status_until(&api, "db", "B waiting", |s| s.waiters == 1).await;

    let (ok, err) = annotate(&viewer, &ns, "db", "pod-a");
    assert!(
        !ok && err.contains("forbidden"),
        "a viewer annotated the lock: {err}"
    );
    let (ok, err) = annotate(&editor, &ns, "db", "pod-a");
    assert!(ok, "an editor could not annotate: {err}");
    let annotated = Instant::now();

    let lost = a_events.next(Duration::from_secs(1)).await;
    let told = annotated.elapsed();
    assert_eq!(lost["type"], "lost", "{lost}");
    assert_eq!(lost["fencingToken"], token);
    let reason = lost["reason"].as_str().unwrap();
    assert!(reason.contains("administrator released it"), "{reason}");
    let ((status, grant), granted) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 200, "{grant}");
    assert!(grant["fencingToken"].as_i64() > Some(token), "{grant}");
    let (kind, message) = event(plane, &ns, "db", "Released").await;
    assert_eq!(kind, "Normal");
    for part in [
        "podlock.io/release=pod-a",
        "pod-a (pod pod-a",
        &format!("token {token}"),
        "kubectl-annotate",
    ] {
        assert!(
            message.contains(part),
            "the Event does not say {part:?}: {message}"
        );
    }
    annotation_gone(&api, "db").await;
    let (code, body) = a.post("db", "release", json!({})).await;
    assert_eq!((code, body["error"].as_str()), (410, Some("lock_lost")), "{body}");
    let metrics = _op.metrics().await;
    let line = "podlock_forced_releases_total{reason=\"admin_release\"} 1";
    assert!(metrics.contains(line), "{line} missing");
    let lost = "podlock_locks_lost_total{lock=\"db\",reason=\"admin_release\"}";
    assert_eq!(a.metric(lost).await, 1.0);
    eprintln!(
        "force release: the holder was told lost {told:?} and the waiter granted {:?} after kubectl annotate returned",
        granted.duration_since(annotated)
    );
}

#[tokio::test]
async fn a_bad_or_pointless_request_gets_a_warning_naming_the_problem_and_is_removed() {
    let plane = with_crd();
    let ns = plane.namespace("force-release-bad");
    let _op = Operator::start(plane, &ns).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    declare_until_free(plane, &api, &ns, "job", "{}").await;
    let a = Sidecar::start(&plane.etcd.endpoint, "pod-a", &["--namespace", &ns]).await;
    let token = a.must_acquire("job", json!({})).await;
    status_until(&api, "job", "A holds", |s| s.holders.len() == 1).await;

    for (value, reason, says) in [
        ("web 1", "ReleaseInvalid", "holderId \"web 1\" is invalid"),
        ("nobody", "ReleaseNotHeld", "the holders are pod-a (pod pod-a"),
    ] {
        let (ok, err) = annotate(&plane.kubeconfig, &ns, "job", value);
        assert!(ok, "{err}");
        let (kind, message) = event(plane, &ns, "job", reason).await;
        assert_eq!(kind, "Warning", "{message}");
        assert!(
            message.contains(says),
            "{reason} does not say {says:?}: {message}"
        );
        annotation_gone(&api, "job").await;
    }
    let (_, info) = a.get("/v1/locks").await;
    assert_eq!(info["locks"][0]["fencingToken"], token, "A still holds: {info}");
}

#[tokio::test]
async fn a_star_ends_every_hold_of_a_semaphore() {
    let plane = with_crd();
    let ns = plane.namespace("force-release-all");
    let _op = Operator::start(plane, &ns).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    declare_until_free(plane, &api, &ns, "pool", "{maxHolders: 2}").await;
    let flags = ["--namespace", ns.as_str()];
    let (a, b) = (
        Sidecar::start(&plane.etcd.endpoint, "pod-a", &flags).await,
        Sidecar::start(&plane.etcd.endpoint, "pod-b", &flags).await,
    );
    let (mut ea, mut eb) = (Events::open(&a, "pool").await, Events::open(&b, "pool").await);
    let tokens = [
        a.must_acquire("pool", json!({})).await,
        b.must_acquire("pool", json!({})).await,
    ];
    status_until(&api, "pool", "two holders", |s| s.holders.len() == 2).await;
    let (ok, err) = annotate(&plane.kubeconfig, &ns, "pool", "*");
    assert!(ok, "{err}");
    for events in [&mut ea, &mut eb] {
        assert_eq!(events.next(Duration::from_secs(2)).await["type"], "acquired");
        let lost = events.next(Duration::from_secs(1)).await;
        assert_eq!(lost["type"], "lost", "{lost}");
    }
    let (_, message) = event(plane, &ns, "pool", "Released").await;
    for token in tokens {
        assert!(message.contains(&format!("token {token}")), "{message}");
    }
    status_until(&api, "pool", "free", |s| s.holders.is_empty()).await;
    annotation_gone(&api, "pool").await;
}

/// A hold that a release handed on (direct handoff: its entry written by the releaser) is
/// ended like any other.
#[tokio::test]
async fn a_hold_handed_on_by_a_release_is_ended_like_any_other() {
    let plane = with_crd();
    let ns = plane.namespace("force-release-handed");
    let _op = Operator::start(plane, &ns).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    declare_until_free(plane, &api, &ns, "baton", "{}").await;
    let flags = ["--namespace", ns.as_str()];
    let start = async |pod| Arc::new(Sidecar::start(&plane.etcd.endpoint, pod, &flags).await);
    let (a, b, c) = (start("pod-a").await, start("pod-b").await, start("pod-c").await);
    a.must_acquire("baton", json!({})).await;
    let waits = |s: &Arc<Sidecar>| {
        let s = s.clone();
        tokio::spawn(async move { s.must_acquire("baton", json!({"waitSeconds": 30})).await })
    };
    let b_waits = waits(&b);
    status_until(&api, "baton", "B waiting", |s| s.waiters == 1).await;
    let c_waits = waits(&c);
    status_until(&api, "baton", "C waiting", |s| s.waiters == 2).await;
    // A's release is a plain delete; B, granted by its read, knows C behind it and hands on.
    assert_eq!(a.post("baton", "release", json!({})).await.0, 200);
    b_waits.await.unwrap();
    let mut c_events = Events::open(&c, "baton").await;
    assert_eq!(b.post("baton", "release", json!({})).await.0, 200);
    let token = c_waits.await.unwrap();
    assert_eq!(c_events.next(Duration::from_secs(2)).await["type"], "acquired");
    let (ok, err) = annotate(&plane.kubeconfig, &ns, "baton", "pod-c");
    assert!(ok, "{err}");
    let lost = c_events.next(Duration::from_secs(2)).await;
    assert_eq!(
        (lost["type"].as_str(), lost["fencingToken"].as_i64()),
        (Some("lost"), Some(token)),
        "{lost}"
    );
    let (_, message) = event(plane, &ns, "baton", "Released").await;
    assert!(message.contains(&format!("token {token}")), "{message}");
}
