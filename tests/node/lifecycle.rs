//! What happens to injected pods over podlock's own life: a `helm upgrade` reaches the next
//! pods' sidecars, and a sidecar that dies abruptly does not leave its holds for a TTL.

use std::time::{Duration, SystemTime};

use crate::CHART;
use crate::common::node::Node;
use crate::workload::{next_holder, rollout, settled, since};

/// `helm upgrade` to another podlock image: the app's Deployment carries no sidecar of its own
/// (only the copied annotation), so after a restart every new pod runs the new sidecar.
pub fn helm_upgrade_reaches_new_pods(node: &Node) {
    let image = &node.images["PODLOCK_IMAGE"];
    let (repo, tag) = image.rsplit_once(':').unwrap();
    let next = format!("{tag}-next");
    let (ok, _, err) = node.ctr(&["images", "tag", image, &format!("{repo}:{next}")]);
    assert!(ok, "ctr images tag: {err}");
    let (ok, out, err) = node.helm(&[
        "upgrade",
        "podlock",
        CHART,
        "-n",
        "podlock",
        "--reuse-values",
        "--set",
        &format!("image.tag={next}"),
        "--wait",
        "--timeout",
        "5m",
    ]);
    assert!(ok, "helm upgrade: {out}{err}");
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
    let next = next_holder(node, &holder.pod);
    let took = since(t0, &next);
    eprintln!(
        "sidecar of {} killed (SIGKILL, restarted by the kubelet): {} got the lock {} ms later (TTL 30 s)",
        holder.pod,
        next.pod,
        took.as_millis()
    );
    // The kubelet reports the restart on its next relist (about 1 s); the operator then acts.
    assert!(
        took < Duration::from_secs(5),
        "hold outlived its sidecar by {took:?}"
    );
}
