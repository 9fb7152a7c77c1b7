//! Checkov, a security scanner, over the rendered chart (default values, and the bundled etcd):
//! every finding is fixed or accepted with its reason in `charts/podlock/checkov-skips.txt`. A
//! new finding fails, and so does an accepted one that no longer occurs (its line is stale).

use std::collections::BTreeSet;
use std::process::Command;

use super::{CHART, render};
use crate::common::bin_dir;

/// A finding: the check's id and the resource as `kind.namespace.name`.
type Finding = (String, String);

/// Checkov's findings on `rendered`, and how many checks passed.
fn scan(rendered: &str) -> (BTreeSet<Finding>, u64) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("chart.yaml"), rendered).unwrap();
    let out = Command::new(bin_dir().join("checkov"))
        .args([
            "-f",
            "chart.yaml",
            "--framework",
            "kubernetes",
            "--quiet",
            "--compact",
        ])
        .args(["-o", "json"])
        .current_dir(dir.path())
        .output()
        .expect("checkov: run scripts/setup.sh --kubernetes");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("checkov's report ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    let failed = report["results"]["failed_checks"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let findings = failed.iter().map(|c| {
        // A pod of a Deployment is named after its labels too: kind.namespace.name is enough.
        let resource = c["resource"]
            .as_str()
            .unwrap()
            .split('.')
            .take(3)
            .collect::<Vec<_>>();
        (c["check_id"].as_str().unwrap().to_string(), resource.join("."))
    });
    (
        findings.collect(),
        report["summary"]["passed"].as_u64().unwrap_or(0),
    )
}

/// The accepted findings.
fn accepted() -> BTreeSet<Finding> {
    let text = std::fs::read_to_string(format!("{CHART}/checkov-skips.txt")).unwrap();
    let lines = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty());
    let parse = |line: &str| {
        let (finding, why) = line.split_once(" | ").expect("CHECK RESOURCE | why");
        assert!(!why.trim().is_empty(), "no reason given: {line}");
        let (check, resource) = finding.split_once(' ').expect("CHECK RESOURCE");
        (check.to_string(), resource.trim().to_string())
    };
    lines.map(parse).collect()
}

#[test]
fn checkov_finds_nothing_but_what_is_accepted_with_its_reason() {
    let mut found = BTreeSet::new();
    for (values, extra) in [
        ("default values", &[][..]),
        ("the bundled etcd", &["--set", "etcd.bundled.enabled=true"][..]),
    ] {
        let (findings, passed) = scan(&render(extra));
        println!("checkov, {values}: {passed} passed, {} failed", findings.len());
        found.extend(findings);
    }
    let accepted = accepted();
    let new: Vec<_> = found.difference(&accepted).collect();
    assert!(
        new.is_empty(),
        "checkov's new findings (fix them, or accept them with a reason): {new:?}"
    );
    let stale: Vec<_> = accepted.difference(&found).collect();
    assert!(
        stale.is_empty(),
        "accepted findings that no longer occur (remove their lines): {stale:?}"
    );
}
