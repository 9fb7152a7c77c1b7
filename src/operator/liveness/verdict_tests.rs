use super::*;
use serde_json::{Value, json};
use std::time::Duration;

/// The hold was requested at `T` (300 ms into a second).
const T_MS: u64 = 1_800_000_000_300;

fn t() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(T_MS)
}

fn at(offset_ms: i64) -> String {
    let t = SystemTime::UNIX_EPOCH + Duration::from_millis((T_MS as i64 + offset_ms) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

fn running(name: &str, id: &str, restarts: i32, started_ms: i64) -> Value {
    json!({"name": name, "image": "", "imageID": "", "ready": true, "restartCount": restarts,
           "containerID": id, "state": {"running": {"startedAt": at(started_ms)}}})
}

fn pod(uid: &str, phase: &str, containers: Vec<Value>) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": uid},
        "status": {"phase": phase, "containerStatuses": containers}
    }))
    .unwrap()
}

fn entry(uid: &str, container: Option<&str>) -> PodEntry {
    PodEntry {
        lock: crate::lock::LockId {
            namespace: "ns".into(),
            name: "l".into(),
        },
        key: "k".into(),
        revision: 1,
        lease: 1,
        holder_id: "h".into(),
        uid: uid.into(),
        requested: t(),
        container: container.map(str::to_string),
        bound: TakenBy::new(),
    }
}

fn judge(pod: &Pod, e: &PodEntry, bound: &mut TakenBy) -> Option<Reason> {
    verdict(pod, e, bound)
}

#[test]
fn pod_verdicts() {
    let app = || vec![running("app", "a1", 0, -60_000)];
    let e = entry("u", None);
    let mut b = TakenBy::new();
    assert_eq!(
        judge(&pod("v", "Running", app()), &e, &mut b),
        Some(Reason::PodReplaced)
    );
    assert_eq!(
        judge(&pod("u", "Failed", app()), &e, &mut b),
        Some(Reason::PodFailed)
    );
    assert_eq!(
        judge(&pod("u", "Succeeded", app()), &e, &mut b),
        Some(Reason::PodSucceeded)
    );
    // A sidecar (written by hand as an app container) that restarted since took the session
    // that kept the hold with it.
    let sidecar_restarted = vec![
        running("app", "a1", 0, -60_000),
        running("podlock", "s2", 3, 5_000),
    ];
    assert_eq!(
        judge(&pod("u", "Running", sidecar_restarted), &e, &mut b),
        Some(Reason::SidecarRestarted)
    );
}

#[test]
fn a_restart_in_the_second_of_the_request_ends_a_bound_hold() {
    let e = entry("u", None);
    let mut b = TakenBy::new();
    // First seen while the incarnation that asked runs: bound to it.
    assert_eq!(
        judge(
            &pod("u", "Running", vec![running("app", "a1", 0, -60_000)]),
            &e,
            &mut b
        ),
        None
    );
    assert_eq!(
        b["app"],
        Incarnation {
            restarts: 0,
            id: "a1".into()
        }
    );
    // Crashed and restarted 400 ms after the request: same whole second, another incarnation.
    let again = pod("u", "Running", vec![running("app", "a2", 1, 400)]);
    assert_eq!(
        judge(&again, &e, &mut b.clone()),
        Some(Reason::ContainerRestarted)
    );
    // A lagging cache's older status (before the incarnation started) proves nothing.
    let mut creating = running("app", "", 0, 0);
    creating["state"] = json!({"waiting": {"reason": "ContainerCreating"}});
    assert_eq!(judge(&pod("u", "Running", vec![creating]), &e, &mut b), None);
    // Its end, before any restart, does.
    let mut dead = running("app", "a1", 0, -60_000);
    dead["state"] = json!({"terminated": {"exitCode": 1, "containerID": "a1", "finishedAt": at(200)}});
    assert_eq!(
        judge(&pod("u", "Running", vec![dead.clone()]), &e, &mut b.clone()),
        Some(Reason::ContainerRestarted)
    );
    dead["lastState"] = dead["state"].clone();
    dead["state"] = json!({"waiting": {"reason": "CrashLoopBackOff"}});
    assert_eq!(
        judge(&pod("u", "Running", vec![dead]), &e, &mut b),
        Some(Reason::ContainerRestarted)
    );
}

#[test]
fn without_a_binding_only_a_later_second_is_proof() {
    let e = entry("u", None);
    // Started in the request's second: maybe the incarnation that asked; kept, not bound.
    let mut b = TakenBy::new();
    assert_eq!(
        judge(
            &pod("u", "Running", vec![running("app", "a2", 1, 500)]),
            &e,
            &mut b
        ),
        None
    );
    assert!(b.is_empty());
    // Started in a later second: the one that asked is gone.
    assert_eq!(
        judge(
            &pod("u", "Running", vec![running("app", "a2", 1, 800)]),
            &e,
            &mut b
        ),
        Some(Reason::ContainerRestarted)
    );
}

#[test]
fn a_hold_naming_its_container_ignores_the_others() {
    let e = entry("u", Some("app"));
    let mut b = TakenBy::new();
    let both = |proxy: Value| pod("u", "Running", vec![running("app", "a1", 0, -60_000), proxy]);
    assert_eq!(
        judge(&both(running("istio-proxy", "p1", 0, -60_000)), &e, &mut b),
        None
    );
    assert_eq!(b.keys().collect::<Vec<_>>(), ["app"]);
    assert_eq!(
        judge(&both(running("istio-proxy", "p2", 1, 5_000)), &e, &mut b),
        None
    );
    // The same restart ends a hold that names no container.
    assert_eq!(
        judge(
            &both(running("istio-proxy", "p2", 1, 5_000)),
            &entry("u", None),
            &mut TakenBy::new()
        ),
        Some(Reason::ContainerRestarted)
    );
    let own = pod("u", "Running", vec![running("app", "a2", 1, 400)]);
    assert_eq!(judge(&own, &e, &mut b), Some(Reason::ContainerRestarted));
}

#[test]
fn an_init_container_that_names_itself_is_judged_by_its_own_status() {
    let e = entry("u", Some("migrate"));
    let with_init = |init: Value| {
        let mut p = pod("u", "Pending", vec![]);
        p.status.as_mut().unwrap().init_container_statuses =
            Some(vec![serde_json::from_value(init).unwrap()]);
        p
    };
    let mut b = TakenBy::new();
    assert_eq!(
        judge(&with_init(running("migrate", "m1", 0, -5_000)), &e, &mut b),
        None
    );
    assert_eq!(b["migrate"].id, "m1");
    // It ran to completion without releasing: the hold has no holder left.
    let mut done = running("migrate", "m1", 0, -5_000);
    done["state"] = json!({"terminated": {"exitCode": 0, "containerID": "m1", "finishedAt": at(100)}});
    assert_eq!(
        judge(&with_init(done), &e, &mut b),
        Some(Reason::ContainerRestarted)
    );
    // A hold that names no container is judged by app containers only, as before.
    let done_later = {
        let mut d = running("migrate", "m1", 0, -5_000);
        d["state"] = json!({"terminated": {"exitCode": 0, "containerID": "m1", "finishedAt": at(5_000)}});
        d
    };
    assert_eq!(
        judge(&with_init(done_later), &entry("u", None), &mut TakenBy::new()),
        None
    );
}

#[test]
fn an_id_reported_after_the_binding_is_learnt() {
    let e = entry("u", None);
    let mut b = TakenBy::new();
    assert_eq!(
        judge(
            &pod("u", "Running", vec![running("app", "", 0, -60_000)]),
            &e,
            &mut b
        ),
        None
    );
    assert_eq!(
        judge(
            &pod("u", "Running", vec![running("app", "a1", 0, -60_000)]),
            &e,
            &mut b
        ),
        None
    );
    assert_eq!(b["app"].id, "a1");
    // Then its end in the request's own second is recognised by that id.
    let mut dead = running("app", "a1", 0, -60_000);
    dead["state"] = json!({"terminated": {"exitCode": 1, "containerID": "a1", "finishedAt": at(300)}});
    assert_eq!(
        judge(&pod("u", "Running", vec![dead]), &e, &mut b),
        Some(Reason::ContainerRestarted)
    );
}

#[test]
fn a_sidecar_restart_ends_the_holds_it_kept() {
    let with_sidecar = |sidecar: Value| {
        let mut p = pod("u", "Running", vec![running("app", "a1", 0, -60_000)]);
        p.status.as_mut().unwrap().init_container_statuses =
            Some(vec![serde_json::from_value(sidecar).unwrap()]);
        p
    };
    for e in [entry("u", None), entry("u", Some("app"))] {
        let mut b = TakenBy::new();
        let first = with_sidecar(running(SIDECAR_CONTAINER, "s1", 0, -60_000));
        assert_eq!(judge(&first, &e, &mut b), None);
        assert_eq!(b[SIDECAR_CONTAINER].id, "s1");
        // Killed and restarted by the kubelet in the second of the request: still proof.
        let restarted = with_sidecar(running(SIDECAR_CONTAINER, "s2", 1, 0));
        assert_eq!(judge(&restarted, &e, &mut b), Some(Reason::SidecarRestarted));
    }
    // A hold the new sidecar took is its own.
    let mut late = entry("u", None);
    late.requested = t() + Duration::from_secs(5);
    let restarted = with_sidecar(running(SIDECAR_CONTAINER, "s2", 1, 0));
    assert_eq!(judge(&restarted, &late, &mut TakenBy::new()), None);
}

/// A pod's app containers start one after another: the second's first incarnation can start in
/// a later second than a hold the first asked for. It never asked (it was not running), so it
/// proves nothing of a hold that names no container; a restart of it still does. Found on the
/// node (Kubernetes 1.37.2): a contender pod of two app containers lost its first hold 300 ms
/// after the grant, "its key was deleted".
#[test]
fn a_containers_first_start_after_the_request_is_no_restart() {
    let e = entry("u", None);
    let asker = || running("mutex", "m1", 0, -1_000);
    let starting = pod("u", "Running", vec![asker(), running("semaphore", "s1", 0, 800)]);
    assert_eq!(judge(&starting, &e, &mut TakenBy::new()), None);
    let restarted = pod("u", "Running", vec![asker(), running("semaphore", "s2", 1, 800)]);
    assert_eq!(
        judge(&restarted, &e, &mut TakenBy::new()),
        Some(Reason::ContainerRestarted)
    );
}
