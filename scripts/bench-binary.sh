#!/usr/bin/env bash
# Builds one of podlock's benchmarks (release) and prints the path of its executable, for the
# scripts that run it under a profiler.
#
#   scripts/bench-binary.sh NAME    # handoff, scale or fence
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: scripts/bench-binary.sh NAME}
printf '\033[1m[bench]\033[0m building the %s benchmark (release)\n' "$name" >&2
bench=$(cargo bench --bench "$name" --no-run --message-format=json 2>/dev/null |
  sed -n "s|.*\"executable\":\"\\([^\"]*/deps/$name-[^\"]*\\)\".*|\\1|p" | tail -n 1)
[ -x "$bench" ] || { echo "cargo built no $name benchmark" >&2; exit 1; }
echo "$bench"
