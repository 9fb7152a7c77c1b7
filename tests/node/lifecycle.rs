//! What happens to injected pods over their and podlock's life: a `helm upgrade` reaches the
//! next pods' sidecars, a sidecar that dies abruptly does not leave its holds for a TTL, and a
//! pod whose app ignores SIGTERM keeps its hold exactly while that app still runs.

use std::time::{Duration, SystemTime};

use crate::common::node::{Node, retry};
use crate::upgrade;
use crate::workload::{handed_on, rollout, settled, signal_app};

/// `helm upgrade` to another podlock image (with live holds, [`upgrade`]): the app's Deployment
/// carries no sidecar of its own (only the copied annotation), so after a restart every new pod
/// runs the new sidecar.
pub fn helm_upgrade_reaches_new_pods(node: &Node) {
    let image = &node.images["PODLOCK_IMAGE"];
    let (repo, tag) = image.rsplit_once(':').unwrap();
    let next = format!("{tag}-next");
    let (ok, _, err) = node.ctr(&["images", "tag", image, &format!("{repo}:{next}")]);
    assert!(ok, "ctr images tag: {err}");
    upgrade::live_holds_survive_helm_upgrade(node, &next);
    operators_all_run(node, &format!("{repo}:{next}"));
    let (_, init, _) = node.kubectl(&[
        "get",
        "deployment",
        "worker",
        "-n",
        "app",
        "-o",
        "jsonpath={.spec.template.spec.initContainers}",
    ]);
    assert_eq!(init.trim(), "", "the Deployment's template carries a sidecar");
    let (ok, _, err) = node.kubectl(&["rollout", "restart", "deployment/worker", "-n", "app"]);
    assert!(ok, "rollout restart: {err}");
    rollout(node);
    let (_, images, _) = node.kubectl(&[
        "get", "pods", "-n", "app", "-l", "app=worker", "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.spec.initContainers[0].image} {.metadata.deletionTimestamp}{"\n"}{end}"#,
    ]);
    let live: Vec<&str> = images.lines().filter(|l| l.ends_with(' ')).collect();
    eprintln!(
        "after helm upgrade --set image.tag={next} and a rollout restart:\n{}",
        live.join("\n")
    );
    let new = format!(" {repo}:{next} ");
    assert!(
        !live.is_empty() && live.iter().all(|l| l.contains(&new)),
        "pods without the upgraded sidecar:\n{images}"
    );
}

/// Waits until every operator pod runs `image`. Old replicas answer admission requests for
/// their drain window after SIGTERM (with the old sidecar): a rollout that must reach every
/// new pod waits until they are gone.
fn operators_all_run(node: &Node, image: &str) {
    let upgraded = retry(Duration::from_secs(90), || {
        let (_, images, _) = node.kubectl(&[
            "get",
            "pods",
            "-n",
            "podlock",
            "-l",
            "app.kubernetes.io/component=podlock-operator",
            "-o",
            "jsonpath={.items[*].spec.containers[0].image}",
        ]);
        images
            .split_whitespace()
            .all(|i| i == image)
            .then_some(())
            .ok_or(images)
    });
    assert!(upgraded.is_ok(), "old operator pods linger: {upgraded:?}");
}

/// SIGKILL of the holder's sidecar (through containerd, as an OOM kill would): the kubelet
/// restarts it, and the operator ends the holds the dead incarnation kept.
pub fn sidecar_kill_ends_the_hold(node: &Node) {
    let holder = settled(node);
    let (_, id, _) = node.kubectl(&[
        "get",
        "pod",
        "-n",
        "app",
        &holder.pod,
        "-o",
        r#"jsonpath={.status.initContainerStatuses[?(@.name=="podlock")].containerID}"#,
    ]);
    let id = id.trim().trim_start_matches("containerd://").to_string();
    let t0 = SystemTime::now();
    let (ok, _, err) = node.ctr(&["tasks", "kill", "-s", "SIGKILL", &id]);
    assert!(ok, "ctr tasks kill {id}: {err}");
    let what = format!(
        "sidecar of {} killed (SIGKILL, restarted by the kubelet, TTL 30 s)",
        holder.pod
    );
    let took = handed_on(node, &holder, t0, &what);
    // The kubelet reports the restart on its next relist (about 1 s); the operator then acts.
    assert!(
        took < Duration::from_secs(5),
        "hold outlived its sidecar by {took:?}"
    );
}

/// Deletes the holder's pod with a 3 s grace period while its app ignores SIGTERM: the app
/// runs on (and may still write) until the kubelet kills it, so the hold stays until then, and
/// moves on as soon as it is dead. Handing it on at the deletion would make two running holders.
pub fn an_app_ignoring_sigterm_keeps_its_hold_until_killed(node: &Node) {
    let holder = settled(node);
    let (ok, err) = signal_app(node, &holder.pod, "-USR2");
    assert!(ok, "exec: {err}");
    let t0 = SystemTime::now();
    let (ok, _, err) = node.kubectl(&[
        "delete",
        "pod",
        "-n",
        "app",
        &holder.pod,
        "--grace-period=3",
        "--wait=false",
    ]);
    assert!(ok, "delete: {err}");
    let what = format!("deleted {} (grace 3 s) whose app ignores SIGTERM", holder.pod);
    let took = handed_on(node, &holder, t0, &what);
    assert!(
        took >= Duration::from_millis(2500),
        "the lock moved on while the old holder still ran ({took:?})"
    );
    assert!(
        took < Duration::from_secs(5),
        "the lock outlived the grace period by {took:?}"
    );
}
