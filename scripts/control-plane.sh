#!/usr/bin/env bash
# Starts a local Kubernetes control plane the way controller-runtime's envtest does, for the
# tests and the demo: etcd, kube-apiserver (self-signed serving certificate, a service-account
# key, a static admin token in system:masters, RBAC) and kube-controller-manager, all on free
# loopback ports. No kubelet and no scheduler: whoever uses it creates Pods and sets their status.
#
#   scripts/control-plane.sh DIR [--node]
#
# --node readies it for a real node (scripts/node.sh): the API server also listens on the
# machine's own non-loopback address and advertises it (so the `kubernetes` Service has an
# endpoint pods can reach; its self-signed certificate then names that address and the Service
# IP 10.0.0.1), authenticates to kubelets with a client certificate of its own small CA
# (DIR/certs/kubelet-ca.crt, which the kubelet trusts), and kube-controller-manager puts the
# API server's CA into every namespace's kube-root-ca.crt (pods' ca.crt).
#
# Runs in the foreground until killed; its processes die with it. When the API server is ready
# it writes DIR/env (ETCD_ENDPOINT=..., KUBECONFIG=..., APISERVER=...) and then DIR/ready.
# Logs go to DIR/*.log. Binaries come from scripts/setup.sh --kubernetes.
set -euo pipefail
dir=$(realpath -m "${1:?usage: control-plane.sh DIR [--node]}")
node=false
[ "${2:-}" = "--node" ] && node=true
mkdir -p "$dir/certs"
BIN="${PODLOCK_CACHE:-$HOME/.cache/podlock}/bin"
for b in etcd kube-apiserver kube-controller-manager; do
  [ -x "$BIN/$b" ] || { echo "control-plane: no $BIN/$b: run scripts/setup.sh --kubernetes" >&2; exit 1; }
done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Each child gets SIGKILL when this script dies, however it dies. In a session of its own, so
# that a terminal's Ctrl-C reaches this script and its caller, not the API server under a
# node that still tears down.
child() { setsid setpriv --pdeathsig KILL "$@" & }
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

etcd_port=$(free_port); peer_port=$(free_port); api_port=$(free_port); kcm_port=$(free_port)
etcd="http://127.0.0.1:$etcd_port"; peer="http://127.0.0.1:$peer_port"; api="https://127.0.0.1:$api_port"
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

child "$BIN/etcd" --name default --data-dir "$dir/etcd" \
  --listen-client-urls "$etcd" --advertise-client-urls "$etcd" \
  --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" --initial-cluster "default=$peer" \
  --feature-gates=LeaseCheckpoint=true,LeaseCheckpointPersist=true \
  >"$dir/etcd.log" 2>&1
until curl -sf "$etcd/health" >/dev/null; do sleep 0.1; done

openssl ecparam -name prime256v1 -genkey -noout -out "$dir/sa.key" 2>/dev/null
echo "$token,admin,admin,\"system:masters\"" >"$dir/tokens.csv"
# Without --node the API server advertises 127.0.0.1, which kube-apiserver 1.37's endpoint
# reconciler refuses ("may not be in the loopback range"; 1.34's took it): no pod needs the
# `kubernetes` Service's endpoints there, so it keeps none.
bind=127.0.0.1 advertise=127.0.0.1 node_flags=(--endpoint-reconciler-type=none) kcm_flags=()
if $node; then
  # The machine's own address: the first IPv4 address of the default route's interface.
  dev=$(ip -4 route show default | awk '{print $5; exit}')
  advertise=$(ip -4 -o addr show scope global ${dev:+dev "$dev"} | awk '{sub("/.*", "", $4); print $4; exit}')
  [ -n "$advertise" ] || { echo "control-plane: no non-loopback IPv4 address for --node" >&2; exit 1; }
  bind=0.0.0.0
  # Its self-signed certificate names the advertised address, not 127.0.0.1.
  api="https://$advertise:$api_port"
  c="$dir/certs"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=podlock-kubelet-ca -keyout "$c/kubelet-ca.key" -out "$c/kubelet-ca.crt" 2>/dev/null
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" \
    -keyout "$c/kubelet-client.key" -out "$c/kubelet-client.csr" 2>/dev/null
  openssl x509 -req -in "$c/kubelet-client.csr" -CA "$c/kubelet-ca.crt" -CAkey "$c/kubelet-ca.key" \
    -CAcreateserial -days 2 -out "$c/kubelet-client.crt" 2>/dev/null
  # shellcheck disable=SC2054 # the comma is in one flag's value (address types), not a separator
  node_flags=(--kubelet-client-certificate="$c/kubelet-client.crt" --kubelet-client-key="$c/kubelet-client.key"
    --kubelet-preferred-address-types=InternalIP,Hostname)
  kcm_flags=(--root-ca-file="$c/apiserver.crt")
fi
child "$BIN/kube-apiserver" --etcd-servers="$etcd" --cert-dir="$dir/certs" \
  --secure-port="$api_port" --bind-address="$bind" --advertise-address="$advertise" "${node_flags[@]}" \
  --service-cluster-ip-range=10.0.0.0/24 --service-account-issuer="$api" \
  --service-account-key-file="$dir/sa.key" --service-account-signing-key-file="$dir/sa.key" \
  --token-auth-file="$dir/tokens.csv" --authorization-mode=RBAC --allow-privileged=true \
  >"$dir/kube-apiserver.log" 2>&1
api_pid=$!

cat >"$dir/kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: $api
    certificate-authority: $dir/certs/apiserver.crt
users:
- name: admin
  user:
    token: $token
contexts:
- name: local
  context: {cluster: local, user: admin, namespace: default}
current-context: local
KUBECONFIG
until kubectl --kubeconfig "$dir/kubeconfig" get --raw /readyz >/dev/null 2>&1; do
  kill -0 "$api_pid" 2>/dev/null || { echo "control-plane: kube-apiserver exited; its log ends:" >&2; tail -5 "$dir/kube-apiserver.log" >&2; exit 1; }
  sleep 0.2
done

child "$BIN/kube-controller-manager" --kubeconfig="$dir/kubeconfig" \
  --service-account-private-key-file="$dir/sa.key" --leader-elect=false --controllers='*' \
  --use-service-account-credentials=false --secure-port="$kcm_port" --bind-address=127.0.0.1 \
  "${kcm_flags[@]}" \
  >"$dir/kube-controller-manager.log" 2>&1

printf 'ETCD_ENDPOINT=%s\nKUBECONFIG=%s\nAPISERVER=%s\nNODE_IP=%s\n' "$etcd" "$dir/kubeconfig" "$api" "$advertise" >"$dir/env"
touch "$dir/ready"
wait
