#!/usr/bin/env bash
# The test command: installs what is missing, then formatting, lints and every
# test against real Valkey servers and a real kube-apiserver + etcd. Ends with
# the run's time breakdown (setup steps, Go builds per tool group, the cargo
# build, fmt, clippy, tests; each test target's own time is in its
# `test result: … finished in` line).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
t0=$SECONDS
times="$(mktemp)"
mark() { echo "$1 $2" >>"$times"; }
breakdown() {
  echo "test: time breakdown (seconds):" >&2
  # Go builds overlap the cargo build: the wall clock is not their sum.
  awk '{ printf "  %-22s %5d\n", $1, $2 }' "$times" >&2
  echo "  total (wall clock)     $((SECONDS - t0))" >&2
}
# The tests compile while setup installs packages and builds the Go tools: on
# a fresh machine much of setup waits on the network and the disk, and the
# `cargo test` below reuses this build. Its output is shown only if it fails.
# The build runs in its own process group (set -m) so that stopping it stops
# its rustc and build-script processes too: a background job of a script
# ignores Ctrl-C, and SIGTERM to cargo alone leaves them running.
# The one thing the build needs besides Rust (protoc, for the etcd client's
# protos; .cargo/config.toml finds it in the tools directory) comes first.
scripts/setup.sh protoc
build_log="$(mktemp)"
set -m
# The fault matrix (its own build, with the product's fail points) after the rest.
{ cargo test --locked --all-targets --no-run &&
  cargo test --locked --features failpoints --test faults --no-run; } >"$build_log" 2>&1 &
build=$!
set +m
trap 'kill -TERM -- -"$build" 2>/dev/null || true; rm -f "$build_log" "$times"' EXIT
# Not `eval "$(scripts/setup.sh)"`: eval succeeds whatever the substitution
# exits with, so a failed setup went on to the tests.
setup_env="$(SETUP_TIMES="$times" scripts/setup.sh)"
eval "$setup_env"
mark setup-total $((SECONDS - t0))
# The rule's guard (scripts/lib/tools.sh): from here on, every tool name the
# rule covers is first on PATH as a stub that fails loudly, so a script or a
# test that finds a tool on PATH instead of in the tools directory fails
# instead of running whatever this machine happens to have.
# shellcheck source=lib/tools.sh
source scripts/lib/tools.sh
stubs="$(mktemp -d)"
for name in "${TOOLS_ALL[@]}"; do
  printf '#!/bin/sh\necho "%s: looked up on PATH, not in the tools directory %s (scripts/lib/tools.sh)" >&2\nexit 127\n' \
    "$name" "$TARGETLEASE_TOOLS_DIR" >"$stubs/$name"
  chmod +x "$stubs/$name"
done
export PATH="$stubs:$PATH"
if ! wait "$build"; then
  cat "$build_log" >&2
  echo "test: building the tests failed (above)" >&2
  exit 1
fi
mark cargo-build-done-at $((SECONDS - t0))
# The build is reaped: its pid (and group id) may be reused by anything the
# tests start, so the exit trap must never signal it again.
trap 'breakdown; rm -rf "$build_log" "$times" "${stubs:-}"' EXIT
rm -f "$build_log"
s=$SECONDS
cargo fmt --check
mark fmt $((SECONDS - s))
s=$SECONDS
cargo clippy --all-targets --locked -- -D warnings
cargo clippy --locked --features failpoints --test faults -- -D warnings
mark clippy $((SECONDS - s))
# Every test target, then the fault matrix's quick mode (the `faults`
# target, built with the product's fail points: every scenario and positive
# control once, a few at a time; see scripts/faults.sh). Run last: its build
# links target/debug/targetlease with the fail points, the plain build
# before it without.
s=$SECONDS
rc=0
cargo test --locked --all-targets --no-fail-fast "$@" || rc=$?
mark tests $((SECONDS - s))
s=$SECONDS
cargo test --locked --features failpoints --test faults "$@" || rc=$?
mark faults $((SECONDS - s))
# The fuzz run (fuzz/): each target for a fixed time with libFuzzer, seeded
# from fuzz/seeds; an allocation past -malloc_limit_mb is a failure (a
# hostile length prefix must not make the decoder allocate what it says).
s=$SECONDS
for target in resp_decoder; do
  mkdir -p "fuzz/corpus/$target"
  fuzz_log="$(mktemp)"
  if ! RUSTUP_TOOLCHAIN=nightly "$TARGETLEASE_TOOLS_DIR/cargo-fuzz" fuzz run "$target" \
    "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
    -max_total_time="${FUZZ_SECS:-30}" -timeout=5 -malloc_limit_mb=16 -rss_limit_mb=1024 >"$fuzz_log" 2>&1; then
    tail -n 40 "$fuzz_log" >&2
    echo "test: the fuzz target $target failed (its input is in fuzz/artifacts/$target)" >&2
    rc=1
  else
    grep -E '^Done' "$fuzz_log" | sed "s/^/test: fuzz $target: /" >&2 || true
  fi
  rm -f "$fuzz_log"
done
mark fuzz $((SECONDS - s))
exit "$rc"
