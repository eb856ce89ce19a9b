#!/usr/bin/env bash
# The fault matrix (issue 12, tests/faults/): a recorded workload against real
# Valkey, PostgreSQL, kube-apiserver + etcd and the operator, real faults,
# a checker that can fail, and positive controls that must be caught.
#
#   scripts/faults.sh [quick] [WORD…]  every scenario and control once, FAULTS_QUICK_SECS
#                                      (default 8) seconds each; scripts/test.sh runs
#                                      this as the `faults` test target
#   scripts/faults.sh long [WORD…]     FAULTS_RUNS (default 10) x FAULTS_SECS (default
#                                      300) per scenario; appends each run to
#                                      docs/faults/runs/<scenario>.jsonl (FAULTS_PARTS=dir
#                                      elsewhere) and rewrites docs/faults.md from every
#                                      run recorded there (FAULTS_REPORT=path elsewhere).
#                                      The full run is ~22 h: split it by WORD across days.
#                                      FAULTS_RUNS=0 only re-renders docs/faults.md.
#   scripts/faults.sh fill P [WORD…]   long mode, topped up (scenarios in the order of the
#                                      WORDs): runs each chosen scenario only
#                                      as often as it lacks FAULTS_RUNS records of FAULTS_SECS
#                                      seconds, P scenarios at a time (each its own harness
#                                      process, Valkey, PostgreSQL and control plane; the
#                                      records say how many ran at once), logs under
#                                      target/tmp/faults-fill/, then rewrites docs/faults.md.
#                                      Stopping it loses only the runs in progress.
#
# WORDs keep only the scenarios whose name contains one of them (a scenario's
# whole name keeps it alone; `--skip WORD` drops the same way). Exits non-zero
# on any violation of a property the scenario promises, any control that is
# not caught, a fault that never fired or a workload that did nothing; a
# failed run's history is saved under target/tmp/faults/.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
# Not `eval "$(scripts/setup.sh)"`: eval succeeds whatever setup exits with.
setup_env="$(scripts/setup.sh)"
eval "$setup_env"
mode="${1:-quick}"
[ $# -gt 0 ] && shift
case "$mode" in
  quick)
    exec cargo test --locked --test faults -- "$@"
    ;;
  long)
    export FAULTS_REPORT="${FAULTS_REPORT:-$REPO/docs/faults.md}"
    export FAULTS_REPORT_NOTE="${FAULTS_REPORT_NOTE:-}"
    exec cargo test --locked --test faults -- long "$@"
    ;;
  fill)
    at_once="${1:?usage: $0 fill P [WORD…]}"
    shift
    runs="${FAULTS_RUNS:-10}"
    secs="${FAULTS_SECS:-300}"
    parts="${FAULTS_PARTS:-$REPO/docs/faults/runs}"
    logs="$REPO/target/tmp/faults-fill"
    mkdir -p "$logs" "$parts"
    # One build, then the harness binary itself, copied out so that a later
    # build or cache clean-up cannot remove it under the runs (the paused
    # holder re-executes it).
    exe="$(cargo test --locked --no-run --test faults --message-format=json \
      | jq -r 'select(.profile.test == true and .target.name == "faults") | .executable')"
    [ -x "$exe" ] || { echo "faults fill: no harness binary" >&2; exit 1; }
    cp "$exe" "$logs/faults"
    exe="$logs/faults"
    unset FAULTS_REPORT
    export FAULTS_AT_ONCE="$at_once" FAULTS_PARTS="$parts" FAULTS_SECS="$secs"
    status=0
    while read -r name; do
      have=0
      if [ -f "$parts/$name.jsonl" ]; then
        have="$(jq -s --argjson s "$secs" '[.[] | select(.secs == $s)] | length' "$parts/$name.jsonl")"
      fi
      missing=$((runs - have))
      if [ "$missing" -le 0 ]; then
        echo "faults fill: $name has $have run(s) of ${secs}s"
        continue
      fi
      while [ "$(jobs -rp | wc -l)" -ge "$at_once" ]; do
        wait -n || status=1
      done
      echo "faults fill: $name, $missing run(s) of ${secs}s ($(date -u +%H:%M:%S)), log $logs/$name.log"
      FAULTS_RUNS="$missing" "$exe" long "$name" >"$logs/$name.log" 2>&1 &
    done < <(if [ $# -eq 0 ]; then "$exe" list; else for w in "$@"; do "$exe" list "$w"; done | awk '!seen[$0]++'; fi)
    while [ "$(jobs -rp | wc -l)" -gt 0 ]; do
      wait -n || status=1
    done
    grep -h "FAILED" "$logs"/*.log || true
    FAULTS_RUNS=0 FAULTS_REPORT="${FAULTS_REPORT_PATH:-$REPO/docs/faults.md}" "$exe" long "$@"
    exit "$status"
    ;;
  *)
    echo "usage: $0 [quick|long|fill P] [WORD…]" >&2
    exit 2
    ;;
esac
