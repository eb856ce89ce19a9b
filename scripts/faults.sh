#!/usr/bin/env bash
# The fault matrix (tests/faults/): a recorded workload against real
# Valkey or a 3-member etcd cluster (the `etcd-` rows), PostgreSQL,
# kube-apiserver + etcd and the operator, real faults, a checker that can
# fail, and positive controls that must be caught.
#
#   scripts/faults.sh [quick] [WORD…]  every scenario and control once, FAULTS_QUICK_SECS
#                                      (default 8) seconds each; scripts/test.sh runs
#                                      this as the `faults` test target
#   scripts/faults.sh long [WORD…]     FAULTS_RUNS (default 10) x FAULTS_SECS (default
#                                      300) per scenario; appends each run to
#                                      docs/faults/runs/<scenario>.jsonl (FAULTS_PARTS=dir
#                                      elsewhere) and rewrites docs/faults.md from every
#                                      run recorded there (FAULTS_REPORT=path elsewhere).
#                                      The full run is ~44 h: split it by WORD across days.
#                                      FAULTS_RUNS=0 only re-renders docs/faults.md.
#                                      Every failed run, and the first FAULTS_KEEP_HISTORIES
#                                      (default 1) passing runs of a scenario per checker version
#                                      and length, keep their whole history, packed and
#                                      xz-compressed, next to the record
#                                      (docs/faults/runs/<scenario>/), so a clone can re-judge it.
#   scripts/faults.sh rejudge [WORD…]  the current checker on every record whose history was
#                                      kept next to it: figures, failures and the checker
#                                      version rewritten in the records; then docs/faults.md
#                                      (works from a fresh clone: needs only cargo and xz)
#   scripts/faults.sh fill P [WORD…]   long mode, topped up: runs each chosen scenario (in the
#                                      order of the WORDs) only as often as it lacks FAULTS_RUNS
#                                      records of FAULTS_SECS seconds judged by the current
#                                      checker version, P scenarios at a time, each
#                                      its own harness process with its own Valkey, PostgreSQL
#                                      and control plane (the records say P); binaries pinned,
#                                      logs and failed runs' histories kept in
#                                      ~/.cache/targetlease/faults-fill/<time>/; then
#                                      rewrites docs/faults.md (FAULTS_REPORT_PATH elsewhere).
#                                      Stopping it (Ctrl-C, SIGTERM) loses only the runs in
#                                      progress.
#
# WORDs keep only the scenarios whose name contains one of them (a scenario's
# whole name keeps it alone; `--skip WORD` drops the same way). Exits non-zero
# on any violation of a property the scenario promises, any control that is
# not caught, a fault that never fired or a workload that did nothing; a
# failed run's history is saved under target/tmp/faults/.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
# The tools every mode but `rejudge` needs (re-judging reads records and
# histories only, so a fresh clone can do it without them).
setup() {
  # Not `eval "$(scripts/setup.sh)"`: eval succeeds whatever setup exits with.
  local setup_env
  setup_env="$(scripts/setup.sh)"
  eval "$setup_env"
  # shellcheck source=lib/tools.sh
  source "$REPO/scripts/lib/tools.sh"
  JQ="$(tool jq)"
}
mode="${1:-quick}"
[ $# -gt 0 ] && shift
case "$mode" in
  quick)
    setup
    exec cargo test --locked --features failpoints --test faults -- "$@"
    ;;
  long)
    setup
    export FAULTS_REPORT="${FAULTS_REPORT:-$REPO/docs/faults.md}"
    export FAULTS_REPORT_NOTE="${FAULTS_REPORT_NOTE:-}"
    # This tree's records: the harness's own default is the tree it was
    # compiled in, which a shared CARGO_TARGET_DIR makes another checkout.
    export FAULTS_PARTS="${FAULTS_PARTS:-$REPO/docs/faults/runs}"
    exec cargo test --locked --features failpoints --test faults -- long "$@"
    ;;
  rejudge)
    # The current checker on every record that kept its history (next to
    # the record); the page is rendered again from the records
    # (FAULTS_REPORT=path elsewhere). Nothing runs, so no tools are set up.
    command -v xz >/dev/null || { echo "faults rejudge: xz reads the kept histories; install xz-utils" >&2; exit 1; }
    export FAULTS_PARTS="${FAULTS_PARTS:-$REPO/docs/faults/runs}"
    cargo test --locked --features failpoints --test faults -- rejudge "$@"
    FAULTS_RUNS=0 FAULTS_REPORT="${FAULTS_REPORT:-$REPO/docs/faults.md}" \
      exec cargo test --locked --features failpoints --test faults -- long
    ;;
  fill)
    at_once="${1:-}"
    if ! [[ "$at_once" =~ ^[1-9][0-9]*$ ]]; then
      echo "usage: $0 fill P [WORD…]   (P: how many scenarios at once, 1 or more)" >&2
      exit 2
    fi
    shift
    setup
    runs="${FAULTS_RUNS:-10}"
    secs="${FAULTS_SECS:-300}"
    parts="${FAULTS_PARTS:-$REPO/docs/faults/runs}"
    # Outside target/: `cargo clean` must not remove the pinned binaries
    # under hours of runs.
    logs="${FAULTS_FILL_DIR:-$HOME/.cache/targetlease/faults-fill}/$(date -u +%Y%m%dT%H%M%SZ)"
    mkdir -p "$logs" "$parts"
    # One build; the harness and the product are copied into this fill's own
    # directory and the commit is named now, so that a build, a commit or a
    # cache clean-up during hours of runs changes none of them (the paused
    # holder re-executes the harness; the CLI clients and the operator are
    # the product binary).
    built="$(cargo test --locked --features failpoints --no-run --test faults --message-format=json)"
    exe="$("$JQ" -r 'select(.profile.test == true and .target.name == "faults") | .executable' <<<"$built")"
    product="$("$JQ" -r 'select(.target.kind == ["bin"] and .target.name == "targetlease") | .executable' <<<"$built" | tail -n 1)"
    [ -x "$exe" ] && [ -x "$product" ] || { echo "faults fill: no harness or product binary" >&2; exit 1; }
    cp "$exe" "$logs/faults"
    cp "$product" "$logs/targetlease"
    exe="$logs/faults"
    FAULTS_COMMIT="$(git describe --always --dirty --abbrev=12)"
    export FAULTS_COMMIT FAULTS_PRODUCT_BIN="$logs/targetlease" FAULTS_DUMP_DIR="$logs/histories"
    export FAULTS_AT_ONCE="$at_once" FAULTS_PARTS="$parts" FAULTS_SECS="$secs"
    unset FAULTS_REPORT
    echo "faults fill: $FAULTS_COMMIT, up to $at_once scenario(s) at once, logs in $logs"
    # Each harness runs in its own session (with the Valkey servers, CLI
    # clients and operators it starts); stopping the fill stops those
    # sessions, so a run in progress ends unrecorded instead of failing
    # half-torn-down. PostgreSQL and the control planes have watchdogs. The
    # fill reads scripts/controlplane.sh from this tree at every operator
    # run: run it from a checkout nothing else changes (a worktree).
    declare -A running=()
    status=0
    stop_all() {
      # Every job, including one started just before the signal; CONT
      # after TERM, or a paused holder or operator would stay stopped.
      # The pid itself too: a job may not have reached its setsid yet.
      for pid in "${!running[@]}" $(jobs -p); do
        kill -TERM -- "-$pid" "$pid" 2>/dev/null || true
        kill -CONT -- "-$pid" "$pid" 2>/dev/null || true
      done
    }
    stopped() {
      # Stop first: with the terminal gone, even the message can fail.
      trap '' PIPE
      set +e
      stop_all
      echo "faults fill: stopped; the runs in progress are not recorded" >&2 2>/dev/null
      wait
      exit "$1"
    }
    trap 'stopped 130' INT
    trap 'stopped 143' TERM
    trap 'stopped 129' HUP
    reap_one() {
      local pid="" rc=0
      wait -n -p pid "${!running[@]}" || rc=$?
      if [ "$rc" -ne 0 ]; then
        status=1
        echo "faults fill: ${running[$pid]} exited $rc, see $logs/${running[$pid]}.log" >&2
      fi
      unset "running[$pid]"
    }
    # Only runs that count as judged by the current checker are evidence
    # for its rules: the harness says which (a record of an older version
    # counts only where the rules it was judged by are the same).
    checker="$("$exe" checker)"
    [[ "$checker" =~ ^[0-9]+$ ]] || { echo "faults fill: no checker version from $exe" >&2; exit 1; }
    names="$("$exe" list "$@")"
    for name in $names; do
      have="$("$exe" recorded "$secs" "$name")"
      [[ "$have" =~ ^[0-9]+$ ]] || { echo "faults fill: cannot count the runs of $name" >&2; exit 1; }
      missing=$((runs - have))
      if [ "$missing" -le 0 ]; then
        echo "faults fill: $name has $have run(s) of ${secs}s by checker v$checker"
        continue
      fi
      while [ "${#running[@]}" -ge "$at_once" ]; do reap_one; done
      echo "faults fill: $name, $missing run(s) of ${secs}s (checker v$checker), from $(date -u +%H:%M:%S)"
      FAULTS_RUNS="$missing" setsid "$exe" long "$name" >"$logs/$name.log" 2>&1 &
      running[$!]="$name"
    done
    while [ "${#running[@]}" -gt 0 ]; do reap_one; done
    trap - INT TERM HUP
    grep -h "FAILED" "$logs"/*.log 2>/dev/null || true
    FAULTS_RUNS=0 FAULTS_REPORT="${FAULTS_REPORT_PATH:-$REPO/docs/faults.md}" "$exe" long
    exit "$status"
    ;;
  *)
    echo "usage: $0 [quick|long|fill P|rejudge] [WORD…]" >&2
    exit 2
    ;;
esac
