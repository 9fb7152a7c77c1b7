#!/usr/bin/env bash
# podlock's main job, on a real single-node Kubernetes cluster of this machine: a control plane
# (scripts/control-plane.sh --node) and a node with containerd and a kubelet (scripts/node.sh),
# images built here (scripts/images.sh), `helm install` of the chart with its bundled etcd, a
# DistributedLock, and a Deployment of three curl workers that `kubectl annotate` gives the
# sidecar. The workers take turns writing to a fenced counter; the demo shows `kubectl get dlock`
# live, deletes the holder's Pod in the middle of its hold and prints how fast the lock moved on.
# Leaves nothing running and nothing of the node behind.
#
#   scripts/demo.sh               on the node (needs root)
#   scripts/demo.sh --processes   without a node: the kubelet played by local processes
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--processes" ]; then exec bash scripts/demo-processes.sh; fi
if [ "$(id -u)" != 0 ]; then
  echo "demo: a node needs root; running the demo without one (scripts/demo.sh --processes)" >&2
  exec bash scripts/demo-processes.sh
fi

step() { printf '\033[1m[demo]\033[0m %s\n' "$*" >&2; }
BIN=$(bash scripts/setup.sh --node --demo-only | tail -1)
step "building podlock (release) and the images"
cargo build --release --locked --bin podlock --quiet
work=$(mktemp -d)
node_pid="" plane_pid=""
# Leaves nothing behind, whenever it runs: at the end, on an error, or on Ctrl-C (SIGINT) or
# SIGTERM to the demo's process group at any step. The node goes first (it needs its directory
# to tear down), then the control plane, then the directory.
cleanup() {
  trap '' INT TERM # a second Ctrl-C does not cut the teardown short
  [ -z "$node_pid" ] || { kill -TERM "$node_pid" 2>/dev/null || true; wait "$node_pid" 2>/dev/null || true; }
  # node.sh tears down on SIGTERM; this catches what a node.sh that could not (killed) left.
  if [ -d "$work/cp/node" ] && ! out=$(bash scripts/node.sh down "$work/cp" 2>&1); then
    echo "$out" >&2
  fi
  # shellcheck disable=SC2046 # one pid a word: split on purpose
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'step "interrupted: tearing down"; exit 130' INT
trap 'step "terminated: tearing down"; exit 143' TERM
bash scripts/images.sh "$work/images" target/release/podlock 2>/dev/null
# shellcheck source=/dev/null # written just above by images.sh
. "$work/images/images.env"

step "starting etcd, kube-apiserver and kube-controller-manager, then the node (containerd, kubelet, kube-proxy, CoreDNS)"
bash scripts/control-plane.sh "$work/cp" --node &
plane_pid=$!
until [ -f "$work/cp/ready" ]; do
  kill -0 "$plane_pid" 2>/dev/null || { tail -20 "$work/cp"/*.log >&2; exit 1; }
  sleep 0.2
done
bash scripts/node.sh up "$work/cp" "$work/images" 2>"$work/node.log" &
node_pid=$!
until [ -f "$work/cp/node/ready" ]; do
  kill -0 "$node_pid" 2>/dev/null || { cat "$work/node.log" >&2; exit 1; }
  sleep 0.5
done
set -a
# shellcheck source=/dev/null # written by control-plane.sh
. "$work/cp/env"
set +a
k() { kubectl --kubeconfig "$KUBECONFIG" "$@"; }
k get nodes -o wide | sed 's/^/  /'

step "helm install podlock charts/podlock --set etcd.bundled.enabled=true (images $PODLOCK_IMAGE, $ETCD_IMAGE)"
"$BIN/helm" --kubeconfig "$KUBECONFIG" install podlock charts/podlock -n podlock --create-namespace \
  --set image.repository="${PODLOCK_IMAGE%:*}" --set image.tag="${PODLOCK_IMAGE##*:}" \
  --set image.pullPolicy=Never --set etcd.bundled.enabled=true --set etcd.bundled.image="$ETCD_IMAGE" \
  --wait --timeout 5m >/dev/null
k get pods -n podlock -o wide | sed 's/^/  /'

# The fenced counter runs on this machine, on the pod bridge's address, where pods reach it.
FENCED_STORE_HOST=10.244.0.1 python3 examples/fenced_store.py 8088 "$work/writes" &
step "creating DistributedLock demo/report and a Deployment of 3 curl workers (no sidecar yet)"
k create namespace demo >/dev/null
# A worker: acquire -> write to the counter with the token -> work 1 s -> release.
# shellcheck disable=SC2016 # the worker's script: it expands its variables in the pod
worker='trap "exit 0" TERM
while true; do
  if [ -z "$PODLOCK_ADDR" ]; then sleep 1 & wait $!; continue; fi
  grant=$(curl -s -XPOST "$PODLOCK_ADDR/v1/locks/report/acquire" -d "{\"waitSeconds\":30}") || true
  token=$(echo "$grant" | sed -n "s/.*\"fencingToken\":\([0-9]*\).*/\1/p")
  if [ -z "$token" ]; then sleep 0.2 & wait $!; continue; fi
  curl -s -XPOST "http://10.244.0.1:8088/increment?token=$token&writer=$(hostname)" >/dev/null
  sleep 1 & wait $!
  curl -s -XPOST "$PODLOCK_ADDR/v1/locks/report/release" >/dev/null
done'
k apply -f - >/dev/null <<YAML
apiVersion: podlock.io/v1alpha1
kind: DistributedLock
metadata: {name: report, namespace: demo}
spec: {ttlSeconds: 15}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: worker, namespace: demo}
spec:
  replicas: 3
  selector: {matchLabels: {app: worker}}
  template:
    metadata: {labels: {app: worker}}
    spec:
      containers:
        - name: app
          image: $APP_IMAGE
          imagePullPolicy: Never
          command: [/bin/sh, -c, $(python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$worker")]
YAML
k rollout status deployment/worker -n demo --timeout=120s >/dev/null
step "kubectl annotate deployment worker podlock.io/inject=true"
k annotate deployment worker -n demo podlock.io/inject=true >/dev/null
k rollout status deployment/worker -n demo --timeout=180s >/dev/null
# (pods of the old ReplicaSet may still be terminating: the ones with a deletionTimestamp)
k get pods -n demo -o jsonpath='{range .items[*]}{.metadata.name} sidecar={.spec.initContainers[0].name} app-env={.spec.containers[0].env[0].name} {.metadata.deletionTimestamp}{"\n"}{end}' |
  awk 'NF == 3 {print "  " $0}'
until [ -s "$work/writes" ]; do sleep 0.2; done

step "three pods contend; what \`kubectl get dlock\` shows, plus the fenced counter:"
show() {
  printf '  %s  %s   counter=%s\n' "$(date +%T)" \
    "$(k get dlock report -n demo --no-headers -o custom-columns=HOLDER:.status.holders[0].pod,WAITERS:.status.waiters,TOKEN:.status.fencingToken 2>/dev/null | tr -s ' ')" \
    "$(curl -s http://10.244.0.1:8088/ | sed -n 's/.*"value": \([0-9]*\).*/\1/p')"
}
printf '  %-8s  HOLDER WAITERS TOKEN\n' TIME
for _ in $(seq 8); do show; sleep 0.5; done

step "deleting the holder's Pod in the middle of its 1 s hold"
n=$(wc -l <"$work/writes")
until [ "$(wc -l <"$work/writes")" -gt "$n" ]; do sleep 0.005; done # a fresh grant: its pod holds now
holder=$(tail -n1 "$work/writes" | cut -d' ' -f3)
t0=$(date +%s.%N)
k delete pod "$holder" -n demo --wait=false >/dev/null
until line=$(awk -v t="$t0" -v v="$holder" '$1 > t && $3 != v' "$work/writes" | head -n1) && [ -n "$line" ]; do sleep 0.01; done
moved=$(echo "($(cut -d' ' -f1 <<<"$line") - $t0) * 1000" | bc -l)
for _ in $(seq 4); do show; sleep 0.5; done

echo
step "summary"
awk '{print $3}' "$work/writes" | sort | uniq -c | awk '{printf "  %s: %s grants\n", $2, $1}'
if awk 'NR>1 && $2 <= prev {bad=1} {prev=$2} END {exit bad}' "$work/writes"; then
  echo "  fencing tokens rose strictly over $(wc -l <"$work/writes") grants"
else
  echo "  ERROR: fencing tokens did not rise strictly"; exit 1
fi
curl -s http://10.244.0.1:8088/ | sed 's/^/  fenced counter: /'; echo
printf '  deleted the holder pod %s: %s got the lock %.0f ms later (from the kubectl call; hold 1 s, lock TTL 15 s)\n' \
  "$holder" "$(cut -d' ' -f3 <<<"$line")" "$moved"
for ip in $(k get pods -n podlock -l app.kubernetes.io/component=podlock-operator -o jsonpath='{.items[*].status.podIP}'); do
  curl -s "http://$ip:8080/metrics" | grep -E '^podlock_(forced_releases_total\{.* [1-9][0-9]*$|operator_leader )' | sed "s/^/  operator $ip: /" || true
done
step "helm uninstall podlock, then tearing the node down"
"$BIN/helm" --kubeconfig "$KUBECONFIG" uninstall podlock -n podlock --wait >/dev/null
