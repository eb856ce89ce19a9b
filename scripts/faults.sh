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
#
# WORDs keep only the scenarios whose name contains one of them. Exits non-zero
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
  *)
    echo "usage: $0 [quick|long] [WORD…]" >&2
    exit 2
    ;;
esac
