#!/usr/bin/env bash
# Starts a local Kubernetes control plane the way controller-runtime's envtest does, for the
# tests and the demo: etcd, kube-apiserver (self-signed serving certificate, a service-account
# key, a static admin token in system:masters, RBAC) and kube-controller-manager, all on free
# loopback ports. No kubelet and no scheduler: whoever uses it creates Pods and sets their status.
#
#   scripts/control-plane.sh DIR
#
# Runs in the foreground until killed; its processes die with it. When the API server is ready
# it writes DIR/env (ETCD_ENDPOINT=..., KUBECONFIG=..., APISERVER=...) and then DIR/ready.
# Logs go to DIR/*.log. Binaries come from scripts/setup.sh --kubernetes.
set -euo pipefail
dir=$(realpath -m "${1:?usage: control-plane.sh DIR}")
mkdir -p "$dir/certs"
BIN="${PODLOCK_CACHE:-$HOME/.cache/podlock}/bin"
for b in etcd kube-apiserver kube-controller-manager; do
  [ -x "$BIN/$b" ] || { echo "control-plane: no $BIN/$b: run scripts/setup.sh --kubernetes" >&2; exit 1; }
done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Each child gets SIGKILL when this script dies, however it dies.
child() { setpriv --pdeathsig KILL "$@" & }
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

etcd_port=$(free_port); peer_port=$(free_port); api_port=$(free_port); kcm_port=$(free_port)
etcd="http://127.0.0.1:$etcd_port"; peer="http://127.0.0.1:$peer_port"; api="https://127.0.0.1:$api_port"
token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')

child "$BIN/etcd" --name default --data-dir "$dir/etcd" \
  --listen-client-urls "$etcd" --advertise-client-urls "$etcd" \
  --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" --initial-cluster "default=$peer" \
  >"$dir/etcd.log" 2>&1
until curl -sf "$etcd/health" >/dev/null; do sleep 0.1; done

openssl ecparam -name prime256v1 -genkey -noout -out "$dir/sa.key" 2>/dev/null
echo "$token,admin,admin,\"system:masters\"" >"$dir/tokens.csv"
child "$BIN/kube-apiserver" --etcd-servers="$etcd" --cert-dir="$dir/certs" \
  --secure-port="$api_port" --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
  --service-cluster-ip-range=10.0.0.0/24 --service-account-issuer="$api" \
  --service-account-key-file="$dir/sa.key" --service-account-signing-key-file="$dir/sa.key" \
  --token-auth-file="$dir/tokens.csv" --authorization-mode=RBAC --allow-privileged=true \
  >"$dir/kube-apiserver.log" 2>&1

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
until kubectl --kubeconfig "$dir/kubeconfig" get --raw /readyz >/dev/null 2>&1; do sleep 0.2; done

child "$BIN/kube-controller-manager" --kubeconfig="$dir/kubeconfig" \
  --service-account-private-key-file="$dir/sa.key" --leader-elect=false --controllers='*' \
  --use-service-account-credentials=false --secure-port="$kcm_port" --bind-address=127.0.0.1 \
  >"$dir/kube-controller-manager.log" 2>&1

printf 'ETCD_ENDPOINT=%s\nKUBECONFIG=%s\nAPISERVER=%s\n' "$etcd" "$dir/kubeconfig" "$api" >"$dir/env"
touch "$dir/ready"
wait
