//! `helm test` checks what it claims: with the bundled etcd stopped it fails, and the test
//! pod's log names etcd as the cause (the operator's `/checkz`, asked through its Service, makes
//! a lock's round trip with the operator's credentials); with etcd back it passes again.

use std::time::Duration;

use crate::common::node::{Node, retry};
use crate::etcd_members;

/// The test pod the chart runs (`templates/tests/operator-ready.yaml`).
const TEST_POD: &str = "podlock-test-operator-ready";

/// Runs `helm test` on the release; returns whether it passed and what it printed, with the
/// test pod's log and state (a pod that passed is deleted by its hook-delete-policy).
fn helm_test(node: &Node) -> (bool, String) {
    let (ok, out, err) = node.helm(&["test", "podlock", "-n", "podlock", "--timeout", "2m"]);
    let (_, log, _) = node.kubectl(&["logs", "-n", "podlock", TEST_POD]);
    let (_, pods, _) = node.kubectl(&["get", "pods,endpoints", "-n", "podlock", "-o", "wide"]);
    let operators = crate::upgrade::operator_logs(node, 20);
    (
        ok,
        format!("{out}{err}\n{TEST_POD} logged:\n{log}\n{pods}\n{operators}"),
    )
}

/// Scales the bundled etcd to `replicas` and waits until that many members are Ready.
fn scale_etcd(node: &Node, replicas: usize) {
    let count = replicas.to_string();
    let (ok, _, err) = node.kubectl(&[
        "scale",
        "statefulset",
        "podlock-etcd",
        "-n",
        "podlock",
        "--replicas",
        &count,
    ]);
    assert!(ok, "scale etcd: {err}");
    let ready = retry(Duration::from_secs(300), || {
        let ready = "{range .items[*]}{.status.containerStatuses[0].ready}{\"\\n\"}{end}";
        let out = etcd_members(node, ready);
        let (pods, ready) = (out.lines().count(), out.lines().filter(|l| *l == "true").count());
        (pods == replicas && ready == replicas)
            .then_some(())
            .ok_or(format!("{ready} of {pods} etcd members Ready"))
    });
    ready.unwrap_or_else(|e| panic!("etcd did not come to {replicas} members: {e}"));
}

/// `helm test` passes, fails naming etcd while the bundled etcd is scaled to zero, and passes
/// again once it is back.
pub fn helm_test_fails_naming_etcd_while_it_is_down(node: &Node) {
    let (ok, said) = helm_test(node);
    assert!(ok, "helm test with etcd up: {said}");
    scale_etcd(node, 0);
    let started = std::time::Instant::now();
    let (ok, said) = helm_test(node);
    assert!(!ok, "helm test passed with etcd down: {said}");
    assert!(
        said.contains("/checkz answered 503"),
        "the operator was not the one to fail: {said}"
    );
    assert!(said.contains("etcd: "), "the failure does not name etcd: {said}");
    eprintln!(
        "helm test with etcd stopped failed after {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        said.lines()
            .rev()
            .find(|l| l.contains("/checkz"))
            .unwrap_or_default()
    );
    scale_etcd(node, 3);
    let passed = retry(Duration::from_secs(120), || match helm_test(node) {
        (true, _) => Ok(()),
        (false, said) => Err(said),
    });
    passed.unwrap_or_else(|e| panic!("helm test after etcd came back: {e}"));
}
