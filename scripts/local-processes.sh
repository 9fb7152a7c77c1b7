# shellcheck shell=bash
# Sourced (from the repository's root) by the scripts that run podlock as local processes on a
# local control plane without a node: demo-processes.sh and dashboard.sh. Needs `step` and
# PODLOCK (the binary). Defines:
#   work, pids            a temporary directory, and processes started and disowned (no "Killed"
#                         notices); both, and every background job, are ended at exit
#   free_port, k          a free loopback port; kubectl on the control plane
#   start_control_plane   etcd, kube-apiserver, kube-controller-manager (ETCD_ENDPOINT, KUBECONFIG)
#   start_operator ADDR   the operator, its metrics on ADDR, ready to inject
#   run_pod POD [NS]      stands in for the kubelet: marks Pod NS/POD (default demo) Running and
#                         starts its sidecar; sets addr[POD] (its API) and sidecar[POD] (its pid)

work=$(mktemp -d)
pids=()
cleanup() {
  # shellcheck disable=SC2046 # one pid a word: split on purpose
  kill $(jobs -p) "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
k() { kubectl --kubeconfig "$KUBECONFIG" "$@"; }

start_control_plane() {
  step "starting etcd, kube-apiserver and kube-controller-manager"
  bash scripts/control-plane.sh "$work/cp" &
  until [ -f "$work/cp/ready" ]; do sleep 0.2; done
  set -a
  # shellcheck source=/dev/null # written by control-plane.sh
  . "$work/cp/env"
  set +a
}

start_operator() {
  local hook
  hook=$(free_port)
  "$PODLOCK" operator --etcd-endpoints "$ETCD_ENDPOINT" --listen "$1" \
    --webhook-listen "127.0.0.1:$hook" --webhook-url "https://127.0.0.1:$hook/mutate" \
    --leader-lease-seconds 3 --leader-renew-deadline-seconds 2 --leader-retry-period-seconds 1 >"$work/operator.log" 2>&1 &
  until k get mutatingwebhookconfiguration podlock -o jsonpath='{.webhooks[0].clientConfig.caBundle}' 2>/dev/null | grep -q .; do sleep 0.2; done
}

# Its app container started a minute ago, so that the operator judges it by this incarnation.
run_pod() {
  local pod=$1 ns=${2:-demo} uid port started
  started=$(date -u -d '-1 min' +%Y-%m-%dT%H:%M:%SZ)
  uid=$(k get pod "$pod" -n "$ns" -o jsonpath='{.metadata.uid}')
  k patch pod "$pod" -n "$ns" --subresource=status --type=merge -p "{\"status\":{\"phase\":\"Running\",\"containerStatuses\":[{\"name\":\"app\",\"image\":\"x\",\"imageID\":\"\",\"ready\":true,\"restartCount\":0,\"state\":{\"running\":{\"startedAt\":\"$started\"}}}]}}" >/dev/null
  port=$(free_port)
  # shellcheck disable=SC2034,SC2004 # an associative array, declared and read by the sourcing script
  addr[$pod]=http://127.0.0.1:$port
  "$PODLOCK" sidecar --etcd-endpoints "$ETCD_ENDPOINT" --listen "127.0.0.1:$port" \
    --namespace "$ns" --pod-name "$pod" --pod-uid "$uid" >"$work/$pod.log" 2>&1 &
  # shellcheck disable=SC2034,SC2004 # the same
  sidecar[$pod]=$!
  pids+=($!)
  disown $!
}
