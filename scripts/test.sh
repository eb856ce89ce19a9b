#!/usr/bin/env bash
# The test command: installs what is missing, then formatting, lints and every
# test against real Valkey servers and a real kube-apiserver + etcd.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
# The tests compile while setup installs packages and builds the Go tools: on
# a fresh machine much of setup waits on the network and the disk, and the
# `cargo test` below reuses this build. Its output is shown only if it fails.
build_log="$(mktemp)"
cargo test --locked --all-targets --no-run >"$build_log" 2>&1 &
build=$!
trap 'kill "$build" 2>/dev/null || true; rm -f "$build_log"' EXIT
eval "$(scripts/setup.sh)"
if ! wait "$build"; then
  cat "$build_log" >&2
  echo "test: building the tests failed (above)" >&2
  exit 1
fi
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings
# Every test target, including the fault matrix's quick mode (the `faults`
# target: every scenario and positive control once; see scripts/faults.sh).
cargo test --locked --all-targets --no-fail-fast "$@"
