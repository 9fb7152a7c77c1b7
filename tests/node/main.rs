//! podlock on a real node: the Helm chart installed with its bundled etcd, the operator and the
//! injected sidecars running as Pods under a real kubelet, from images built here
//! (`scripts/images.sh`). Its own test binary, so that its pods do not share the 2 cores with
//! the timing-sensitive integration tests.

#[path = "../common/mod.rs"]
mod common;

mod deadline;
mod etcd_upgrade;
mod fence;
mod gitops;
mod helm_test;
mod holder_service;
mod injection;
mod interrupt;
mod isolation;
mod lifecycle;
mod multi;
mod network_policy;
mod uninstall;
mod upgrade;
mod workload;
mod yielding;

use common::node::Node;

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/podlock");

/// `helm upgrade` of the release with its values kept and each of `sets` (`key=value`) over
/// them, waiting up to 5 minutes for every pod.
fn helm_upgrade(node: &Node, sets: &[&str]) -> (bool, String, String) {
    let mut args = vec!["upgrade", "podlock", CHART, "-n", "podlock", "--reuse-values"];
    for set in sets {
        args.extend(["--set", set]);
    }
    args.extend(["--wait", "--timeout", "5m"]);
    node.helm(&args)
}

/// The bundled etcd's member pods, as `kubectl get -o jsonpath=...` prints them.
fn etcd_members(node: &Node, jsonpath: &str) -> String {
    let selector = "app.kubernetes.io/component=etcd";
    let output = format!("jsonpath={jsonpath}");
    let args = ["get", "pods", "-n", "podlock", "-l", selector, "-o", &output];
    node.kubectl(&args).1
}

/// Installs the chart with the local images, the bundled etcd on `etcd_image` and each of
/// `values` (`key=value`); returns once the operator and etcd are Ready.
fn install(node: &Node, etcd_image: &str, values: &[&str]) {
    let (repo, tag) = node.images["PODLOCK_IMAGE"].rsplit_once(':').unwrap();
    let sets = [
        format!("image.repository={repo}"),
        format!("image.tag={tag}"),
        "image.pullPolicy=Never".into(),
        "etcd.bundled.enabled=true".into(),
        format!("etcd.bundled.image={etcd_image}"),
    ];
    let sets = sets.iter().map(String::as_str).chain(values.iter().copied());
    let mut args = vec!["install", "podlock", CHART, "-n", "podlock", "--create-namespace"];
    args.extend(["--wait", "--timeout", "5m"]);
    for s in sets {
        args.extend(["--set", s]);
    }
    let started = std::time::Instant::now();
    let (ok, out, err) = node.helm(&args);
    if !ok {
        let (_, pods, _) = node.kubectl(&["get", "pods", "-A", "-o", "wide"]);
        let (_, events, _) = node.kubectl(&["get", "events", "-n", "podlock"]);
        panic!("helm install: {out}{err}\n{pods}\n{events}\n{}", node.logs());
    }
    eprintln!(
        "helm install --wait: operator and etcd Ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let (ok, out, err) = node.helm(&["test", "podlock", "-n", "podlock", "--timeout", "2m"]);
    if !ok {
        let pod = "podlock-test-operator-ready";
        let (_, log, _) = node.kubectl(&["logs", "-n", "podlock", pod]);
        let (_, status, _) = node.kubectl(&["get", "pod", "-n", "podlock", pod, "-o", "jsonpath={.status}"]);
        panic!("helm test: {out}{err}\n{pod} logged:\n{log}\nits status: {status}");
    }
}

/// The webhook is registered through its Service (not a URL) and has a CA bundle.
fn assert_webhook_through_service(node: &Node) {
    let (ok, out, err) = node.kubectl(&[
        "get",
        "mutatingwebhookconfiguration",
        "podlock",
        "-o",
        "jsonpath={.webhooks[0].clientConfig.service.name} {.webhooks[0].clientConfig.url} {.webhooks[0].clientConfig.caBundle}",
    ]);
    assert!(ok, "{err}");
    let parts: Vec<&str> = out.split(' ').collect();
    assert_eq!(parts[0], "podlock-webhook", "clientConfig: {out}");
    assert!(parts[1].is_empty(), "a URL is registered: {out}");
    assert!(
        parts.get(2).is_some_and(|ca| ca.len() > 100),
        "no caBundle: {out}"
    );
}

/// `helm uninstall` of the release, waiting up to 2 minutes.
fn helm_uninstall(node: &Node) {
    let args = [
        "uninstall",
        "podlock",
        "-n",
        "podlock",
        "--wait",
        "--timeout",
        "2m",
    ];
    let (ok, out, err) = node.helm(&args);
    assert!(ok, "helm uninstall: {out}{err}");
}

/// `helm uninstall` leaves nothing of podlock behind.
fn uninstall(node: &Node) {
    helm_uninstall(node);
    let (_, pvcs, _) = node.kubectl(&["get", "pvc", "-n", "podlock", "-o", "name"]);
    // A StatefulSet's claims outlive it by design (Helm does not own them): delete them as a user would.
    for pvc in pvcs.lines() {
        node.kubectl(&["delete", "-n", "podlock", pvc, "--wait=true"]);
    }
    for (what, args) in [
        (
            "webhook configuration",
            vec!["get", "mutatingwebhookconfiguration", "-o", "name"],
        ),
        (
            "objects in namespace podlock",
            vec![
                "get",
                "all,secrets,configmaps,leases,pvc",
                "-n",
                "podlock",
                "-o",
                "name",
            ],
        ),
        (
            "cluster roles",
            vec!["get", "clusterrole,clusterrolebinding", "-o", "name"],
        ),
    ] {
        let left = common::node::retry(std::time::Duration::from_secs(60), || {
            let (_, out, _) = node.kubectl(&args);
            let left: Vec<&str> = out
                .lines()
                .filter(|l| l.contains("podlock") || what.starts_with("objects"))
                .filter(|l| !l.contains("kube-root-ca.crt") && !l.contains("service/kubernetes"))
                .collect();
            left.is_empty().then_some(()).ok_or_else(|| left.join(", "))
        });
        assert!(left.is_ok(), "helm uninstall left {what}: {}", left.unwrap_err());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_chart_runs_on_a_real_node_and_hands_locks_on() {
    let Some(node) = Node::start(common::podlock_bin()).await else {
        return;
    };
    let (_, nodes, _) = node.kubectl(&["get", "nodes", "-o", "wide"]);
    eprintln!("{nodes}");
    // On the chart's previous etcd, upgraded under a live hold once a worker holds.
    install(&node, &etcd_upgrade::first_image(&node), &[]);
    assert_webhook_through_service(&node);
    let client = node.client().await;
    workload::deploy(&node).await;
    etcd_upgrade::the_bundled_etcd_upgrades_under_a_live_hold(&node);
    isolation::a_namespace_cannot_touch_anothers_keys_nor_anyone_etcd_without_credentials(&node);
    network_policy::etcd_admits_only_this_releases_sidecars_and_the_operator(&node);
    holder_service::the_service_follows_the_holder(&node, &client).await;
    let holder = fence::any_pod_checks_the_holders_token(&node);
    multi::a_pod_takes_two_locks_as_one(&node, &holder);
    deadline::a_hold_ends_at_its_deadline_and_the_next_pod_is_granted(&node, &holder);
    yielding::a_holder_asked_to_yield_is_told_then_ended_and_the_next_pod_is_granted(&node, &holder);
    workload::pod_deletion_hands_the_lock_on(&node, &client).await;
    workload::app_crash_ends_the_hold(&node).await;
    lifecycle::helm_upgrade_reaches_new_pods(&node);
    lifecycle::an_app_ignoring_sigterm_keeps_its_hold_until_killed(&node);
    lifecycle::sidecar_kill_ends_the_hold(&node);
    injection::a_pod_the_webhook_could_not_reach_is_a_warning_within_seconds(&node);
    workload::remove(&node).await;
    helm_test::helm_test_fails_naming_etcd_while_it_is_down(&node);
    uninstall_and_install_again(&node);
}

/// `helm uninstall` with locks held leaves nothing waiting for the operator, an install again
/// on fresh etcd volumes, with the bundled etcd's Secrets made once and named (GitOps), gives a
/// kept namespace working credentials ([`uninstall`]); an uninstall keeping the volumes and an
/// install over them keeps the locks ([`gitops`]), and the last uninstall leaves nothing.
fn uninstall_and_install_again(node: &Node) {
    let old_secret = uninstall::locks_held_in_two_namespaces(node);
    uninstall(node);
    uninstall::nothing_is_left_waiting_for_the_operator(node, &old_secret);
    gitops::make_the_secrets(node);
    install(node, &node.images["ETCD_IMAGE"], &gitops::VALUES);
    let held = uninstall::the_kept_namespace_locks_again(node);
    gitops::an_install_over_kept_volumes_keeps_the_locks(node, &held);
    gitops::delete_the_secrets(node);
    uninstall(node);
    uninstall::no_secret_of_podlocks_is_left(node, "the second helm uninstall");
}
