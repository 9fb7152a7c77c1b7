#!/usr/bin/env bash
# Builds the container images the node runs, as OCI archives, without Docker or a registry
# (none is reachable here): scripts/oci-image.py packs host files into one layer each.
#
#   scripts/images.sh OUTDIR [PODLOCK_BINARY]     (default: target/release/podlock)
#
#   localhost/podlock:VERSION    what the Dockerfile describes: /usr/local/bin/podlock as the
#                                entrypoint, user 65532:65532, no shell; glibc and CA
#                                certificates from this Debian host instead of distroless
#   localhost/pause:3.10         the pod sandbox (scripts/images/pause.c, static)
#   localhost/etcd:ETCD_VERSION  the chart's bundled etcd: $PODLOCK_CACHE/bin/etcd (and etcdctl)
#   localhost/etcd:PRIOR_VERSION each etcd an upgrade from the chart's previous one passes
#                                through on its way to ETCD_VERSION (bin/etcd-PRIOR_VERSION, from
#                                setup.sh with the test tools), when all of them are there
#   localhost/podlock-demo-app:1 an app with a shell, httpd and curl (Debian's busybox-static, curl)
#
# Writes OUTDIR/NAME.tar per image and OUTDIR/images.env (PODLOCK_IMAGE=..., ETCD_IMAGE=...,
# PAUSE_IMAGE=..., APP_IMAGE=..., and ETCD_HOP_IMAGES=OLDEST,...,NEWEST: the upgrade path's
# images, oldest first). Each image is rebuilt every run: that takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:?usage: images.sh OUTDIR [PODLOCK_BINARY]}")
podlock=$(realpath "${2:-target/release/podlock}")
BIN="${PODLOCK_CACHE:-$HOME/.cache/podlock}/bin"
mkdir -p "$out"
step() { printf '\033[1m[images]\033[0m %s\n' "$*" >&2; }
for f in "$podlock" "$BIN/etcd" /bin/busybox /usr/bin/curl /etc/ssl/certs/ca-certificates.crt; do
  [ -e "$f" ] || { echo "images: no $f (scripts/setup.sh --node installs what is missing)" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The users and name lookup of distroless's nonroot image.
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$work/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$work/group"
printf 'hosts: files dns\n' >"$work/nsswitch.conf"
base=(--file "$work/passwd:/etc/passwd" --file "$work/group:/etc/group"
  --file "$work/nsswitch.conf:/etc/nsswitch.conf"
  --file /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt
  --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
  --dir /tmp:1777:0 --dir /home/nonroot:755:65532)

version=$("$podlock" --version | awk '{print $2}')
step "localhost/podlock:$version from $podlock (debug info stripped)"
strip -o "$work/podlock" "$podlock"
python3 scripts/oci-image.py "$out/podlock.tar" "localhost/podlock:$version" "${base[@]}" \
  --file "$work/podlock:/usr/local/bin/podlock" --libs-of /usr/local/bin/podlock \
  --entrypoint /usr/local/bin/podlock --user 65532:65532

step "localhost/pause:3.10 from scripts/images/pause.c"
gcc -static -Os -s -o "$work/pause" scripts/images/pause.c
python3 scripts/oci-image.py "$out/pause.tar" localhost/pause:3.10 \
  --file "$work/pause:/pause" --entrypoint /pause --user 65535:65535

# etcd_image NAME VERSION SERVER [OCI-IMAGE ARGS...]: localhost/etcd:VERSION as OUTDIR/NAME.tar.
etcd_image() {
  local name=$1 version=$2 server=$3
  shift 3
  step "localhost/etcd:$version from $server"
  python3 scripts/oci-image.py "$out/$name.tar" "localhost/etcd:$version" "${base[@]}" \
    --file "$server:/usr/local/bin/etcd" --libs-of /usr/local/bin/etcd \
    --entrypoint /usr/local/bin/etcd --user 65532:65532 "$@"
}
etcd_version=$(cat "$BIN/.etcd.version")
etcd_image etcd "$etcd_version" "$BIN/etcd" --file "$BIN/etcdctl:/usr/local/bin/etcdctl"
# The upgrade path from the chart's previous etcd (setup.sh's PRIOR_ETCD_VERSIONS, built with
# the test tools): server only, as the chart's probes ask over HTTPS and nothing execs etcdctl
# in a member before the path ends. Without every server (a --demo-only setup), none.
# shellcheck disable=SC2016 # matches setup.sh's literal ${...}
listed=$(sed -n 's/^PRIOR_ETCD_VERSIONS="${PRIOR_ETCD_VERSIONS:-\(.*\)}"$/\1/p' scripts/setup.sh)
read -ra prior <<<"${PRIOR_ETCD_VERSIONS:-$listed}"
hops=()
for v in "${prior[@]}"; do
  [ -x "$BIN/etcd-$v" ] || { step "no $BIN/etcd-$v: no images of the upgrade path"; prior=(); break; }
done
for v in "${prior[@]}"; do
  etcd_image "etcd-$v" "$v" "$BIN/etcd-$v"
  hops+=("localhost/etcd:$v")
done

step "localhost/podlock-demo-app:1 (busybox sh, httpd and curl)"
applets=()
for a in sh sleep date cat echo kill printf sed hostname true mkdir httpd; do applets+=(--symlink "/bin/$a:busybox"); done
python3 scripts/oci-image.py "$out/podlock-demo-app.tar" localhost/podlock-demo-app:1 "${base[@]}" \
  --file /bin/busybox:/bin/busybox "${applets[@]}" \
  --file /usr/bin/curl:/usr/bin/curl --libs-of /usr/bin/curl --cmd /bin/sh --user 65532:65532

cat >"$out/images.env" <<ENV
PODLOCK_IMAGE=localhost/podlock:$version
PAUSE_IMAGE=localhost/pause:3.10
ETCD_IMAGE=localhost/etcd:$etcd_version
APP_IMAGE=localhost/podlock-demo-app:1
ENV
if [ ${#hops[@]} -gt 0 ]; then
  (IFS=,; echo "ETCD_HOP_IMAGES=${hops[*]}") >>"$out/images.env"
fi
step "wrote $(cd "$out" && echo *.tar)"
