#!/usr/bin/env bash
# Renders the chart's Grafana dashboard (charts/podlock/dashboards/podlock.json) from a real run,
# to docs/dashboard.png: a local etcd and control plane, the operator, four "pods" (sidecars as
# local processes, as in scripts/demo-processes.sh) contending for two locks, and Prometheus
# scraping them every second. Near the end one pod dies while holding (its Pod is deleted: the
# operator ends its hold), and one worker misses its heartbeat now and then (a lost hold).
# Then scripts/dashboard_plot.py asks Prometheus's HTTP API for every panel's query and plots them.
#
#   bash scripts/dashboard.sh [OUT.png]     (DURATION=seconds of workload, default 150)
#
# Needs scripts/setup.sh --kubernetes (it builds prometheus); makes a Python venv with matplotlib
# in $PODLOCK_CACHE/plot-venv. Leaves nothing running.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-docs/dashboard.png}")
duration=${DURATION:-150}

step() { printf '\033[1m[dashboard]\033[0m %s\n' "$*" >&2; }
BIN=$(bash scripts/setup.sh --kubernetes 2>/dev/null | tail -n1)
CACHE=$(dirname "$BIN")
if ! "$CACHE/plot-venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
  step "making a Python venv with matplotlib in $CACHE/plot-venv"
  python3 -m venv "$CACHE/plot-venv"
  "$CACHE/plot-venv/bin/pip" install -q 'matplotlib==3.11.2'
fi
step "building podlock"
cargo build --locked --bin podlock --quiet
PODLOCK=$PWD/target/debug/podlock

. scripts/local-processes.sh
background() { "$@" & pids+=($!); disown $!; }

start_control_plane

step "starting the operator; locks demo/jobs (short holds) and demo/reports (longer ones)"
k apply -f crds/ >/dev/null
k create namespace demo >/dev/null
op_port=$(free_port)
start_operator "127.0.0.1:$op_port"
k apply -f - >/dev/null <<YAML
apiVersion: podlock.io/v1alpha1
kind: DistributedLock
metadata: {name: jobs, namespace: demo}
spec: {ttlSeconds: 10}
---
apiVersion: podlock.io/v1alpha1
kind: DistributedLock
metadata: {name: reports, namespace: demo}
spec: {ttlSeconds: 10}
YAML

step "starting four pods' sidecars (Pods in the API, processes here) and Prometheus"
declare -A addr sidecar
targets=""
for pod in worker-1 worker-2 worker-3 worker-4; do
  k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $pod, namespace: demo}
spec: {containers: [{name: app, image: "example/worker:1"}]}
YAML
  run_pod "$pod"
  # What the PodMonitor's target labels would be.
  targets+="  - job_name: $pod
    scrape_interval: 1s
    static_configs: [{targets: ['${addr[$pod]#http://}'], labels: {namespace: demo, pod: $pod}}]
"
done
prom_port=$(free_port)
cat >"$work/prometheus.yml" <<YAML
scrape_configs:
  - job_name: operator
    scrape_interval: 1s
    honor_labels: true # as the chart's ServiceMonitor: the lock's namespace label wins
    static_configs: [{targets: ['127.0.0.1:$op_port']}]
$targets
YAML
background "$BIN/prometheus" --config.file "$work/prometheus.yml" --storage.tsdb.path "$work/tsdb" \
  --web.listen-address "127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1
PROM=http://127.0.0.1:$prom_port
for pod in "${!addr[@]}"; do until curl -sf "${addr[$pod]}/readyz" >/dev/null; do sleep 0.1; done; done
until curl -sf "$PROM/-/ready" >/dev/null; do sleep 0.2; done

# A worker loop: acquire LOCK (waiting up to 30 s), hold a random time between MIN and MAX ms,
# release. With MISS=N, every Nth hold has a 2 s heartbeat window and overruns it (a lost hold).
work_loop() {
  local a=$1 lock=$2 min=$3 max=$4 miss=${5:-0} n=0 opts ms
  while true; do
    n=$((n + 1)) opts='{"waitSeconds":30}' ms=$((min + RANDOM % (max - min)))
    if [ "$miss" -gt 0 ] && [ $((n % miss)) = 0 ]; then
      opts='{"waitSeconds":30,"heartbeatTimeoutSeconds":2}' ms=3500
    fi
    curl -sf -XPOST "$a/v1/locks/$lock/acquire" -d "$opts" >/dev/null || { sleep 0.2; continue; }
    sleep "$(bc -l <<<"$ms / 1000")"
    curl -s -XPOST "$a/v1/locks/$lock/release" >/dev/null || true
  done
}
start=$(date +%s)
step "four pods contend for ${duration} s"
for pod in "${!addr[@]}"; do
  miss=0
  [ "$pod" = worker-3 ] && miss=3
  background work_loop "${addr[$pod]}" jobs 50 400
  background work_loop "${addr[$pod]}" reports 500 3000 "$miss"
done
sleep $((duration * 2 / 3))
step "worker-4 dies while holding: its sidecar is killed, its Pod deleted"
until curl -s "${addr[worker-4]}/v1/locks" | grep -q '"held"'; do sleep 0.05; done
kill -9 "${sidecar[worker-4]}"
k delete pod worker-4 -n demo --wait=false >/dev/null
sleep $((duration - duration * 2 / 3))
end=$(date +%s)

step "rendering every panel's query from Prometheus to $out"
"$CACHE/plot-venv/bin/python" scripts/dashboard_plot.py "$PROM" "$start" "$end" \
  charts/podlock/dashboards/podlock.json "$out"
