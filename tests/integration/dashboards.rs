//! The chart's Grafana dashboard and PrometheusRule against the real binaries: every query
//! parses and names only metrics a real sidecar and operator export (scraped after a small
//! workload made every series exist), and the alert rules pass promtool.

mod exprs;

use serde::Deserialize;
use serde_json::json;
use std::time::Duration;

use crate::chart::render;
use crate::common::kube::{Operator, with_crd};
use crate::common::{EtcdServer, Sidecar, bin_dir, wait_until};
use exprs::{dashboard_queries, exported, families, metric_names, rule_queries};
use podlock::sidecar::lost_reason::{INTENDED, alerting};

/// The `spec.groups` of the PrometheusRule the chart renders with `prometheusRule.enabled`.
fn rule_groups() -> serde_yaml::Value {
    let out = render(&["--set", "prometheusRule.enabled=true"]);
    serde_yaml::Deserializer::from_str(&out)
        .map(|doc| serde_yaml::Value::deserialize(doc).unwrap())
        .find(|doc| doc["kind"] == "PrometheusRule")
        .expect("a PrometheusRule")["spec"]["groups"]
        .clone()
}

/// Waits until the operator's metrics show `line`.
pub(crate) async fn reports(op: &Operator, line: &str) {
    reports_within(op, line, Duration::from_secs(10)).await;
}

/// Waits up to `limit` until the operator's metrics show `line`.
async fn reports_within(op: &Operator, line: &str, limit: Duration) {
    let seen = wait_until(limit, || async { op.metrics().await.contains(line) }).await;
    seen.unwrap_or_else(|e| panic!("no {line} ({e}):\n{}", op.log()));
}

#[tokio::test]
async fn every_query_names_metrics_the_binaries_export() {
    let plane = with_crd();
    let ns = plane.namespace("dashboards");
    // A pod that asked for the sidecar, created before the operator (and its webhook) was
    // there: the operator finds it at its start, and podlock_pods_without_sidecar has a series.
    let missed = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "missed", "namespace": ns, "annotations": {"podlock.io/inject": "true"}},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]}});
    let (ok, _, err) = plane.kubectl_stdin(&["apply", "-f", "-"], &missed.to_string());
    assert!(ok, "{err}");
    let op = Operator::start(plane, &ns).await;
    let lock = format!(
        "apiVersion: podlock.io/v1alpha1\nkind: DistributedLock\nmetadata: {{name: work, namespace: {ns}}}\nspec: {{}}\n"
    );
    let (ok, _, err) = plane.kubectl_stdin(&["apply", "-f", "-"], &lock);
    assert!(ok, "{err}");
    // The operator reports a lock once it has declared it in etcd.
    let series = |name: &str, n: u32| format!("{name}{{lock=\"work\",namespace=\"{ns}\"}} {n}");
    reports(&op, &series("podlock_lock_holders", 0)).await;
    let flags = ["--namespace", ns.as_str()];
    let sidecar = |pod: &'static str| Sidecar::start(&plane.etcd.endpoint, pod, &flags);
    let (a, b) = (
        sidecar("pod-a").await,
        std::sync::Arc::new(sidecar("pod-b").await),
    );
    // a holds; b waits, and is handed the lock when a releases; a's try-once is refused.
    a.must_acquire("work", json!({})).await;
    let waiter = b.clone();
    let waiting = tokio::spawn(async move { waiter.must_acquire("work", json!({"waitSeconds": 20})).await });
    reports(&op, &series("podlock_lock_waiters", 1)).await;
    assert_eq!(a.post("work", "release", json!({})).await.0, 200);
    waiting.await.unwrap();
    assert_eq!(a.post("work", "acquire", json!({"waitSeconds": 0})).await.0, 409);
    // What the new panels count: b's grant was a handoff, a's was not; a's hold ended, b's is open.
    assert_eq!(b.metric("podlock_handoffs_total").await, 1.0);
    assert_eq!(a.metric("podlock_handoffs_total").await, 0.0);
    assert_eq!(a.metric("podlock_hold_seconds_count").await, 1.0);
    assert!(b.metric("podlock_hold_age_seconds").await > 0.0);

    let without_sidecar = format!("podlock_pods_without_sidecar{{namespace=\"{ns}\"}} 1");
    reports(&op, &without_sidecar).await;
    let mut scraped = op.metrics().await;
    for s in [&a, &*b] {
        scraped.push_str(s.get("/metrics").await.1.as_str().unwrap());
    }
    let exported_families = families(&scraped);
    let mut queries = dashboard_queries();
    queries.extend(rule_queries(&rule_groups()));
    let mut missing = vec![];
    for (place, query) in &queries {
        let names = metric_names(query).unwrap_or_else(|e| panic!("{place}: {e}: {query}"));
        assert!(!names.is_empty(), "{place} selects no metric: {query}");
        missing.extend(
            names
                .into_iter()
                .filter(|n| !exported(&exported_families, n))
                .map(|n| format!("{place}: {n}")),
        );
    }
    assert!(
        missing.is_empty(),
        "not exported: {missing:#?}\nscraped:\n{scraped}"
    );
    eprintln!(
        "{} queries checked against {} exported families",
        queries.len(),
        exported_families.len()
    );
}

#[test]
fn the_alert_rules_pass_promtool_and_each_has_a_runbook() {
    let groups = rule_groups();
    let text = promtool(&groups, &["check", "rules", "podlock.rules.yaml"], &[]);
    eprintln!("{}", text.trim());
    let runbook = include_str!("../../docs/operations.md");
    let rules = groups[0]["rules"].as_sequence().unwrap();
    for rule in rules {
        let alert = rule["alert"].as_str().unwrap();
        assert!(rule["for"].is_string(), "{alert} has no `for`");
        assert!(rule["labels"]["severity"].is_string(), "{alert} has no severity");
        for key in ["summary", "description"] {
            assert!(rule["annotations"][key].is_string(), "{alert} has no {key}");
        }
        assert!(
            runbook.contains(&format!("### {alert}\n")),
            "docs/operations.md has no runbook for {alert}"
        );
    }
}

/// Runs promtool with `args` in a directory holding `groups` as `podlock.rules.yaml`, and
/// `files`; its output, or a panic with it.
fn promtool(groups: &serde_yaml::Value, args: &[&str], files: &[(&str, String)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let rules = serde_yaml::to_string(&serde_yaml::Mapping::from_iter([(
        "groups".into(),
        groups.clone(),
    )]))
    .unwrap();
    std::fs::write(dir.path().join("podlock.rules.yaml"), rules).unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let out = std::process::Command::new(bin_dir().join("promtool"))
        .args(args)
        .current_dir(dir.path())
        .output()
        .expect("promtool: run scripts/setup.sh --kubernetes");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool {args:?}: {text}");
    text
}

/// The annotations of `alert` as Prometheus fills them in for a series with `labels`.
fn annotations(groups: &serde_yaml::Value, alert: &str, labels: &[(&str, &str)]) -> serde_yaml::Value {
    let rules = groups[0]["rules"].as_sequence().unwrap();
    let rule = rules.iter().find(|r| r["alert"] == alert).expect("the alert");
    let mut filled = rule["annotations"].clone();
    for (_, text) in filled.as_mapping_mut().unwrap().iter_mut() {
        let mut t = text.as_str().unwrap().to_string();
        for (name, value) in labels {
            t = t.replace(&format!("{{{{ $labels.{name} }}}}"), value);
        }
        *text = t.into();
    }
    filled
}

/// Runs promtool's unit test of `groups`: `input_series` every 15 s, each of
/// `alert_rule_test` (eval_time, alertname, exp_alerts); its output.
fn promtool_test(
    groups: &serde_yaml::Value,
    input_series: serde_json::Value,
    alert_rule_test: serde_json::Value,
) -> String {
    let tests = serde_json::json!({
        "rule_files": ["podlock.rules.yaml"],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": input_series, "alert_rule_test": alert_rule_test}],
    });
    let tests = [("tests.yaml", serde_yaml::to_string(&tests).unwrap())];
    promtool(groups, &["test", "rules", "tests.yaml"], &tests)
}

#[test]
fn the_etcd_alert_fires_after_a_minute_of_failed_probes_and_names_the_replica() {
    let groups = rule_groups();
    let expected = annotations(&groups, "PodlockEtcdUnreachable", &[("pod", "op-0")]);
    // op-0's probes fail from the 4th scrape (45 s) on; op-1 reaches etcd throughout. Pending
    // from 45 s, the alert fires at 1m45s.
    let series = json!([
        {"series": "podlock_etcd_reachable{pod=\"op-0\"}", "values": "1 1 1 0x12"},
        {"series": "podlock_etcd_reachable{pod=\"op-1\"}", "values": "1x15"},
    ]);
    let tests = json!([
        {"eval_time": "1m30s", "alertname": "PodlockEtcdUnreachable", "exp_alerts": []},
        {"eval_time": "2m", "alertname": "PodlockEtcdUnreachable", "exp_alerts": [{
            "exp_labels": {"severity": "critical", "pod": "op-0"},
            "exp_annotations": expected,
        }]},
    ]);
    eprintln!("{}", promtool_test(&groups, series, tests).trim());
}

/// Issue #55, item 7: a hold lost unasked pages, naming its reason; one that ended as someone
/// meant (`lost_reason::INTENDED`: a deadline, a yield, an administrator's release) does not.
#[test]
fn the_lost_holds_alert_pages_only_for_unintended_ends() {
    let groups = rule_groups();
    let lost = |reason: &str| {
        let series = format!("podlock_locks_lost_total{{namespace=\"a\",lock=\"x\",reason=\"{reason}\"}}");
        json!({"series": series, "values": "0 0 0 1x10"})
    };
    let intended = INTENDED.iter().map(|r| lost(r));
    let series: Vec<_> = intended.chain(alerting().map(lost)).collect();
    let alerts: Vec<_> = alerting()
        .map(|reason| {
            let labels = [("namespace", "a"), ("lock", "x"), ("reason", reason)];
            json!({
                "exp_labels": {"severity": "warning", "namespace": "a", "lock": "x", "reason": reason},
                "exp_annotations": annotations(&groups, "PodlockLocksLost", &labels),
            })
        })
        .collect();
    let tests = json!([
        {"eval_time": "30s", "alertname": "PodlockLocksLost", "exp_alerts": []},
        {"eval_time": "1m", "alertname": "PodlockLocksLost", "exp_alerts": alerts},
    ]);
    eprintln!("{}", promtool_test(&groups, json!(series), tests).trim());
}

/// A free lock with waiters fires after `waitersStuckFor` (2m), unless a busy lock of its
/// namespace has waiters too: a multi-lock set queues on each of its locks, and waits on the
/// free one for the busy one.
#[test]
fn the_stuck_waiters_alert_leaves_a_set_waiting_for_a_busy_lock_alone() {
    let groups = rule_groups();
    let gauge = |name: &str, ns: &str, lock: &str, values: &str| json!({"series": format!("{name}{{namespace=\"{ns}\",lock=\"{lock}\"}}"), "values": values});
    let series = json!([
        // Namespace "stuck": one lock, free, with a waiter.
        gauge("podlock_lock_waiters", "stuck", "solo", "1x20"),
        gauge("podlock_lock_holders", "stuck", "solo", "0x20"),
        // Namespace "sets": a set of x and y waits on both; y is held, x free.
        gauge("podlock_lock_waiters", "sets", "x", "1x20"),
        gauge("podlock_lock_holders", "sets", "x", "0x20"),
        gauge("podlock_lock_waiters", "sets", "y", "1x20"),
        gauge("podlock_lock_holders", "sets", "y", "1x20"),
    ]);
    let labels = [("namespace", "stuck"), ("lock", "solo")];
    let tests = json!([
        {"eval_time": "1m45s", "alertname": "PodlockWaitersStuck", "exp_alerts": []},
        {"eval_time": "2m30s", "alertname": "PodlockWaitersStuck", "exp_alerts": [{
            "exp_labels": {"severity": "warning", "namespace": "stuck", "lock": "solo"},
            "exp_annotations": annotations(&groups, "PodlockWaitersStuck", &labels),
        }]},
    ]);
    eprintln!("{}", promtool_test(&groups, series, tests).trim());
}

/// Issue #55, item 3: pods that asked for the sidecar and run without it fire after a minute,
/// per namespace; a namespace whose count is back at 0 does not.
#[test]
fn the_missing_sidecar_alert_fires_per_namespace_after_a_minute() {
    let groups = rule_groups();
    let gauge = |ns: &str, values: &str| {
        let series = format!("podlock_pods_without_sidecar{{namespace=\"{ns}\"}}");
        json!({"series": series, "values": values})
    };
    // "a": two pods without their sidecar from 30 s on; "b": one for 30 s, then recreated.
    let series = json!([gauge("a", "0 0 2x12"), gauge("b", "0 1 1 0x11")]);
    let labels = [("namespace", "a")];
    let tests = json!([
        {"eval_time": "1m15s", "alertname": "PodlockPodsWithoutSidecar", "exp_alerts": []},
        {"eval_time": "1m45s", "alertname": "PodlockPodsWithoutSidecar", "exp_alerts": [{
            "exp_labels": {"severity": "warning", "namespace": "a"},
            "exp_annotations": annotations(&groups, "PodlockPodsWithoutSidecar", &labels),
        }]},
    ]);
    eprintln!("{}", promtool_test(&groups, series, tests).trim());
}

/// Issue #55, item 1: any process that found etcd below podlock's minimum fires after a minute,
/// once for the cluster (one etcd); the alert names the minimum the code checks against.
#[test]
fn the_etcd_below_minimum_alert_fires_once_after_a_minute_and_names_the_minimum() {
    let groups = rule_groups();
    let expected = annotations(&groups, "PodlockEtcdBelowMinimum", &[]);
    let minimum = podlock::lock::MINIMUM.to_string();
    for text in [&expected["summary"], &expected["description"]] {
        assert!(
            text.as_str().unwrap().contains(&minimum),
            "{text:?} does not name {minimum}"
        );
    }
    let gauge = |pod: &str, values: &str| json!({"series": format!("podlock_etcd_below_minimum{{pod=\"{pod}\"}}"), "values": values});
    // Sidecar a (started on the old etcd) reports it from 30 s on; b and the operator never.
    let series = json!([gauge("a", "0 0 1x12"), gauge("b", "0x14"), gauge("op-0", "0x14")]);
    let tests = json!([
        {"eval_time": "1m15s", "alertname": "PodlockEtcdBelowMinimum", "exp_alerts": []},
        {"eval_time": "1m45s", "alertname": "PodlockEtcdBelowMinimum", "exp_alerts": [{
            "exp_labels": {"severity": "warning"},
            "exp_annotations": expected,
        }]},
    ]);
    eprintln!("{}", promtool_test(&groups, series, tests).trim());
}

#[tokio::test]
async fn the_operator_reports_whether_etcd_answers_with_its_quorum() {
    let plane = with_crd();
    let ns = plane.namespace("etcd-reachable");
    let mut members = EtcdServer::cluster(3).await;
    // The operator talks to the first member only: the one left running when quorum is lost.
    let op = Operator::start_with(plane, &ns, &members[0].endpoint, &[]).await;
    // Probed every 5 s with 2 s to answer.
    let within = Duration::from_secs(15);
    reports_within(&op, "podlock_etcd_reachable 1", within).await;
    members[1].stop();
    members[2].stop();
    reports_within(&op, "podlock_etcd_reachable 0", within).await;
    members[1].resume().await;
    reports_within(&op, "podlock_etcd_reachable 1", within).await;
    members[0].stop();
    reports_within(&op, "podlock_etcd_reachable 0", within).await;
    assert!(
        op.log().contains("etcd does not answer"),
        "the log says so:\n{}",
        op.log()
    );
}
