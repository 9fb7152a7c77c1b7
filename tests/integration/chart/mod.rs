//! The Helm chart: lint, schema-checked values, rendered objects accepted by a real API server,
//! and the generated files (`manifests/`, the chart's `crds/`) in step with their sources. One
//! file per concern; the helpers they share (running helm, rendering, reading what was rendered)
//! are here.

mod etcd;
mod knobs;
mod notes;
mod readme;
mod render;
mod scan;
mod schema;
mod served;
mod values;

use serde::Deserialize;
use std::process::Command;

use crate::common::bin_dir;

pub(crate) const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/podlock");

/// Runs helm with `args`; returns (success, stdout, stderr).
pub(crate) fn helm(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin_dir().join("helm"))
        .args(args)
        .output()
        .expect("helm: run scripts/setup.sh --kubernetes");
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

/// The cluster version charts are rendered for: the node test bed's minor (the chart admits 1.35+).
pub(crate) const KUBE_VERSION: &str = "1.37.0";

/// An external etcd, for the renderings that are not about etcd: without one, or the bundled
/// etcd, the chart refuses to render. `scripts/gen-manifests.sh` renders `manifests/` with it.
pub(crate) const EXTERNAL_ETCD: [&str; 2] = ["--set", "etcd.endpoints[0]=http://etcd.podlock.svc:2379"];

/// `helm template` of the chart as release `podlock` in namespace `podlock`, with `extra` arguments.
pub(crate) fn render(extra: &[&str]) -> String {
    render_release("podlock", "podlock", extra)
}

/// Renders the chart as release `release` in `namespace`, with [`EXTERNAL_ETCD`] unless `extra`
/// says otherwise.
pub(crate) fn render_release(release: &str, namespace: &str, extra: &[&str]) -> String {
    let mut args = vec!["template", release, CHART, "--namespace", namespace];
    args.extend(["--kube-version", KUBE_VERSION]);
    args.extend(EXTERNAL_ETCD);
    args.extend_from_slice(extra);
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm template {release} {extra:?}: {err}");
    out
}

/// The oldest Kubernetes version the chart admits, from its `kubeVersion` (`>=1.35.0-0`): 1.35.0.
pub(crate) fn floor_version() -> String {
    let chart = std::fs::read_to_string(format!("{CHART}/Chart.yaml")).unwrap();
    let floor = chart
        .lines()
        .find_map(|l| l.strip_prefix("kubeVersion: \">="))
        .expect("kubeVersion");
    floor.split(['-', '"']).next().unwrap().to_string()
}

/// The rendered documents of `rendered`, as JSON.
pub(crate) fn documents(rendered: &str) -> Vec<serde_json::Value> {
    serde_yaml::Deserializer::from_str(rendered)
        .map(|d| serde_json::Value::deserialize(d).unwrap())
        .filter(serde_json::Value::is_object)
        .collect()
}

/// The document of `kind` named `name`.
pub(crate) fn find<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// The value of the operator's environment variable `name`, if set.
pub(crate) fn operator_env(docs: &[serde_json::Value], name: &str) -> Option<String> {
    let spec = &find(docs, "Deployment", "podlock-operator")["spec"]["template"]["spec"];
    let env = spec["containers"][0]["env"].as_array().unwrap();
    let var = env.iter().find(|e| e["name"] == name)?;
    Some(var["value"].as_str().unwrap().to_string())
}
