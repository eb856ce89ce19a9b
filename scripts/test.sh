#!/usr/bin/env bash
# The test command: installs what is missing, then formatting, lints and every
# test against real Valkey servers and a real kube-apiserver + etcd. Ends with
# the run's time breakdown (setup steps, Go builds per tool group, the cargo
# build, fmt, clippy, each lane of tests and each target in it).
#
#   scripts/test.sh [ARG…]    ARGs go to every test executable as libtest
#                             arguments (a name filter, --nocapture; no `--`)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
t0=$SECONDS
times="$(mktemp)"
mark() { echo "$1 $2" >>"$times"; }
breakdown() {
  echo "test: time breakdown (seconds):" >&2
  # Go builds overlap the cargo build: the wall clock is not their sum.
  awk '{ printf "  %-26s %5d\n", $1, $2 }' "$times" >&2
  echo "  total (wall clock)         $((SECONDS - t0))" >&2
}
# The tests compile while setup installs packages and builds the Go tools: on
# a fresh machine much of setup waits on the network and the disk, and the
# tests below run what this build made. Its output is shown only if it fails.
# The build runs in its own process group (set -m) so that stopping it stops
# its rustc and build-script processes too: a background job of a script
# ignores Ctrl-C, and SIGTERM to cargo alone leaves them running.
# What the build needs besides Rust and a C compiler (protoc, for the etcd
# client's protos, which .cargo/config.toml finds in the tools directory;
# make, for jemalloc) comes first.
scripts/setup.sh protoc
build_log="$(mktemp)"
set -m
# The fault matrix's build (with the product's fail points) first: its
# `targetlease` is copied aside for the matrix (FAULTS_PRODUCT_BIN), then the
# plain build links `<target>/debug/targetlease` back without them. The JSON
# lines name every test executable: the targets run from those, not through
# `cargo test`, so that three of them can run at once without a cargo
# relinking a binary another one is starting.
# The plain build is the workspace's (the fault matrix's checker tests are
# its member's) less the two members without tests of their own: with
# `--all-targets` cargo would build an empty test harness for each.
work="$(mktemp -d)"
faults_bin="$work/targetlease-failpoints"
{ cargo test --locked --features failpoints --test faults --no-run \
  --message-format=json-render-diagnostics >"$work/faults.json" &&
  cp "$(scripts/lib/test-executables.py bin <"$work/faults.json")" "$faults_bin" &&
  cargo test --locked --workspace --exclude targetlease-build \
    --exclude targetlease-test-support --all-targets --no-run \
    --message-format=json-render-diagnostics >"$work/tests.json"; } >"$build_log" 2>&1 &
build=$!
set +m
trap 'kill -TERM -- -"$build" 2>/dev/null || true; rm -rf "$build_log" "$times" "$work"' EXIT
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
  # Reaped: never signal its group again (see below).
  trap 'rm -rf "$build_log" "$times" "$stubs" "$work"' EXIT
  cat "$build_log" >&2
  echo "test: building the tests failed (above)" >&2
  exit 1
fi
mark cargo-build-done-at $((SECONDS - t0))
# The build is reaped: its pid (and group id) may be reused by anything the
# tests start, so the exit trap must never signal it again.
trap 'breakdown; rm -rf "$build_log" "$times" "${stubs:-}" "$work"' EXIT
rm -f "$build_log"
s=$SECONDS
cargo fmt --check
mark fmt $((SECONDS - s))
s=$SECONDS
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy --locked --features failpoints --test faults -- -D warnings
mark clippy $((SECONDS - s))
# The tests run in lanes at once, because most of their time is spent
# waiting (on timers, elections, processes starting), not computing:
#   - `e2e`, the longest target, four tests at a time;
#   - e2e's playground tests, in a lane of their own from the start: their
#     first step is a cargo build of their own, and libtest runs tests in
#     name order, so in the e2e lane they came last;
#   - the fault matrix's quick mode (the `faults` target with the product's
#     fail points: every scenario and positive control once, a few at a
#     time; see scripts/faults.sh), on the binary copied aside above (its
#     etcd partition row makes network namespaces, veths and bridges with
#     `ip`: it needs root, as the node tests do);
#   - every other target one after the other, then the fuzz run.
# With arguments (a filter) e2e runs whole in one lane: a filter and the
# playground split would select some tests twice.
# Each lane logs to a file, printed whole when the lane is waited for; each
# runs in its own process group, stopped with everything it started if this
# script ends first (then the end of its log is shown). The plain build
# must have relinked `targetlease` without the fail points: checked.
plain_bin="$(scripts/lib/test-executables.py bin <"$work/tests.json")"
if cmp -s "$faults_bin" "$plain_bin"; then
  echo "test: $plain_bin is still the fail-point build" >&2
  exit 1
fi
faults_exe="$(scripts/lib/test-executables.py test faults <"$work/faults.json")"
e2e_exe="$(scripts/lib/test-executables.py test e2e <"$work/tests.json")"
others_list="$(scripts/lib/test-executables.py others e2e <"$work/tests.json")"
mapfile -t others <<<"$others_list"
rc=0
lanes=() # "NAME PID" of each lane not yet waited for
current= # the target of the last lane running in the foreground
stop_lanes() {
  local l
  if [ -n "$current" ]; then
    kill -TERM "$current" 2>/dev/null || true
  fi
  for l in "${lanes[@]}"; do
    kill -TERM -- -"${l#* }" 2>/dev/null || true
    echo "test: lane ${l%% *} was not waited for; the end of its log:" >&2
    tail -n 40 "$work/${l%% *}.log" >&2 || true
  done
}
trap 'stop_lanes; breakdown; rm -rf "$build_log" "$times" "${stubs:-}" "$work"' EXIT
lane() { # NAME COMMAND...: runs COMMAND in its own process group, logging to NAME.log
  local name=$1
  shift
  set -m
  {
    s=$SECONDS lane_rc=0
    "$@" >"$work/$name.log" 2>&1 || lane_rc=$?
    mark "$name" $((SECONDS - s))
    exit "$lane_rc"
  } &
  set +m
  lanes+=("$name $!")
}
s=$SECONDS
if [ $# -eq 0 ]; then
  lane tests-e2e env RUST_TEST_THREADS=4 "$e2e_exe" --skip playground::
  lane tests-playground "$e2e_exe" playground::
else
  lane tests-e2e "$e2e_exe" "$@"
fi
# 12 s per scenario, not the harness's 8: a control must be caught by every
# property it expects, and on a loaded machine 8 s of the etcd cut control
# sometimes held too few cut renewals or releases to show its lease lie.
lane faults env FAULTS_QUICK_SECS="${FAULTS_QUICK_SECS:-12}" FAULTS_PRODUCT_BIN="$faults_bin" "$faults_exe" "$@"
# The fuzz run (fuzz/): each target for a fixed time with libFuzzer, seeded
# from fuzz/seeds; an allocation past -malloc_limit_mb is a failure (a
# hostile length prefix must not make the decoder allocate what it says).
fuzz() {
  local target fuzz_log fuzz_rc=0
  for target in resp_decoder; do
    mkdir -p "fuzz/corpus/$target"
    fuzz_log="$(mktemp)"
    if ! RUSTUP_TOOLCHAIN=nightly "$TARGETLEASE_TOOLS_DIR/cargo-fuzz" fuzz run "$target" \
      "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
      -max_total_time="${FUZZ_SECS:-30}" -timeout=5 -malloc_limit_mb=16 -rss_limit_mb=1024 >"$fuzz_log" 2>&1; then
      tail -n 40 "$fuzz_log" >&2
      echo "test: the fuzz target $target failed (its input is in fuzz/artifacts/$target)" >&2
      fuzz_rc=1
    else
      grep -E '^Done' "$fuzz_log" | sed "s/^/test: fuzz $target: /" >&2 || true
    fi
    rm -f "$fuzz_log"
  done
  return "$fuzz_rc"
}
for entry in "${others[@]}"; do
  name="${entry%% *}" exe="${entry#* }" t=$SECONDS
  echo "     Running $name ($exe)"
  # In the background and waited for, so that this script's end (a signal)
  # can stop it too.
  "$exe" "$@" &
  current=$!
  wait "$current" || rc=1
  current=
  mark "test-$name" $((SECONDS - t))
done
t=$SECONDS
fuzz || rc=1
mark test-fuzz $((SECONDS - t))
mark tests-others $((SECONDS - s))
while [ ${#lanes[@]} -gt 0 ]; do
  l="${lanes[0]}"
  wait "${l#* }" || rc=1
  lanes=("${lanes[@]:1}")
  echo "     Running lane ${l%% *}"
  cat "$work/${l%% *}.log"
done
mark tests-all $((SECONDS - s))
exit "$rc"
