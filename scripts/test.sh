#!/usr/bin/env bash
# Runs every test of podlock: installs what is missing (scripts/setup.sh --node: etcd,
# kube-apiserver, kube-controller-manager, helm, protoc, and for a real node kubelet,
# kube-scheduler, kube-proxy, CoreDNS, containerd, runc, CNI plugins), then format check, a
# ShellCheck lint of every shell script, clippy, unit tests, the integration tests on a real etcd
# and a real Kubernetes API server, and tests/node: the chart installed on a real single-node
# cluster of this machine (needs root).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\033[1m[test]\033[0m %s\n' "$*" >&2; }

bash scripts/setup.sh --node >/dev/null
step "cargo fmt --check"
cargo fmt --all -- --check
# Every shell script the repository tracks: *.sh, and any file whose first line runs a shell.
shell_scripts() {
  git ls-files | while read -r f; do
    case $f in
      *.sh) echo "$f" ;;
      *) if [ -f "$f" ] && head -n 1 "$f" | grep -qE '^#!.*[/ ](ba|da)?sh( |$)'; then echo "$f"; fi ;;
    esac
  done
}
mapfile -t scripts < <(shell_scripts)
step "shellcheck ${scripts[*]}"
shellcheck "${scripts[@]}"
step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings   # the workspace: the protocol model (tests/model) too
step "gofmt, go vet and go test of tests/linearizability (the safety run's checker)"
(cd tests/linearizability && test -z "$(gofmt -l .)" && go vet ./... && go test ./...)
step "hadolint Dockerfile"
hadolint Dockerfile
# The image cannot be built here (no Docker engine): build the binary with the Dockerfile's own
# command instead, and check it runs.
build=$(sed -n 's/^RUN \(cargo build .*\)$/\1/p' Dockerfile)
step "$build (the Dockerfile's build command)"
$build
./target/release/podlock --version
step "cargo test (unit tests, integration tests on real etcd, kube-apiserver and podlock processes, then tests/node on a real kubelet)"
cargo test
