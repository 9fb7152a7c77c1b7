#!/usr/bin/env bash
# podlock's main job on an embedded default, without Kubernetes (yet): a local etcd, three
# "pods" (one sidecar each) whose workers contend for one lock with curl, live holder/token/
# waiter lines, then the holder's sidecar is stopped (SIGTERM) and killed (kill -9), and the
# demo prints how fast the lock moved on. Leaves nothing running.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\033[1m[demo]\033[0m %s\n' "$*" >&2; }
BIN=$(bash scripts/setup.sh)
step "building podlock (release)"
cargo build --release --quiet
PODLOCK=target/release/podlock

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }

cport=$(free_port); pport=$(free_port)
ETCD=http://127.0.0.1:$cport
step "starting etcd on $ETCD"
"$BIN/etcd" --data-dir "$work/etcd" --listen-client-urls "$ETCD" --advertise-client-urls "$ETCD" \
  --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
  --initial-cluster "default=http://127.0.0.1:$pport" >"$work/etcd.log" 2>&1 &
pids+=($!)
until curl -sf "$ETCD/health" >/dev/null; do sleep 0.1; done

$PODLOCK declare demo --ttl-seconds 3 --etcd-endpoints "$ETCD" >&2

declare -A addr sidecar
for pod in pod-a pod-b pod-c; do
  port=$(free_port)
  addr[$pod]=http://127.0.0.1:$port
  $PODLOCK sidecar --etcd-endpoints "$ETCD" --listen "127.0.0.1:$port" --pod-name "$pod" >"$work/$pod.log" 2>&1 &
  sidecar[$pod]=$!
  pids+=($!)
  disown $!  # no "Killed" notice from the shell when the demo kills it
done
for pod in pod-a pod-b pod-c; do until curl -sf "${addr[$pod]}/healthz" >/dev/null; do sleep 0.05; done; done
step "three pods, one lock 'demo' (ttlSeconds 3); each worker: acquire, work 200 ms, release"

# worker POD: acquire → log the grant → hold 200 ms → release, forever.
worker() {
  local pod=$1 a=${addr[$1]} grant token
  while true; do
    grant=$(curl -s -XPOST "$a/v1/locks/demo/acquire" -d '{"waitSeconds":30}') || { sleep 0.1; continue; }
    token=$(sed -n 's/.*"fencingToken":\([0-9]*\).*/\1/p' <<<"$grant")
    [ -n "$token" ] || { sleep 0.1; continue; }
    echo "$(now) $pod $token" >>"$work/grants"
    sleep 0.2
    curl -s -XPOST "$a/v1/locks/demo/release" >/dev/null || true
  done
}
for pod in pod-a pod-b pod-c; do worker $pod & pids+=($!); done

show() {  # one line of what `kubectl get dlock -w` will show, plus a running count
  local info holder
  info=$(curl -s "${addr[pod-c]}/v1/locks/demo")
  holder=$(sed -n 's/.*"pod":"\([^"]*\)".*/\1/p' <<<"$info")
  printf '  %-8s HOLDER=%-6s TOKEN=%-5s WAITERS=%s  grants so far: %s\n' "$(date +%T)" "${holder:-<none>}" \
    "$(sed -n 's/.*"fencingToken":\([0-9]*\),"holders".*/\1/p' <<<"$info")" \
    "$(sed -n 's/.*"waiters":\([0-9]*\).*/\1/p' <<<"$info")" "$(wc -l <"$work/grants" 2>/dev/null || echo 0)"
}
for _ in $(seq 8); do show; sleep 0.5; done

# handoff POD SIGNAL: stops POD's sidecar while it holds, prints how fast another pod got the lock.
handoff() {
  local victim=$1 sig=$2 t0 t1 line
  until [ "$(tail -n1 "$work/grants" | cut -d' ' -f2)" = "$victim" ]; do sleep 0.01; done
  t0=$(now)
  kill "-$sig" "${sidecar[$victim]}"
  until line=$(awk -v t="$t0" -v v="$victim" '$1 > t && $2 != v' "$work/grants" | head -n1) && [ -n "$line" ]; do sleep 0.01; done
  t1=$(cut -d' ' -f1 <<<"$line")
  printf 'SIG%s to the sidecar of %s → %s got the lock %.0f ms later (token %s)\n' "$sig" "$victim" \
    "$(cut -d' ' -f2 <<<"$line")" "$(echo "($t1 - $t0) * 1000" | bc -l)" "$(cut -d' ' -f3 <<<"$line")" | tee -a "$work/summary"
}
step "SIGTERM the sidecar of pod-a while it holds the lock (a pod shutting down)"
handoff pod-a TERM
for _ in $(seq 4); do show; sleep 0.5; done
step "kill -9 the sidecar of pod-b while it holds the lock (a crash: the lease TTL ends it)"
handoff pod-b KILL
for _ in $(seq 4); do show; sleep 0.5; done

echo
step "summary"
awk '{print $2}' "$work/grants" | sort | uniq -c | awk '{printf "  %s: %s grants\n", $2, $1}'
if awk 'NR>1 && $3 <= prev {bad=1} {prev=$3} END {exit bad}' "$work/grants"; then
  echo "  fencing tokens rose strictly over $(wc -l <"$work/grants") grants"
else
  echo "  ERROR: fencing tokens did not rise strictly"; exit 1
fi
sed 's/^/  /' "$work/summary"
