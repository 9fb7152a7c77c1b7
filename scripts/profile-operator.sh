#!/usr/bin/env bash
# Where the operator's CPU goes while it brings locks Ready: runs the scale benchmark's quick
# size (`cargo bench --bench scale -- --quick`: 1,000 DistributedLocks in 10 namespaces), samples
# the operator process alone with `perf record --call-graph dwarf` from its start until the
# benchmark prints "locks Ready", then prints that row and the operator's functions by the share
# of its samples spent in them and in what they call (podlock's own, the HTTP clients, JSON, the
# kernel's scheduler), so a cut can be judged on its functions and not only on the total.
#
#   scripts/profile-operator.sh
#
# Needs root (perf on another process) and Debian's linux-perf (scripts/setup.sh installs it),
# and what `scripts/setup.sh --kubernetes` installs for the benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\033[1m[profile]\033[0m %s\n' "$*" >&2; }
bash scripts/setup.sh --kubernetes >/dev/null
bench=$(scripts/bench-binary.sh scale)
out=target/profile
mkdir -p "$out"
step "the scale benchmark, quick size, the operator under perf record (199 Hz, dwarf call graphs)"
"$bench" --quick >"$out/scale-run.txt" 2>&1 &
run=$!
pid=
while [ -z "$pid" ] && kill -0 "$run" 2>/dev/null; do
  pid=$(pgrep -f 'release/podlock operator' | head -n 1 || true)
  sleep 0.1
done
[ -n "$pid" ] || { echo "the benchmark ended before its operator started: $out/scale-run.txt" >&2; exit 1; }
perf record --call-graph dwarf,16384 -F 199 -p "$pid" -o "$out/operator.data" -- sleep 3600 2>/dev/null &
rec=$!
until grep -q 'locks Ready' "$out/scale-run.txt"; do
  kill -0 "$run" 2>/dev/null || { echo "the benchmark ended before the locks were Ready" >&2; exit 1; }
  sleep 0.5
done
kill -INT "$rec"
wait "$rec" || true
grep 'locks Ready' "$out/scale-run.txt"
step "waiting for the rest of the benchmark to end (its control plane stops with it)"
wait "$run"
# Generic frames (the runtime, closures' shims, the thread's start) are left out: every sample
# passes them. `sed -n` rather than `head`, which would stop perf report with SIGPIPE.
step "the operator: share of samples in each function and what it calls (children), self"
perf report -i "$out/operator.data" --children --sort sym --stdio -g none 2>/dev/null |
  grep -E '^ +[0-9]' |
  grep -vE 'std::|core::ops|tokio::runtime|clone3|start_thread|FnOnce|poll_future|Harness|CoreStage|catch_unwind|do_call|scoped_key|block_on|Instrumented|main::|lang_start|_start|0xffff' |
  sed -n 1,30p
