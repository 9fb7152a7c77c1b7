#!/usr/bin/env bash
# Installs what podlock's build, tests and demo need, idempotently, with visible progress.
#
#   protoc            Debian's protobuf-compiler (etcd-client's build script needs it)
#   etcd, etcdctl     built from the Go module go.etcd.io/etcd (server/v3, etcdctl/v3)
#
# Slow builds are cached outside the repo in $PODLOCK_CACHE (default ~/.cache/podlock) and
# reused while their version matches. Prints the cache's bin directory on the last line.
set -euo pipefail

ETCD_VERSION="${ETCD_VERSION:-v3.5.17}"
CACHE="${PODLOCK_CACHE:-$HOME/.cache/podlock}"
BIN="$CACHE/bin"
mkdir -p "$BIN"

step() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

for c in cargo go; do
  command -v "$c" >/dev/null 2>&1 || { echo "setup: $c is required but not installed" >&2; exit 1; }
done
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  step "adding rustfmt and clippy"
  rustup component add rustfmt clippy >&2
fi

if ! command -v protoc >/dev/null 2>&1; then
  step "installing protoc (Debian protobuf-compiler)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq protobuf-compiler >&2
else
  step "protoc: $(protoc --version)"
fi

# build_go_cmd NAME MODULE PACKAGE: builds PACKAGE of MODULE@ETCD_VERSION into $BIN/NAME.
build_go_cmd() {
  local name=$1 module=$2 pkg=$3 stamp="$BIN/.$1.version"
  if [ -x "$BIN/$name" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$ETCD_VERSION" ]; then
    step "$name $ETCD_VERSION: cached in $BIN"
    return
  fi
  step "building $name $ETCD_VERSION from the Go module $module (about a minute)"
  local work
  work=$(mktemp -d)
  (
    cd "$work"
    go mod init podlock-build-$name >/dev/null 2>&1
    go get "$module@$ETCD_VERSION" >&2
    go build -o "$BIN/$name" "$pkg" >&2
  )
  rm -rf "$work"
  echo "$ETCD_VERSION" > "$stamp"
  step "$name built: $BIN/$name"
}

build_go_cmd etcd go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3
build_go_cmd etcdctl go.etcd.io/etcd/etcdctl/v3 go.etcd.io/etcd/etcdctl/v3

echo "$BIN"
