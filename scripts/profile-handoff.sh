#!/usr/bin/env bash
# Where a handoff's time goes: runs podlock alone with N contenders (default 8) for S seconds
# (default 20) under a system-wide `perf record`, then prints the CPU share of each process
# (etcd, the sidecars, the benchmark's client) and the sidecars' and etcd's hottest functions.
#
#   scripts/profile-handoff.sh [CONTENDERS] [SECONDS]
#
# Needs root (system-wide perf) and Debian's linux-perf (scripts/setup.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-8} secs=${2:-20}
step() { printf '\033[1m[profile]\033[0m %s\n' "$*" >&2; }
bash scripts/setup.sh >/dev/null
bench=$(scripts/bench-binary.sh handoff)
out=target/profile
mkdir -p "$out"
step "podlock, $n contenders, ${secs} s, under perf record -a -g (99 Hz)"
"$bench" --podlock-only "$n" "$secs" | tee "$out/run.txt" &
run=$!
sleep 3 # the sidecars start and the contenders warm up before sampling
perf record -a -g -F 99 -o "$out/perf.data" -- sleep "$((secs - 4))" 2>/dev/null
wait "$run"
# Thread names: etcd's are "etcd"; the sidecars' and the benchmark client's are both tokio's
# "tokio-runtime-w", told apart by the binary (dso) their user-space samples fall in.
# `sed -n 1,15p` rather than `head`: it reads to the end, where head would stop perf report with
# SIGPIPE and end the script (status 141) before its last section.
step "CPU share by thread name and binary (kernel time shows as [kernel.kallsyms])"
perf report -i "$out/perf.data" --sort comm,dso --stdio --no-children -g none 2>/dev/null |
  grep -E '^ +[0-9]' | sed -n 1,15p
step "the sidecars (podlock binary): hottest functions, self time"
perf report -i "$out/perf.data" --dsos podlock --sort sym --stdio --no-children -g none 2>/dev/null |
  grep -E '^ +[0-9]' | sed -n 1,15p
step "etcd: hottest functions, self time (its kernel time included)"
perf report -i "$out/perf.data" --comms etcd --sort sym --stdio --no-children -g none 2>/dev/null |
  grep -E '^ +[0-9]' | sed -n 1,15p
