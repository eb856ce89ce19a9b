#!/usr/bin/env bash
# The test command: installs what is missing, then formatting, lints and every
# test against real Valkey servers and a real kube-apiserver + etcd.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
# The tests compile while setup installs packages and builds the Go tools: on
# a fresh machine much of setup waits on the network and the disk, and the
# `cargo test` below reuses this build. Its output is shown only if it fails.
# The build runs in its own process group (set -m) so that stopping it stops
# its rustc and build-script processes too: a background job of a script
# ignores Ctrl-C, and SIGTERM to cargo alone leaves them running.
build_log="$(mktemp)"
set -m
cargo test --locked --all-targets --no-run >"$build_log" 2>&1 &
build=$!
set +m
trap 'kill -TERM -- -"$build" 2>/dev/null || true; rm -f "$build_log"' EXIT
# Not `eval "$(scripts/setup.sh)"`: eval succeeds whatever the substitution
# exits with, so a failed setup went on to the tests.
setup_env="$(scripts/setup.sh)"
eval "$setup_env"
if ! wait "$build"; then
  cat "$build_log" >&2
  echo "test: building the tests failed (above)" >&2
  exit 1
fi
# The build is reaped: its pid (and group id) may be reused by anything the
# tests start, so the exit trap must never signal it again.
trap 'rm -f "$build_log"' EXIT
rm -f "$build_log"
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings
# Every test target, including the fault matrix's quick mode (the `faults`
# target: every scenario and positive control once; see scripts/faults.sh).
cargo test --locked --all-targets --no-fail-fast "$@"
