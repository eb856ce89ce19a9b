#!/usr/bin/env bash
# Regenerates docs/benchmarks.md from scratch: store throughput and latency
# against redis-benchmark on the same valkey-server, the operator at scale on a
# real kube-apiserver + etcd, API write cost, restart re-adoption, handoff and
# leader failover. Starts its own servers on free loopback ports and stops them.
#
#   scripts/bench.sh                       # everything (~10 minutes on 2 cores)
#   BENCH_ONLY=store scripts/bench.sh      # one part (store | operator)
#   BENCH_STEADY_SECS=300 scripts/bench.sh # the 5-minute steady-state window
#
# Knobs (environment): BENCH_STORE_OPS, BENCH_STORE_OPS_SINGLE, BENCH_POOL,
# BENCH_POOL_SWEEP, BENCH_CONCURRENCY, BENCH_SCALES, BENCH_STEADY_SECS,
# BENCH_HANDOFF_TRIALS, BENCH_FAILOVER_TRIALS, BENCH_CREATE_PARALLELISM,
# BENCH_OUT (default docs/benchmarks.md).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
BENCH_STARTED_EPOCH="$(date +%s)"
export BENCH_STARTED_EPOCH

eval "$(scripts/setup.sh)"
for tool in redis-benchmark redis-cli kubectl; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is missing (apt redis-tools, kubectl)" >&2; exit 1; }
done

# A private temp dir for the control plane, Valkey and operator files, so
# nothing that tidies /tmp/targetlease-cp-* elsewhere can stop ours mid-run.
TMPDIR="$(mktemp -d /tmp/tl-bench.XXXXXX)"
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT

# `cargo bench` passes --bench; the harness also accepts TARGETLEASE_BENCH=1.
TARGETLEASE_BENCH=1 cargo bench --bench targetlease >/dev/null
echo "bench: done in $(($(date +%s) - BENCH_STARTED_EPOCH)) s; wrote ${BENCH_OUT:-docs/benchmarks.md}" >&2
