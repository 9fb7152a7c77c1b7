//! `scripts/setup.sh --demo-only`: the demo's setup provides every binary the demo's scripts
//! run, and none of the tools only the tests and benchmarks use. `--list` names what a run
//! provides from the same steps that provide it, without installing anything.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// What `scripts/setup.sh ARGS` provides.
fn provides(args: &[&str]) -> BTreeSet<String> {
    let out = Command::new("bash")
        .arg("scripts/setup.sh")
        .args(args)
        .arg("--list")
        .current_dir(ROOT)
        .output()
        .expect("bash runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The binaries `script` runs from setup's directory (`$BIN/NAME`); a name a variable completes
/// (`$BIN/etcd-$v`: the upgrade path's servers, which images.sh uses only if setup built them)
/// is not one.
fn run_from_setup(script: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("scripts").join(script)).unwrap();
    let names = text.split("$BIN/").skip(1).map(|rest| {
        let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'));
        rest[..end.unwrap_or(rest.len())].to_string()
    });
    names.filter(|n| !n.is_empty() && !n.ends_with('-')).collect()
}

#[test]
fn the_demo_setup_provides_every_binary_the_demo_runs() {
    let demo = provides(&["--node", "--demo-only"]);
    for script in ["demo.sh", "control-plane.sh", "node.sh", "images.sh"] {
        let run = run_from_setup(script);
        assert!(!run.is_empty(), "{script} runs nothing from setup's directory?");
        let missing: Vec<_> = run.difference(&demo).collect();
        assert!(
            missing.is_empty(),
            "{script} runs {missing:?}, which --demo-only does not provide"
        );
    }
    let processes = provides(&["--kubernetes", "--demo-only"]);
    let missing: Vec<_> = run_from_setup("control-plane.sh")
        .into_iter()
        .filter(|b| !processes.contains(b))
        .collect();
    assert!(
        missing.is_empty(),
        "demo-processes.sh's control plane lacks {missing:?}"
    );
}

#[test]
fn the_demo_setup_builds_no_tool_of_the_tests() {
    let (all, demo) = (provides(&["--node"]), provides(&["--node", "--demo-only"]));
    assert!(demo.is_subset(&all), "{demo:?} against {all:?}");
    let left_out: BTreeSet<&str> = all.difference(&demo).map(String::as_str).collect();
    // The servers an etcd upgrade passes through (PRIOR_ETCD_VERSIONS): the tests' only.
    let upgrade_path = (all.iter().map(String::as_str)).filter(|n| n.starts_with("etcd-v"));
    let mut test_tools = BTreeSet::from([
        "checkov",
        "etcdutl",
        "hadolint",
        "javac",
        "node",
        "perf",
        "porcupine",
        "prometheus",
        "promtool",
        "redis-server",
        "schemathesis",
        "shellcheck",
    ]);
    test_tools.extend(upgrade_path);
    assert!(left_out.iter().any(|n| n.starts_with("etcd-v")), "{left_out:?}");
    assert_eq!(left_out, test_tools);
}
