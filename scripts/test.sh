#!/usr/bin/env bash
# Runs every test of podlock: installs what is missing (scripts/setup.sh), then format check,
# clippy, unit tests and the integration tests on a real etcd.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\033[1m[test]\033[0m %s\n' "$*" >&2; }

bash scripts/setup.sh >/dev/null
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
step "cargo test (unit tests, then integration tests on real etcd and podlock processes)"
cargo test
