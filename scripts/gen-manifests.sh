#!/usr/bin/env bash
# Regenerates the generated files; tests/integration/chart.rs fails when they drift:
#   crds/distributedlock.yaml, charts/podlock/crds/   from `podlock crd`
#   manifests/podlock.yaml, manifests/rbac.yaml       from `helm template` of the chart
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(bash scripts/setup.sh --kubernetes)
KUBE_VERSION=1.34.0 # what tests/integration/chart.rs renders for (the chart needs 1.29+)
cargo run --quiet -- crd >crds/distributedlock.yaml
cp crds/distributedlock.yaml charts/podlock/crds/distributedlock.yaml
{
  printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: podlock\n---\n'
  "$BIN/helm" template podlock charts/podlock --kube-version "$KUBE_VERSION" --namespace podlock --include-crds
} >manifests/podlock.yaml
"$BIN/helm" template podlock charts/podlock --kube-version "$KUBE_VERSION" --namespace podlock --show-only templates/rbac.yaml >manifests/rbac.yaml
echo "regenerated crds/, charts/podlock/crds/ and manifests/" >&2
