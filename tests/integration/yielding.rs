//! Please yield, from `kubectl` alone, on a real API server with the operator, real etcd and
//! real sidecars: `kubectl annotate dlock NAME podlock.io/yield=HOLDER
//! podlock.io/yield-grace=...` tells the holder `yield` with its deadline (its stream, status,
//! `GET`), a holder that releases in time ends normally, one that does not is ended at the
//! deadline (`lost`, reason `yield`) and the next waiter granted; `podlock lock` passes the
//! request on to its command as SIGTERM; a bad request gets a Warning naming the problem.

use kube::api::Api;
use podlock::crd::DistributedLock;
use serde_json::{Value, json};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::common::events::Events;
use crate::common::kube::{ControlPlane, Operator, with_crd};
use crate::common::{Sidecar, podlock_bin, wait_until};
use crate::force_release::event;
use crate::operator::{declare_until_free, status_until};

/// Asks `holder` of `name` to yield within `grace` (the lock's default when `None`).
fn ask(plane: &ControlPlane, ns: &str, name: &str, holder: &str, grace: Option<&str>) {
    let mut args = vec![
        "annotate".to_string(),
        "dlock".into(),
        name.into(),
        "-n".into(),
        ns.into(),
        format!("podlock.io/yield={holder}"),
        "--overwrite".into(),
    ];
    args.extend(grace.map(|g| format!("podlock.io/yield-grace={g}")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, _, err) = plane.kubectl(&args);
    assert!(ok, "{err}");
}

/// The time an RFC 3339 field of `v` names.
fn time(v: &Value, field: &str) -> SystemTime {
    let text = v[field].as_str().unwrap_or_else(|| panic!("no {field}: {v}"));
    humantime::parse_rfc3339(text).unwrap()
}

/// How far `at` lies from `expected`, either way.
fn off(at: SystemTime, expected: SystemTime) -> Duration {
    at.duration_since(expected)
        .or_else(|_| expected.duration_since(at))
        .unwrap()
}

/// Waits until neither yield annotation is left on `name`.
async fn annotations_gone(api: &Api<DistributedLock>, name: &str) {
    let gone = wait_until(Duration::from_secs(10), || async {
        let dl = api.get(name).await.unwrap();
        let left = dl.metadata.annotations.unwrap_or_default();
        !left.keys().any(|k| k.starts_with("podlock.io/yield"))
    })
    .await;
    gone.expect("the operator removed the annotations");
}

/// A sidecar of `pod` in `ns`.
async fn sidecar(plane: &ControlPlane, ns: &str, pod: &str) -> Arc<Sidecar> {
    Arc::new(Sidecar::start(&plane.etcd.endpoint, pod, &["--namespace", ns]).await)
}

#[tokio::test]
async fn a_holder_asked_to_yield_is_told_its_deadline_and_its_release_in_time_ends_normally() {
    let plane = with_crd();
    let ns = plane.namespace("yield");
    let op = Operator::start(plane, &ns).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    declare_until_free(plane, &api, &ns, "db", "{}").await;
    let (a, b) = (
        sidecar(plane, &ns, "pod-a").await,
        sidecar(plane, &ns, "pod-b").await,
    );
    let mut events = Events::open(&a, "db").await;
    let token = a.must_acquire("db", json!({})).await;
    assert_eq!(events.next(Duration::from_secs(2)).await["type"], "acquired");
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.must_acquire("db", json!({"waitSeconds": 60})).await }
    });
    status_until(&api, "db", "B waiting", |s| s.waiters == 1).await;

    let asked = SystemTime::now();
    ask(plane, &ns, "db", "pod-a", Some("20s"));
    let told = events.next(Duration::from_secs(2)).await;
    assert_eq!(
        (told["type"].as_str(), told["fencingToken"].as_i64()),
        (Some("yield"), Some(token)),
        "{told}"
    );
    let deadline = time(&told, "deadline");
    assert!(
        off(deadline, asked + Duration::from_secs(20)) < Duration::from_secs(2),
        "{told}"
    );
    let said = told["deadline"].as_str().map(String::from);
    status_until(&api, "db", "the deadline", |s| {
        s.holders.first().and_then(|h| h.yield_deadline.clone()) == said
    })
    .await;
    let (_, info) = a.get("/v1/locks/db").await;
    assert_eq!(info["holders"][0]["yieldDeadline"], told["deadline"], "{info}");
    let (kind, message) = event(plane, &ns, "db", "YieldAsked").await;
    assert_eq!(kind, "Normal");
    for part in [
        "podlock.io/yield=pod-a",
        "pod-a (pod pod-a",
        &format!("token {token}"),
        "by 20",
    ] {
        assert!(
            message.contains(part),
            "the Event does not say {part:?}: {message}"
        );
    }
    annotations_gone(&api, "db").await;

    assert_eq!(a.post("db", "release", json!({})).await.0, 200);
    assert_eq!(events.next(Duration::from_secs(2)).await["type"], "released");
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(next > token);
    let metrics = op.metrics().await;
    let line = "podlock_forced_releases_total{reason=\"yield\"} 0";
    assert!(metrics.contains(line), "{line} missing");
}

#[tokio::test]
async fn a_holder_that_does_not_yield_is_ended_at_the_deadline_and_the_next_waiter_granted() {
    let plane = with_crd();
    let ns = plane.namespace("yield-late");
    let op = Operator::start(plane, &ns).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    // The lock's own grace, 2 s, as the request names none.
    declare_until_free(plane, &api, &ns, "job", "{yieldGraceSeconds: 2}").await;
    let (a, b) = (
        sidecar(plane, &ns, "pod-a").await,
        sidecar(plane, &ns, "pod-b").await,
    );
    let mut events = Events::open(&a, "job").await;
    let token = a.must_acquire("job", json!({})).await;
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            (
                b.must_acquire("job", json!({"waitSeconds": 60})).await,
                SystemTime::now(),
            )
        }
    });
    status_until(&api, "job", "B waiting", |s| s.waiters == 1).await;
    ask(plane, &ns, "job", "*", None);
    assert_eq!(events.next(Duration::from_secs(2)).await["type"], "acquired");
    let told = events.next(Duration::from_secs(2)).await;
    assert_eq!(told["type"], "yield", "{told}");
    let deadline = time(&told, "deadline");

    let lost = events.next(Duration::from_secs(4)).await;
    let at = SystemTime::now();
    assert_eq!(
        (lost["type"].as_str(), lost["reason"].as_str()),
        (Some("lost"), Some("yield")),
        "{lost}"
    );
    assert!(
        off(at, deadline) < Duration::from_secs(1),
        "ended {:?} from the deadline",
        off(at, deadline)
    );
    let (next, granted) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(next > token);
    eprintln!(
        "yield: ended {:?} after the deadline, the waiter granted {:?} after it",
        at.duration_since(deadline).unwrap_or_default(),
        granted.duration_since(deadline).unwrap_or_default()
    );
    let (_, message) = event(plane, &ns, "job", "YieldReleased").await;
    assert!(
        message.contains(&format!("key revision {}", token & ((1 << 40) - 1))),
        "{message}"
    );
    let line = "podlock_forced_releases_total{reason=\"yield\"} 1";
    assert!(op.metrics().await.contains(line), "{line} missing");
    let lost = "podlock_locks_lost_total{lock=\"job\",reason=\"yield\"}";
    assert_eq!(a.metric(lost).await, 1.0);
    // The end left a note for the sidecar; the lock's deletion takes it along.
    let notes = format!("/podlock/v1/config/{ns}/.released/job/");
    assert_eq!(plane.etcd.count(&notes).await, 1, "the operator's note");
    let (ok, _, err) = plane.kubectl(&["delete", "dlock", "job", "-n", &ns, "--timeout=10s"]);
    assert!(ok, "{err}");
    assert_eq!(plane.etcd.count(&notes).await, 0, "a note outlived its lock");
}

#[tokio::test]
async fn a_bad_request_gets_a_warning_naming_the_problem_and_is_removed() {
    let plane = with_crd();
    let ns = plane.namespace("yield-bad");
    let _op = Operator::start(plane, &ns).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    declare_until_free(plane, &api, &ns, "job", "{}").await;
    let a = sidecar(plane, &ns, "pod-a").await;
    a.must_acquire("job", json!({})).await;
    status_until(&api, "job", "A holds", |s| s.holders.len() == 1).await;
    // One of each reason: the API server's Events of one reason on one object form a series
    // that keeps its first note (the unit tests of `yielding` check the other problems).
    for (holder, grace, reason, says) in [
        (
            "pod-a",
            Some("soon"),
            "YieldInvalid",
            "podlock.io/yield-grace=\"soon\" is not seconds or a duration",
        ),
        ("nobody", None, "YieldNotHeld", "the holders are pod-a (pod pod-a"),
    ] {
        ask(plane, &ns, "job", holder, grace);
        let mut found = None;
        let said = wait_until(Duration::from_secs(10), || {
            let events = crate::force_release::events_of(plane, &ns, "job");
            found = events.into_iter().find(|e| e.1 == reason && e.2.contains(says));
            std::future::ready(found.is_some())
        })
        .await;
        said.unwrap_or_else(|_| {
            let events = crate::force_release::events_of(plane, &ns, "job");
            panic!("no {reason} saying {says:?}: {events:?}")
        });
        assert_eq!(found.unwrap().0, "Warning");
        annotations_gone(&api, "job").await;
    }
    let (_, info) = a.get("/v1/locks/job").await;
    assert!(
        info["holders"][0].get("yieldDeadline").is_none(),
        "A was asked: {info}"
    );
}

#[tokio::test]
async fn podlock_lock_passes_a_request_to_yield_on_to_its_command_as_sigterm() {
    let plane = with_crd();
    let ns = plane.namespace("yield-cmd");
    let _op = Operator::start(plane, &ns).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    declare_until_free(plane, &api, &ns, "batch", "{}").await;
    let s = sidecar(plane, &ns, "pod-a").await;
    // The command stops on SIGTERM with a status of its own, which `podlock lock` passes on.
    let script = "trap 'echo yielding; exit 3' TERM; while true; do sleep 0.05; done";
    let run = tokio::process::Command::new(podlock_bin())
        .args(["lock", "batch", "--", "sh", "-c", script])
        .env("PODLOCK_ADDR", &s.addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output();
    let run = tokio::spawn(run);
    status_until(&api, "batch", "held", |s| s.holders.len() == 1).await;
    let asked = Instant::now();
    ask(plane, &ns, "batch", "*", Some("30s"));
    let out = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!(
        "podlock lock: the command stopped {:?} after kubectl annotate",
        asked.elapsed()
    );
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("yielding") && stderr.contains("asked to yield"),
        "{stdout}\n{stderr}"
    );
    assert!(asked.elapsed() < Duration::from_secs(5));
    assert_eq!(s.get("/v1/locks/batch").await.1["held"], false);
}

/// Finding F6 of the simulation issue (#54): the operator mirrored the status, holder Service
/// included, before it ended holds past their deadline, and a Service it could not write (here
/// refused by an admission policy) failed the reconcile first: a holder asked to yield was
/// never ended, and the next waiter never granted.
#[tokio::test]
async fn a_holder_service_that_cannot_be_written_does_not_stop_a_yield_deadline() {
    let plane = with_crd();
    let ns = plane.namespace("yield-no-service");
    refuse_services(plane, &ns).await;
    let op = Operator::start(plane, &ns).await;
    let api: Api<DistributedLock> = Api::namespaced(plane.client().await, &ns);
    let spec = "{yieldGraceSeconds: 2, holderService: {ports: [{port: 80}]}}";
    declare_until_free(plane, &api, &ns, "job", spec).await;
    let (a, b) = (
        sidecar(plane, &ns, "pod-a").await,
        sidecar(plane, &ns, "pod-b").await,
    );
    let mut events = Events::open(&a, "job").await;
    let token = a.must_acquire("job", json!({})).await;
    let waiter = tokio::spawn(async move { b.must_acquire("job", json!({"waitSeconds": 60})).await });
    status_until(&api, "job", "B waiting", |s| s.waiters == 1).await;
    let failed = |s: &podlock::crd::DistributedLockStatus| {
        (s.conditions.iter()).any(|c| c.type_ == "HolderService" && c.reason == "ServiceFailed")
    };
    status_until(&api, "job", "the holder Service failing", failed).await;
    ask(plane, &ns, "job", "*", None);
    assert_eq!(events.next(Duration::from_secs(2)).await["type"], "acquired");
    assert_eq!(events.next(Duration::from_secs(2)).await["type"], "yield");
    let lost = events.next(Duration::from_secs(6)).await;
    assert_eq!(
        (lost["type"].as_str(), lost["reason"].as_str()),
        (Some("lost"), Some("yield")),
        "{lost}\n{}",
        op.log()
    );
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter granted")
        .unwrap();
    assert!(next > token);
}

/// Has the API server refuse every Service written in `ns` (a ValidatingAdmissionPolicy), and
/// waits until it does.
async fn refuse_services(plane: &ControlPlane, ns: &str) {
    let policy = format!(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\n\
         metadata: {{name: no-services-{ns}}}\nspec:\n  failurePolicy: Fail\n  matchConstraints:\n\
         \x20   resourceRules: [{{apiGroups: [\"\"], apiVersions: [v1], operations: [CREATE, UPDATE], \
         resources: [services]}}]\n  validations: [{{expression: \"false\", message: no Services here}}]\n\
         ---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\n\
         metadata: {{name: no-services-{ns}}}\nspec:\n  policyName: no-services-{ns}\n\
         \x20 validationActions: [Deny]\n  matchResources:\n\
         \x20   namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}\n"
    );
    let (ok, _, err) = plane.kubectl_stdin(&["apply", "-f", "-"], &policy);
    assert!(ok, "{err}");
    let probe = [
        "create",
        "service",
        "clusterip",
        "probe",
        "--tcp=80",
        "-n",
        ns,
        "--dry-run=server",
    ];
    wait_until(Duration::from_secs(20), || async { !plane.kubectl(&probe).0 })
        .await
        .expect("the API server refuses Services in the namespace");
}
