#!/usr/bin/env bash
# Regenerates docs/benchmarks.md from scratch: store throughput and latency
# against redis-benchmark on the same valkey-server, etcd's own lock as a peer,
# the operator at scale on a real kube-apiserver + etcd, memory (with 10,000
# unrelated pods), API write cost, restart re-adoption, handoff and leader
# failover. Starts its own servers on free loopback ports and stops them.
#
#   scripts/bench.sh                       # everything (~30 minutes on 2 cores)
#   scripts/bench.sh store                 # the store part only (< 3 minutes);
#                                          # writes target/bench/store.json
#   scripts/bench.sh waiters               # CLI waiter wake-up only (~6 minutes);
#                                          # writes target/bench/waiters.md
#   BENCH_ONLY=store scripts/bench.sh      # one part (store | operator | waiters)
#   BENCH_STEPS=peer,pods scripts/bench.sh operator  # some operator steps only:
#                                          # peer pods curve scale steady restart
#                                          # handoff failover heap (steady, restart,
#                                          # failover and heap need scale)
#
# Knobs (environment): BENCH_STORE_OPS, BENCH_STORE_OPS_SINGLE, BENCH_POOL,
# BENCH_POOL_SWEEP, BENCH_CONCURRENCY, BENCH_PEER_CONCURRENCY, BENCH_PEER_CYCLES,
# BENCH_PEER_CYCLES_SINGLE, BENCH_UNRELATED_PODS, BENCH_SCALES (default
# 1000,10000,5000: the last one's operator serves the later steps),
# BENCH_CURVE_LEASES, BENCH_CURVE_CONCURRENCY (the --concurrency curve),
# BENCH_STEADY_SECS (default 300, the 5-minute window), BENCH_HANDOFF_TRIALS,
# BENCH_FAILOVER_TRIALS, BENCH_CREATE_PARALLELISM, BENCH_STEPS, BENCH_WAITER_TRIALS,
# BENCH_OUT (default docs/benchmarks.md), BENCH_OPERATOR_EXE (another operator
# binary than this build's, to compare two builds on the same machine).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
BENCH_STARTED_EPOCH="$(date +%s)"
export BENCH_STARTED_EPOCH

case "${1:-}" in
  "") ;;
  store | operator | waiters) export BENCH_ONLY="$1" ;;
  *) echo "usage: $0 [store|operator|waiters]" >&2; exit 2 ;;
esac

# Not `eval "$(scripts/setup.sh)"`: eval succeeds whatever setup exits with.
setup_env="$(scripts/setup.sh)"
eval "$setup_env"
# heaptrack profiles the operator's heap (the bench alone needs it), linked
# into the tools directory like every packaged tool (scripts/lib/tools.sh).
# shellcheck source=lib/tools.sh
source "$REPO/scripts/lib/tools.sh"
# Only the operator part profiles (the store and waiter parts alone do not).
profiles=true
case "${BENCH_ONLY:-}" in store | waiters) profiles=false ;; esac
if "$profiles"; then
  if ! dpkg-query -W -f='${Status}' heaptrack 2>/dev/null | grep -q 'install ok installed'; then
    echo "bench: apt-get install heaptrack" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends heaptrack >&2
  fi
  ln -sfn /usr/bin/heaptrack "$TOOLS/heaptrack"
  ln -sfn /usr/bin/heaptrack_print "$TOOLS/heaptrack_print"
fi
tools=(redis-benchmark redis-cli kubectl)
! "$profiles" || tools+=(heaptrack heaptrack_print)
missing="$(missing_tools "${tools[@]}" | tr '\n' ' ')"
[ -z "$missing" ] || { echo "bench: missing from $TOOLS: $missing(run scripts/setup.sh)" >&2; exit 1; }

if [ "${BENCH_ONLY:-}" = store ]; then
  # The store part alone does not regenerate the whole doc.
  export BENCH_OUT="${BENCH_OUT:-target/bench/store.md}"
elif [ "${BENCH_ONLY:-}" = waiters ]; then
  # Nor does the waiter part (it needs no etcd-lock peer).
  mkdir -p "${CARGO_TARGET_DIR:-target}/bench"
  export BENCH_OUT="${BENCH_OUT:-${CARGO_TARGET_DIR:-target}/bench/waiters.md}"
else
  # The etcd-lock peer (not built by setup.sh: only the bench runs it).
  scripts/build-controlplane.sh etcdlock >&2
fi
if [ -n "${BENCH_STEPS:-}" ]; then
  # Some steps only: not a whole doc either.
  export BENCH_OUT="${BENCH_OUT:-target/bench/steps.md}"
fi

# Build first, in the foreground: Ctrl-C stops cargo like any command.
cargo bench --bench targetlease --no-run
# The operator part's pods and heap steps also run the same source built with
# the C library's malloc (without the default `jemalloc` feature): the heap
# profile needs it (heaptrack sees no other allocator) and the memory step
# compares the two.
# In a target directory of its own, so that neither build undoes the other.
unset BENCH_GLIBC_EXE
steps="${BENCH_STEPS:-}"
steps=",${steps// /},"
if "$profiles" && [[ -z "${BENCH_STEPS:-}" || "$steps" == *,pods,* || "$steps" == *,heap,* ]]; then
  glibc_target="${CARGO_TARGET_DIR:-$REPO/target}/glibc"
  cargo build --release --no-default-features --bin targetlease --target-dir "$glibc_target"
  export BENCH_GLIBC_EXE="$glibc_target/release/targetlease"
fi

# A private temp dir for the control plane, Valkey and operator files, so
# nothing that tidies /tmp/targetlease-cp-* elsewhere can stop ours mid-run.
TMPDIR="$(mktemp -d /tmp/tl-bench.XXXXXX)"
export TMPDIR
BENCH_PID=""

# On any exit (done, failed, Ctrl-C, a timeout's SIGTERM): stop the bench and
# everything in its process group (valkey-servers, operators), then each
# control plane it started (their own sessions), and only then remove the
# temp dir: the control planes' pid files live in it.
cleanup() {
  trap - EXIT INT TERM HUP
  # Even after a clean exit: nothing the bench left behind survives it.
  if [ -n "$BENCH_PID" ] && kill -0 -- "-$BENCH_PID" 2>/dev/null; then
    kill -TERM -- "-$BENCH_PID" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 -- "-$BENCH_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$BENCH_PID" 2>/dev/null || true
  fi
  local cp
  for cp in "$TMPDIR"/targetlease-cp-*; do
    [ -d "$cp" ] && scripts/controlplane.sh stop "$cp" || true
  done
  rm -rf "$TMPDIR"
}
trap cleanup EXIT
trap 'echo "bench: interrupted; stopping everything it started" >&2; exit 130' INT TERM HUP

# `cargo bench` passes --bench; the harness also accepts TARGETLEASE_BENCH=1.
# Its own process group (setsid: a background job of a script is not a group
# leader, so $! is the new group's id), so cleanup can stop all of it.
TARGETLEASE_BENCH=1 setsid cargo bench --bench targetlease >/dev/null &
BENCH_PID=$!
rc=0
wait "$BENCH_PID" || rc=$?
[ "$rc" = 0 ] || { echo "bench: failed ($rc)" >&2; exit "$rc"; }
echo "bench: done in $(($(date +%s) - BENCH_STARTED_EPOCH)) s; wrote ${BENCH_OUT:-docs/benchmarks.md}" >&2
