//! docs/operations.md's support matrix says what the test runs use: the etcd, Kubernetes and
//! Helm versions `scripts/setup.sh` installs, the bundled etcd's image, the oldest Kubernetes
//! the chart admits and the release of it `scripts/node-oldest.sh` runs the node suite on. A
//! version changed in one place and not the other fails here.

use super::{read, section};

/// `NAME="${NAME:-vVERSION}"` of a script (scripts/setup.sh, scripts/node-oldest.sh): VERSION, without the `v`.
fn setup_version(setup: &str, name: &str) -> String {
    let prefix = format!("{name}=\"${{{name}:-v");
    let line = setup
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("scripts/setup.sh sets no {name}"));
    line.split('}').next().unwrap().to_string()
}

/// The matrix row of `component`: its cells.
fn row<'a>(matrix: &'a str, component: &str) -> Vec<&'a str> {
    let line = matrix
        .lines()
        .find(|l| l.starts_with(&format!("| {component} |")))
        .unwrap_or_else(|| panic!("no row {component} in the support matrix"));
    line.split('|').map(str::trim).filter(|c| !c.is_empty()).collect()
}

#[test]
fn the_support_matrix_names_the_versions_the_tests_run() {
    let setup = read("scripts/setup.sh");
    let operations = read("docs/operations.md");
    let matrix = section(&operations, "Support matrix");
    let etcd = setup_version(&setup, "ETCD_VERSION");
    for (component, version) in [
        ("etcd", etcd.clone()),
        ("Kubernetes", setup_version(&setup, "KUBE_VERSION")),
        ("Helm", setup_version(&setup, "HELM_VERSION")),
    ] {
        assert_eq!(row(matrix, component)[1], version, "{component}");
    }
    let image = format!("quay.io/coreos/etcd:v{etcd}");
    assert!(read("charts/podlock/values.yaml").contains(&format!("image: {image} ")));
    assert!(row(matrix, "etcd")[3].contains(&image), "{image}");
    let chart = read("charts/podlock/Chart.yaml");
    let floor = chart
        .lines()
        .find_map(|l| l.strip_prefix("kubeVersion: \">="))
        .expect("kubeVersion");
    let floor = floor.rsplit_once('.').unwrap().0; // 1.29.0-0 -> 1.29
    let kubernetes = row(matrix, "Kubernetes");
    assert!(kubernetes[2].starts_with(&format!("{floor} ")), "{floor}");
    // The minors the chart is rendered for: tests/integration/kube-apis.txt's.
    let apis = read("tests/integration/kube-apis.txt");
    let minors = apis.lines().filter(|l| !l.starts_with('#'));
    let newest = minors
        .filter_map(|l| l.split(' ').next())
        .max_by_key(|v| v.strip_prefix("1.").and_then(|m| m.parse::<u32>().ok()));
    let rendered = format!("from {floor} to {}", newest.unwrap());
    assert!(kubernetes[3].contains(&rendered), "{rendered}");
    // The oldest admitted release the node suite runs on (scripts/node-oldest.sh), of the floor.
    let oldest = setup_version(&read("scripts/node-oldest.sh"), "OLDEST_KUBE_VERSION");
    assert!(
        oldest.starts_with(&format!("{floor}.")),
        "{oldest} is not of {floor}"
    );
    assert!(
        kubernetes[3].contains(&format!("{oldest}, by `scripts/node-oldest.sh`")),
        "{oldest}"
    );
}
