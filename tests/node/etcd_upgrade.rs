//! The bundled etcd upgraded from the chart's previous etcd with a lock held (issue #55 item 1):
//! the release is installed on the oldest image of `ETCD_HOP_IMAGES` (3.5.17) and upgraded
//! with `helm upgrade --reuse-values` through the others (3.5.36: etcd requires a recent 3.5
//! patch on every member before a 3.6 joins, docs/operations.md) to the chart's etcd (3.6.16),
//! one minor at a time as etcd requires. After each hop the holder of `work` still holds with
//! the same token (the fence check says current), every member and the cluster report the new
//! version, and the lock is handed on when its holder's pod is deleted.

use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::common::node::{Node, retry};
use crate::fence::{curl_fence, holder};
use crate::workload::{handed_on, settled};
use crate::{etcd_members, helm_upgrade};

/// The images of the upgrade path, oldest first, ending with the chart's etcd.
fn path(node: &Node) -> Vec<&str> {
    let hops = node.images.get("ETCD_HOP_IMAGES").unwrap_or_else(|| {
        panic!(
            "images.env names no ETCD_HOP_IMAGES: scripts/setup.sh builds their servers with the test tools"
        )
    });
    hops.split(',')
        .chain([node.images["ETCD_IMAGE"].as_str()])
        .collect()
}

/// The image to install the release with: the oldest of the upgrade path.
pub fn first_image(node: &Node) -> String {
    path(node)[0].to_string()
}

/// Upgrades the bundled etcd along its path while a worker holds `work`; prints each hop's time,
/// from `helm upgrade` until every member and the cluster report the new version.
pub fn the_bundled_etcd_upgrades_under_a_live_hold(node: &Node) {
    let path = path(node);
    let mut took = vec![];
    for image in &path[1..] {
        let before = settled(node);
        let (pod, token) = holder(node);
        let started = Instant::now();
        upgrade_to(node, image);
        members_report(node, &pod, image.rsplit_once(":v").unwrap().1);
        took.push(format!("{image} in {:.1} s", started.elapsed().as_secs_f64()));
        assert_eq!(holder(node), (pod.clone(), token), "the hold changed on {image}");
        let answer = curl_fence(node, &pod, token);
        assert_eq!(answer["current"], true, "token {token} after {image}: {answer}");
        let t0 = SystemTime::now();
        let (ok, _, err) = node.kubectl(&["delete", "pod", "-n", "app", &pod, "--wait=false"]);
        assert!(ok, "delete {pod}: {err}");
        handed_on(node, &before, t0, &format!("on {image}, deleted {pod}"));
    }
    eprintln!(
        "bundled etcd upgraded from {} with a hold kept (same token, current) and handed on after each hop: to {}",
        path[0],
        took.join(", ")
    );
}

/// `helm upgrade --reuse-values` to the bundled etcd `image`, waiting for every member.
fn upgrade_to(node: &Node, image: &str) {
    let (ok, out, err) = helm_upgrade(node, &[&format!("etcd.bundled.image={image}")]);
    if !ok {
        let (_, pods, _) = node.kubectl(&["get", "pods", "-n", "podlock", "-o", "wide"]);
        let (_, log, _) = node.kubectl(&[
            "logs",
            "-n",
            "podlock",
            "-l",
            "app.kubernetes.io/component=etcd",
            "--tail=20",
            "--prefix",
        ]);
        panic!("helm upgrade to {image}: {out}{err}\n{pods}\n{log}");
    }
}

/// Waits until every member's `/version`, asked from `pod`'s app container (an injected pod,
/// which etcd's NetworkPolicy admits), names server `version` and its minor as the cluster's
/// (which the leader raises once every member runs it).
fn members_report(node: &Node, pod: &str, version: &str) {
    let members = etcd_members(node, "{.items[*].metadata.name}");
    let cluster = format!("{}.0", version.rsplit_once('.').unwrap().0);
    let script = members
        .split_whitespace()
        .map(|m| format!("curl -sk --max-time 3 https://{m}.podlock-etcd.podlock.svc:2379/version; echo"));
    let script = script.collect::<Vec<_>>().join("; ");
    let reported = retry(Duration::from_secs(60), || {
        let (_, out, err) = node.kubectl(&["exec", "-n", "app", pod, "-c", "app", "--", "sh", "-c", &script]);
        let answers: Vec<Value> = out.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        let all = answers.len() == members.split_whitespace().count()
            && answers
                .iter()
                .all(|a| a["etcdserver"] == version && a["etcdcluster"] == cluster.as_str());
        all.then_some(()).ok_or(format!("{out}{err}"))
    });
    assert!(
        reported.is_ok(),
        "members {members} do not all report {version} (cluster {cluster}): {reported:?}"
    );
}
