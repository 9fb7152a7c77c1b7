#!/usr/bin/env bash
# Where etcd's CPU per handoff goes, podlock beside the 2-writes floor: runs each alone on its
# own etcd with N contenders (default 8) for S seconds (default 20), `perf record -g` on that
# etcd only, and prints etcd's CPU per handoff in each of its activities. A sample counts in
# every activity its stack passes through, so the rows overlap; "all" is etcd's whole CPU.
#
#   scripts/profile-etcd.sh [CONTENDERS] [SECONDS]
#
# Needs root (perf on another process) and Debian's linux-perf (scripts/setup.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-8} secs=${2:-20}
hz=999
window=$((secs - 6)) # sampled: from the 4th second, ending 2 s before the run
step() { printf '\033[1m[profile-etcd]\033[0m %s\n' "$*" >&2; }
bash scripts/setup.sh >/dev/null
bench=$(scripts/bench-binary.sh handoff)
out=target/profile-etcd
mkdir -p "$out"

# profile NAME MODE: runs `$bench MODE n secs`, records its etcd for $window seconds from the
# 4th second on, and leaves the run's output in $out/NAME.txt and the stacks in $out/NAME.stacks.
profile() {
  local name=$1 mode=$2 pid=""
  step "$name: $n contenders, ${secs} s, etcd under perf record -g ($hz Hz)"
  "$bench" "$mode" "$n" "$secs" >"$out/$name.txt" &
  local run=$!
  for _ in $(seq 100); do
    pid=$(sed -n 's/.*etcd pid \([0-9]*\).*/\1/p' "$out/$name.txt")
    [ -n "$pid" ] && break
    sleep 0.1
  done
  [ -n "$pid" ] || { step "$name: no etcd pid printed"; exit 1; }
  sleep 4 # the contenders warm up before sampling
  perf record -g -F "$hz" -p "$pid" -o "$out/$name.data" -- sleep "$window" 2>/dev/null
  wait "$run"
  perf script -i "$out/$name.data" 2>/dev/null >"$out/$name.stacks"
}

# activities NAME: etcd's CPU ms per handoff in each activity of NAME's run.
activities() {
  local name=$1 rate
  rate=$(sed -n 's/^handoffs\/s \([0-9]*\).*/\1/p' "$out/$name.txt")
  awk -v rate="$rate" -v secs="$window" -v hz="$hz" -v name="$name" '
    BEGIN {
      n = split("all|WAL).sync|applyEntries|rangeKeys|Compare|watchServer).Watch|processUnaryRPC|HandleStreams|loopyWriter|mallocgc|gcBgMarkWorker|findRunnable", pat, "|")
      split("all of etcd|raft log fsync (WAL sync)|applying committed entries|range reads (mvcc rangeKeys)|transaction compares|watch streams (create, cancel, progress, events)|unary requests (gRPC handler)|reading the sockets (HTTP/2 frames)|writing the sockets (gRPC loopy writer)|allocation (mallocgc)|garbage collection (mark workers)|Go scheduler looking for work", label, "|")
    }
    function flush() { if (!open) return; total++; for (i = 2; i <= n; i++) if (index(stack, pat[i])) hits[i]++; open = 0; stack = "" }
    /^[^ \t]/ { flush(); open = 1; next }
    /^[ \t]*$/ { flush(); next }
    { stack = stack " " $2 }
    END {
      flush(); hits[1] = total
      handoffs = rate * secs
      printf "%s: %s handoffs/s; etcd CPU per handoff by activity (ms, inclusive):\n", name, rate
      for (i = 1; i <= n; i++) printf "  %-52s %6.3f\n", label[i], 1000 * hits[i] / hz / handoffs
    }' "$out/$name.stacks"
}

profile podlock --podlock-only
profile floor --floor-only
step "etcd's CPU per handoff, podlock then the floor (ms; a sample counts in each activity on its stack)"
activities podlock
activities floor
