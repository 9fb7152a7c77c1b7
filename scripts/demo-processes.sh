#!/usr/bin/env bash
# The demo without a node (`scripts/demo.sh --processes`; also where the machine cannot run
# one): podlock's main job on an embedded default: a local etcd and Kubernetes control plane, the
# operator, a DistributedLock, and an annotated Deployment whose pods (given the sidecar by the
# webhook) contend for the lock and write to a fenced counter. There is no kubelet: the demo
# stands in for it, starting each pod's sidecar and a small curl worker as local processes.
# Then it deletes the holder's Pod and prints how fast the lock moved on. Leaves nothing running.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\033[1m[demo]\033[0m %s\n' "$*" >&2; }
bash scripts/setup.sh --kubernetes --demo-only >/dev/null
step "building podlock (release)"
cargo build --release --locked --bin podlock --quiet
PODLOCK=$PWD/target/release/podlock

. scripts/local-processes.sh
now() { date +%s.%N; }

start_control_plane

step "installing the CRD and starting the operator"
k apply -f crds/ >/dev/null
k create namespace demo >/dev/null
op_metrics=127.0.0.1:$(free_port)
start_operator "$op_metrics"

store_port=$(free_port)
python3 examples/fenced_store.py "$store_port" "$work/writes" &
STORE=http://127.0.0.1:$store_port

step "creating DistributedLock demo/report and an annotated Deployment with 3 replicas"
k apply -f - >/dev/null <<YAML
apiVersion: podlock.io/v1alpha1
kind: DistributedLock
metadata: {name: report, namespace: demo}
spec: {ttlSeconds: 15}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: worker, namespace: demo, annotations: {podlock.io/inject: "true"}}
spec:
  replicas: 3
  selector: {matchLabels: {app: worker}}
  template:
    metadata: {labels: {app: worker}}
    spec: {containers: [{name: app, image: "example/worker:1"}]}
YAML
until [ "$(k get pods -n demo -l app=worker -o name | wc -l)" = 3 ]; do sleep 0.2; done
k get pods -n demo -l app=worker -o jsonpath='{range .items[*]}{.metadata.name} init={.spec.initContainers[*].name} app-env={.spec.containers[0].env[0].name}{"\n"}{end}' | sed 's/^/  /'

# Stand in for the kubelet: mark each pod Running, start its sidecar (and below, its worker).
declare -A addr sidecar worker
for pod in $(k get pods -n demo -l app=worker -o jsonpath='{.items[*].metadata.name}'); do
  run_pod "$pod"
done
for pod in "${!addr[@]}"; do until curl -sf "${addr[$pod]}/readyz" >/dev/null; do sleep 0.05; done; done

# A worker: acquire → write to the fenced counter with the token → hold 150 ms → release.
work_loop() {
  local pod=$1 a=${addr[$1]} grant token
  while true; do
    grant=$(curl -s -XPOST "$a/v1/locks/report/acquire" -d '{"waitSeconds":30}') || { sleep 0.1; continue; }
    token=$(sed -n 's/.*"fencingToken":\([0-9]*\).*/\1/p' <<<"$grant")
    [ -n "$token" ] || { sleep 0.1; continue; }
    echo "$(now) $pod $token" >>"$work/grants"
    curl -s -XPOST "$STORE/increment?token=$token&writer=$pod" >/dev/null || true
    sleep 0.15
    curl -s -XPOST "$a/v1/locks/report/release" >/dev/null || true
  done
}
for pod in "${!addr[@]}"; do
  work_loop "$pod" &
  worker[$pod]=$!
  pids+=($!)
  disown $!
done
step "three pods contend; what \`kubectl get dlock -w\` shows, plus the fenced counter:"
show() {
  printf '  %s  %s   counter=%s\n' "$(date +%T)" \
    "$(k get dlock report -n demo --no-headers -o custom-columns=HOLDER:.status.holders[0].pod,WAITERS:.status.waiters,TOKEN:.status.fencingToken 2>/dev/null | tr -s ' ')" \
    "$(curl -s "$STORE/" | sed -n 's/.*"value": \([0-9]*\).*/\1/p')"
}
printf '  %-8s  HOLDER WAITERS TOKEN\n' TIME
for _ in $(seq 8); do show; sleep 0.5; done

step "the holder's processes die (kill -9: its lease would hold the lock for 15 s), then its Pod is deleted"
n=$(wc -l <"$work/grants")
until [ "$(wc -l <"$work/grants")" -gt "$n" ]; do sleep 0.005; done # a fresh grant: its pod holds now
holder=$(tail -n1 "$work/grants" | cut -d' ' -f2)
kill -9 "${worker[$holder]}" "${sidecar[$holder]}" 2>/dev/null || true
k delete pod "$holder" -n demo --wait=false >/dev/null
t0=$(now) # the deletion has reached the API server
until line=$(awk -v t="$t0" -v v="$holder" '$1 > t && $2 != v' "$work/grants" | head -n1) && [ -n "$line" ]; do sleep 0.01; done
moved=$(echo "($(cut -d' ' -f1 <<<"$line") - $t0) * 1000" | bc -l)
for _ in $(seq 4); do show; sleep 0.5; done

echo
step "summary"
awk '{print $2}' "$work/grants" | sort | uniq -c | awk '{printf "  %s: %s grants\n", $2, $1}'
if awk 'NR>1 && $3 <= prev {bad=1} {prev=$3} END {exit bad}' "$work/grants"; then
  echo "  fencing tokens rose strictly over $(wc -l <"$work/grants") grants"
else
  echo "  ERROR: fencing tokens did not rise strictly"; exit 1
fi
curl -s "$STORE/" | sed 's/^/  fenced counter: /'; echo
printf '  deleted the holder pod %s: %s got the lock %.0f ms later (lock TTL 15 s)\n' \
  "$holder" "$(cut -d' ' -f2 <<<"$line")" "$moved"
curl -s "http://$op_metrics/metrics" | grep -E '^podlock_forced_releases_total\{.* [1-9][0-9]*$' | sed 's/^/  operator: /' || true
