#!/usr/bin/env bash
# The node suite (tests/node) on the oldest Kubernetes the chart admits, as CI runs it on the
# newest (scripts/setup.sh's KUBE_VERSION). Needs root, like tests/node.
#
#   scripts/node-oldest.sh [ARGS...]    ARGS go to `cargo test --test node` (default: -- --nocapture)
#   scripts/node-oldest.sh --build-only only builds (or finds) that Kubernetes, and runs nothing
#
# OLDEST_KUBE_VERSION (default below) must be a release of the chart's floor minor, the
# `kubeVersion` of charts/podlock/Chart.yaml: raising the floor without it fails here. Its
# kube-apiserver, kube-controller-manager, kubelet, kube-scheduler and kube-proxy are built by
# scripts/setup.sh --node into a cache of their own, $OLDEST_CACHE (default
# $PODLOCK_CACHE-kube1.MINOR, i.e. ~/.cache/podlock-kube1.35), so the main cache keeps the newest;
# every other tool (etcd, helm, CoreDNS, kube-router, ...) is copied from $PODLOCK_CACHE/bin
# (default ~/.cache/podlock/bin) when that cache has it, else setup builds it too. The first run
# builds Kubernetes (15 to 25 minutes on 2 cores); later runs reuse it. The last line says
# what ran and how it ended:
#
#   oldest admitted Kubernetes v1.35.4 (chart floor 1.35.0): tests/node passed in 812 s
set -euo pipefail
cd "$(dirname "$0")/.."
OLDEST_KUBE_VERSION="${OLDEST_KUBE_VERSION:-v1.35.4}"
KUBE_CMDS="kube-apiserver kube-controller-manager kubelet kube-scheduler kube-proxy"
step() { printf '\033[1m[node-oldest]\033[0m %s\n' "$*" >&2; }

# kubeVersion: ">=1.35.0-0" -> 1.35.0
floor=$(sed -n 's/^kubeVersion: *"*>= *\([0-9][0-9.]*\).*/\1/p' charts/podlock/Chart.yaml)
[ -n "$floor" ] || { echo "node-oldest: no kubeVersion in charts/podlock/Chart.yaml" >&2; exit 1; }
minor=${OLDEST_KUBE_VERSION#v}
minor=${minor%.*}
if [ "$minor" != "${floor%.*}" ]; then
  echo "node-oldest: OLDEST_KUBE_VERSION $OLDEST_KUBE_VERSION is not of the chart's floor ${floor%.*}" \
    "(kubeVersion in charts/podlock/Chart.yaml): set it to a ${floor%.*} release" >&2
  exit 1
fi

main="${PODLOCK_CACHE:-$HOME/.cache/podlock}"
cache="${OLDEST_CACHE:-$main-kube$minor}"
mkdir -p "$cache/bin"
if [ -d "$main/bin" ]; then
  for f in "$main"/bin/* "$main"/bin/.*.version; do
    [ -e "$f" ] || continue
    name=$(basename "$f")
    skip=false
    for k in $KUBE_CMDS; do
      if [ "$name" = "$k" ] || [ "$name" = ".$k.version" ]; then skip=true; fi
    done
    if ! $skip && [ ! -e "$cache/bin/$name" ]; then cp -a "$f" "$cache/bin/$name"; fi
  done
fi

step "Kubernetes $OLDEST_KUBE_VERSION in $cache (scripts/setup.sh --node)"
KUBE_VERSION="$OLDEST_KUBE_VERSION" PODLOCK_CACHE="$cache" bash scripts/setup.sh --node >/dev/null
for k in $KUBE_CMDS; do
  got=$("$cache/bin/$k" --version | awk '{print $2}')
  [ "$got" = "$OLDEST_KUBE_VERSION" ] || { echo "node-oldest: $cache/bin/$k is $got, not $OLDEST_KUBE_VERSION" >&2; exit 1; }
done
step "kube-apiserver, kube-controller-manager, kubelet, kube-scheduler, kube-proxy: $OLDEST_KUBE_VERSION in $cache/bin"
[ "${1:-}" != --build-only ] || exit 0

[ $# -gt 0 ] || set -- -- --nocapture
start=$SECONDS
status=passed
PODLOCK_CACHE="$cache" cargo test --test node "$@" || status=FAILED
echo "oldest admitted Kubernetes $OLDEST_KUBE_VERSION (chart floor $floor): tests/node $status in $((SECONDS - start)) s"
[ "$status" = passed ]
