#!/usr/bin/env bash
# Regenerates the generated files; tests/integration/chart/served.rs fails when they drift:
#   crds/distributedlock.yaml, charts/podlock/crds/   from `podlock crd`
#   manifests/podlock.yaml, manifests/rbac.yaml       from `helm template` of the chart
# manifests/podlock.yaml is rendered for the oldest Kubernetes the chart admits (its
# kubeVersion), so that it applies on every admitted cluster, and without Helm's hooks: the `helm
# test` objects (a Pod that runs once, and its NetworkPolicy), which only `helm test` runs, and
# the pre-delete hook (a Job that stops the operator), which only `helm uninstall` runs. manifests/rbac.yaml,
# the operator's RBAC alone (with the Secret policy), is rendered for the Kubernetes the tests
# run.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(bash scripts/setup.sh --kubernetes)
# kubeVersion: ">=1.35.0-0" -> 1.35.0
FLOOR_VERSION=$(sed -n 's/^kubeVersion: *"*>= *\([0-9][0-9.]*\).*/\1/p' charts/podlock/Chart.yaml)
[ -n "$FLOOR_VERSION" ] || { echo "gen-manifests: no kubeVersion in charts/podlock/Chart.yaml" >&2; exit 1; }
cargo run --quiet -- crd >crds/distributedlock.yaml
cp crds/distributedlock.yaml charts/podlock/crds/distributedlock.yaml
KUBE_VERSION=1.37.0 # what tests/integration/chart/mod.rs renders for
# The chart refuses to render without an etcd: the manifests name the one README.md describes.
render() {
  "$BIN/helm" template podlock charts/podlock --namespace podlock --skip-tests --no-hooks \
    --set 'etcd.endpoints[0]=http://etcd.podlock.svc:2379' "$@"
}
{
  printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: podlock\n---\n'
  render --kube-version "$FLOOR_VERSION" --include-crds
} >manifests/podlock.yaml
render --kube-version "$KUBE_VERSION" --show-only templates/rbac.yaml >manifests/rbac.yaml
echo "regenerated crds/, charts/podlock/crds/ and manifests/ (podlock.yaml for Kubernetes $FLOOR_VERSION+)" >&2
