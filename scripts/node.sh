#!/usr/bin/env bash
# A real single-node worker for the control plane of `scripts/control-plane.sh DIR --node`:
# containerd (Debian's, CRI built in) with runc, the bridge CNI plugin, CoreDNS, kubelet,
# kube-proxy (iptables mode), kube-scheduler and kube-router's NetworkPolicy controller, so that
# Pods really run on this machine.
#
#   scripts/node.sh up DIR [IMAGES_DIR]   runs in the foreground until SIGTERM or SIGINT, then
#                                         tears down; imports IMAGES_DIR/*.tar (scripts/images.sh)
#   scripts/node.sh down DIR              tears down what an `up` on DIR left (e.g. after kill -9)
#
# When the node is Ready it writes DIR/node/env (CONTAINERD_ADDRESS=..., NODE_NAME=...) and then
# DIR/node/ready. Logs go to DIR/node/*.log. Binaries come from scripts/setup.sh --node.
#
# All traffic stays on this machine. Pods live on the bridge podlock0 (10.244.0.0/24, made here;
# no outbound NAT), Services on 10.0.0.0/24 are routed to that bridge, CoreDNS answers only for
# cluster.local (it forwards nothing), and forwarding is allowed only from the bridge to the
# bridge: a pod's packet to any other address is dropped. Tear-down removes every process,
# mount, network namespace, the bridge, the iptables rules and chains of kubelet, kube-proxy
# and CNI, kube-router's chains and sets, every process left in the pods' cgroups and
# the cgroups, and restores net.ipv4.ip_forward. Its components run in sessions of their own: a
# Ctrl-C reaches only the scripts, which tear down in order.
set -euo pipefail
cmd=${1:-}
dir=$(realpath -m "${2:?usage: node.sh up|down DIR [IMAGES_DIR]}")
state="$dir/node"
BIN="${PODLOCK_CACHE:-$HOME/.cache/podlock}/bin"
BRIDGE=podlock0 POD_CIDR=10.244.0.0/24 GATEWAY=10.244.0.1 SERVICE_CIDR=10.0.0.0/24
VOLUMES=${PODLOCK_NODE_VOLUMES:-6}
CHAIN=PODLOCK-NODE RULE=2444 # the iptables chain and the routing rule and table of the bridge
SYSCTLS="net.ipv4.ip_forward vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes"
step() { printf '\033[1m[node]\033[0m %s\n' "$*" >&2; }

# Every process of this node: the ones started here (pidfiles, or found by their state
# directory when a pidfile is gone), and containerd's shims.
node_pids() {
  cat "$state"/*.pid 2>/dev/null || true
  pgrep -f -- "$state/" || true
}

# Every process in the pods' cgroups (containers and their children, pause), whatever became of
# containerd, its shims and the kubelet: SIGKILL until none is left.
kill_pod_processes() {
  local pids
  for _ in $(seq 50); do
    pids=$(find /sys/fs/cgroup/*/kubepods -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
    [ -z "$pids" ] && return 0
    # shellcheck disable=SC2086 # one pid a word: split on purpose
    kill -9 $pids 2>/dev/null || true
    sleep 0.1
  done
  echo "node: processes in the pods' cgroups survive SIGKILL: $pids" >&2
}

stop_processes() {
  local pids
  # kubelet first (it would restart containers), then the containers, then the rest.
  if [ -f "$state/kubelet.pid" ]; then kill "$(cat "$state/kubelet.pid")" 2>/dev/null || true; fi
  if [ -S "$state/containerd.sock" ]; then
    local ctr=(ctr --address "$state/containerd.sock" -n k8s.io)
    for t in $(timeout 10 "${ctr[@]}" tasks ls -q 2>/dev/null || true); do "${ctr[@]}" tasks kill -s SIGKILL "$t" 2>/dev/null || true; done
  fi
  pids=$(node_pids)
  # shellcheck disable=SC2086 # one pid a word: split on purpose
  if [ -n "$pids" ]; then kill $pids 2>/dev/null || true; fi
  for _ in $(seq 50); do
    pids=$(for p in $(node_pids); do [ ! -d "/proc/$p" ] || echo "$p"; done)
    [ -z "$pids" ] && break
    sleep 0.1
  done
  # shellcheck disable=SC2086 # one pid a word: split on purpose
  if [ -n "$pids" ]; then kill -9 $pids 2>/dev/null || true; fi
  kill_pod_processes
  rm -f "$state"/*.pid
}

# Removes every rule that jumps to a chain named KUBE-*, CNI-* or $CHAIN, then those chains.
remove_iptables() {
  local ipt table
  for ipt in iptables ip6tables; do
    for table in filter nat mangle; do
      "$ipt" -t "$table" -S 2>/dev/null | grep -E -- "-j (KUBE-|CNI-|$CHAIN)" | sed 's/^-A/-D/' |
        while read -r rule; do eval "$ipt -t $table $rule" 2>/dev/null || true; done || true
      for chain in $("$ipt" -t "$table" -S 2>/dev/null | sed -n "s/^-N \(\(KUBE\|CNI\)-[^ ]*\|$CHAIN\)$/\1/p" || true); do
        "$ipt" -t "$table" -F "$chain" 2>/dev/null || true
      done
      for chain in $("$ipt" -t "$table" -S 2>/dev/null | sed -n "s/^-N \(\(KUBE\|CNI\)-[^ ]*\|$CHAIN\)$/\1/p" || true); do
        "$ipt" -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
}

down() {
  step "tearing down the node in $state"
  stop_processes
  # Network namespaces of our pods: those with an address in the pod range.
  for ns in $(ip netns list 2>/dev/null | awk '/^cni-/ {print $1}'); do
    if ip netns exec "$ns" ip -4 -o addr show 2>/dev/null | grep -q " ${GATEWAY%.*}\."; then
      ip netns delete "$ns"
    fi
  done
  # Mounts under DIR (containers' root filesystems, shm, kubelet's secret volumes): deepest first.
  awk -v d="$dir/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  ip link delete "$BRIDGE" 2>/dev/null || true
  ip rule del priority "$RULE" 2>/dev/null || true
  ip route flush table "$RULE" 2>/dev/null || true
  remove_iptables
  remove_ipsets
  # Kernel settings the kubelet and the bridge plugin change, as they were before `up`.
  if [ -f "$state/sysctl.conf" ]; then
    sysctl -q -p "$state/sysctl.conf" >/dev/null
    rm -f "$state/sysctl.conf"
  fi
  for h in /sys/fs/cgroup/*/; do
    if [ -d "$h/kubepods" ]; then find "$h/kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null || true; fi
  done
  local left
  left=$(node_pids; ip link show "$BRIDGE" 2>/dev/null | head -1; ls -d /sys/fs/cgroup/*/kubepods 2>/dev/null
    ipset list -n 2>/dev/null | grep -E '^(KUBE-|kube-router)' || true)
  [ -z "$left" ] || { echo "node: left behind: $left" >&2; return 1; }
  step "node torn down"
}

# The bridge and what keeps its traffic on this machine: packets from the bridge are routed only
# to the bridge (or delivered locally), and forwarding is allowed from the bridge to the bridge only.
network() {
  step "network: bridge $BRIDGE $GATEWAY/24, Services $SERVICE_CIDR routed to it, nothing routed off the machine"
  for k in $SYSCTLS; do echo "$k = $(sysctl -n "$k")"; done >"$state/sysctl.conf"
  ip link add "$BRIDGE" type bridge
  ip addr add "$GATEWAY/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  ip route add "$SERVICE_CIDR" dev "$BRIDGE"
  ip route add "$POD_CIDR" dev "$BRIDGE" table "$RULE"
  ip route add unreachable default table "$RULE"
  ip rule add iif "$BRIDGE" lookup "$RULE" priority "$RULE"
  iptables -N "$CHAIN"
  iptables -A "$CHAIN" -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
  iptables -A "$CHAIN" -j DROP
  iptables -I FORWARD 1 -j "$CHAIN"
  sysctl -qw net.ipv4.ip_forward=1 # Service traffic is DNATed from the bridge back to the bridge
  cat >"$state/cni/10-podlock.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "podlock", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$GATEWAY"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$state/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
}

# start NAME CMD...: runs CMD in the background (killed if this script dies), logging to
# $state/NAME.log, its pid in $state/NAME.pid. In a session of its own: a terminal's Ctrl-C (a
# SIGINT to the foreground process group) reaches this script, which tears down in order, and
# not containerd and the kubelet, which would die at once and orphan the pods' processes.
start() {
  local name=$1
  shift
  setsid setpriv --pdeathsig TERM "$@" >"$state/$name.log" 2>&1 &
  echo $! >"$state/$name.pid"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

containerd_up() {
  step "containerd $(containerd --version | awk '{print $3}') with runc $(runc --version | awk 'NR==1 {print $3}')"
  cat >"$state/containerd.toml" <<TOML
version = 2
root = "$state/containerd/root"
state = "$state/containerd/state"
[grpc]
  address = "$state/containerd.sock"
[ttrpc]
  address = "$state/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$state/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:3.10"
  # This machine lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj, and without this
  # every sandbox fails with "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$state/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$state/cni"
TOML
  start containerd containerd --config "$state/containerd.toml"
  until ctr --address "$state/containerd.sock" version >/dev/null 2>&1; do sleep 0.1; done
}

import_images() {
  local images=$1 tar
  [ -n "$images" ] || return 0
  for tar in "$images"/*.tar; do
    step "importing $(basename "$tar")"
    ctr --address "$state/containerd.sock" -n k8s.io images import "$tar" >/dev/null
  done
}

dns_up() {
  step "CoreDNS on $GATEWAY:53 (cluster.local only; it forwards nothing)"
  cat >"$state/Corefile" <<COREFILE
cluster.local:53 in-addr.arpa:53 {
    bind $GATEWAY
    errors
    kubernetes cluster.local in-addr.arpa {
        kubeconfig $KUBECONFIG
        pods insecure
    }
}
COREFILE
  start coredns "$BIN/coredns" -conf "$state/Corefile"
}

kubelet_up() {
  step "kubelet $("$BIN/kubelet" --version | awk '{print $2}') as node $NODE_NAME at $NODE_IP"
  cat >"$state/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$state/containerd.sock
cgroupDriver: cgroupfs
# This machine has cgroup v1 only: from 1.35 the kubelet refuses it unless told otherwise.
failCgroupV1: false
address: $NODE_IP
port: $(free_port)
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $(free_port)
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $dir/certs/kubelet-ca.crt}
authorization: {mode: AlwaysAllow}
clusterDNS: [$GATEWAY]
clusterDomain: cluster.local
resolvConf: ""
failSwapOn: false
podLogsDir: $state/pod-logs
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
YAML
  start kubelet "$BIN/kubelet" --config "$state/kubelet.yaml" --kubeconfig "$KUBECONFIG" \
    --node-ip "$NODE_IP" --root-dir "$state/kubelet" --cert-dir "$state/kubelet-pki" --v=1
}

proxy_and_scheduler_up() {
  step "kube-proxy (iptables mode) and kube-scheduler"
  start kube-proxy "$BIN/kube-proxy" --kubeconfig "$KUBECONFIG" --proxy-mode iptables \
    --hostname-override "$NODE_NAME" --cluster-cidr "$POD_CIDR" --nodeport-addresses "$NODE_IP/32" \
    --healthz-bind-address "127.0.0.1:$(free_port)" --metrics-bind-address "127.0.0.1:$(free_port)" \
    --iptables-localhost-nodeports=false --conntrack-max-per-core 0 \
    --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0
  # A StatefulSet's pod can reach the scheduler before its new PersistentVolumeClaim reaches
  # the scheduler's cache ("unbound immediate PersistentVolumeClaims. not found"); the claim's
  # arrival did not always move the pod back to the active queue, and it then waited out the
  # default 5 minutes, as long as the demo's `helm install --wait`. Retry such a pod after 10 s.
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$KUBECONFIG" \
    --authentication-kubeconfig "$KUBECONFIG" --authorization-kubeconfig "$KUBECONFIG" \
    --leader-elect=false --secure-port "$(free_port)" --bind-address 127.0.0.1 \
    --pod-max-in-unschedulable-pods-duration 10s
}

# NetworkPolicy enforcement: kube-router's network policy controller alone (no routing, no
# service proxy), a process of the node like kube-proxy, on iptables and ipset. SIG Network's
# kube-network-policies (what kind runs) needs the kernel's nftables queue expression, which
# this machine's kernel lacks (CONFIG_NFT_QUEUE). Ready once its forward chain is in place.
policies_up() {
  step "kube-router $(cat "$BIN/.kube-router.version"): NetworkPolicy enforcement only (iptables, ipset)"
  start kube-router "$BIN/kube-router" --run-firewall=true --run-router=false --run-service-proxy=false \
    --kubeconfig "$KUBECONFIG" --hostname-override "$NODE_NAME" --service-cluster-ip-range "$SERVICE_CIDR" \
    --health-port 0 --metrics-port 0
  local start=$SECONDS
  until iptables -S KUBE-ROUTER-FORWARD >/dev/null 2>&1; do
    if [ $((SECONDS - start)) -ge 60 ]; then
      echo "node: kube-router did not set up its chains within 60 s; its log ends:" >&2
      tail -20 "$state/kube-router.log" >&2
      exit 1
    fi
    sleep 0.5
  done
}

# kube-router's sets, once no rule refers to them.
remove_ipsets() {
  local set
  for set in $(ipset list -n 2>/dev/null | grep -E '^(KUBE-|kube-router)' || true); do
    ipset destroy "$set" 2>/dev/null || true
  done
}

# Volumes for PersistentVolumeClaims (the bundled etcd's): the node has no storage provisioner,
# so it offers a few hostPath PersistentVolumes of its own, without a StorageClass, which claims
# without one bind to. Writable by any user: fsGroup does not apply to hostPath.
volumes() {
  local i
  step "$VOLUMES PersistentVolumes of 1Gi (hostPath in $state/volumes)"
  for i in $(seq "$VOLUMES"); do
    mkdir -p "$state/volumes/$i"
    chmod 1777 "$state/volumes/$i"
    cat <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: node-volume-$i}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: $state/volumes/$i, type: Directory}
---
YAML
  done | kubectl --kubeconfig "$KUBECONFIG" apply -f - >/dev/null
}

up() {
  local images=$1 b
  for b in kubelet kube-proxy kube-scheduler coredns kube-router; do
    [ -x "$BIN/$b" ] || { echo "node: no $BIN/$b: run scripts/setup.sh --node" >&2; exit 1; }
  done
  for b in containerd runc ctr iptables ipset /usr/lib/cni/bridge; do
    command -v "$b" >/dev/null || { echo "node: no $b: run scripts/setup.sh --node" >&2; exit 1; }
  done
  [ -f "$dir/env" ] || { echo "node: no $dir/env: start scripts/control-plane.sh $dir --node first" >&2; exit 1; }
  set -a
  # shellcheck source=/dev/null # written by control-plane.sh
  . "$dir/env"
  set +a
  [ -f "$dir/certs/kubelet-ca.crt" ] || { echo "node: the control plane in $dir was not started with --node" >&2; exit 1; }
  NODE_NAME=$(hostname | tr '[:upper:]' '[:lower:]')
  if [ -e "$state" ]; then down; fi # what a killed earlier run left
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    echo "node: the bridge $BRIDGE exists: another node runs on this machine, or a killed one left" \
      "it (scripts/node.sh down ITS_DIR removes what it left)" >&2
    exit 1
  fi
  mkdir -p "$state/cni"
  trap down EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
  network
  containerd_up
  import_images "$images"
  dns_up
  kubelet_up
  proxy_and_scheduler_up
  step "waiting for node $NODE_NAME to be Ready"
  until [ "$(kubectl --kubeconfig "$KUBECONFIG" get node "$NODE_NAME" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; do
    for b in "$state"/*.pid; do
      [ -d "/proc/$(cat "$b")" ] || { echo "node: $(basename "$b" .pid) died; its log ends:" >&2; tail -20 "${b%.pid}.log" >&2; exit 1; }
    done
    sleep 0.5
  done
  volumes
  policies_up
  printf 'CONTAINERD_ADDRESS=%s\nNODE_NAME=%s\nNODE_IP=%s\n' "$state/containerd.sock" "$NODE_NAME" "$NODE_IP" >"$state/env"
  touch "$state/ready"
  step "node $NODE_NAME is Ready"
  wait -n || true # until a component dies or a signal comes
  echo "node: a component exited; tearing down" >&2
}

case "$cmd" in
  up) up "${3:-}" ;;
  down) down ;;
  *) echo "usage: node.sh up|down DIR [IMAGES_DIR]" >&2; exit 2 ;;
esac
