#!/usr/bin/env bash
# One-command local playground: a real Valkey, a real kube-apiserver + etcd,
# the CRD, the operator, and the examples; then the held leases with their
# tokens, each election's leader pod with its token, and `targetlease run`.
#
#   scripts/playground.sh          start (or restart) everything, show the leases
#   scripts/playground.sh stop     stop everything and remove the playground's directory
#
# PLAYGROUND_DIR (default .playground in the repository) holds the logs, the
# kubeconfig and the pids; PLAYGROUND_BIN names a targetlease binary to
# use instead of the one `cargo build` makes (wherever CARGO_TARGET_DIR puts
# it). Everything is left running for you to try when the playground is
# shown; if any part it started (valkey-server, etcd, kube-apiserver,
# kube-controller-manager, the operator) is not running, or does not get
# there, it says which and why (exit status or signal, the part's log, what
# else ran), stops everything it started and exits non-zero.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PG="${PLAYGROUND_DIR:-$REPO/.playground}"
cd "$REPO"
log() { echo "playground: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source=lib/tools.sh
source "$REPO/scripts/lib/tools.sh"
BIN="$TOOLS"
# spawn, is_ours, stop_pid, wait_until, explain_exit, free_port
# shellcheck source=lib/process.sh
source "$REPO/scripts/lib/process.sh"

# Everything this playground started: its own processes, then the control plane.
stop() {
  local pidfile name
  for pidfile in "$PG"/*.pid; do
    [ -f "$pidfile" ] || continue
    name="$(basename "$pidfile" .pid)"
    stop_pid "$(cat "$pidfile")" "$name" 5
    rm -f "$pidfile"
  done
  [ -d "$PG/cp" ] && bash scripts/controlplane.sh stop "$PG/cp" >/dev/null 2>&1 || true
  rm -rf "$PG"
}

if [ "${1:-start}" = stop ]; then
  stop
  echo "playground stopped"
  exit 0
fi
[ "${1:-start}" = start ] || { echo "usage: $0 [start|stop]" >&2; exit 2; }

stop
mkdir -p "$PG"
shown=0
# Every part started so far, as "DIR NAME" (its pid is in DIR/NAME.pid), in
# the order they were started.
parts=()
named_dead=0 # whether dead_parts has named one
started() { parts+=("$1 $2"); }

# Explains every part that is not running; status 1 if there is one. The
# first named is the earliest started: what the later ones depend on.
dead_parts() {
  local p dir name pid dead=()
  for p in ${parts[@]+"${parts[@]}"}; do
    dir="${p% *}"; name="${p#* }"
    pid="$(cat "$dir/$name.pid" 2>/dev/null || true)"
    is_ours "$pid" "$name" && continue
    explain_exit "$dir" "$name"
    dead+=("$name")
  done
  ((${#dead[@]} == 0)) && return 0
  named_dead=1
  log "ERROR: ${dead[0]} is not running (log: $(dead_log "${dead[0]}"))${dead[1]:+; nor is: ${dead[*]:1}}"
  return 1
}
dead_log() { # NAME
  local p
  for p in "${parts[@]}"; do [ "${p#* }" = "$1" ] && echo "${p% *}/$1.log"; done
}
# Ends the playground (non-zero) if any part it started is not running.
all_running() { dead_parts || exit 1; }

# Until CMD succeeds, every part still running; WHAT failed after SECS.
wait_for() { # SECS WHAT CMD...
  local secs="$1" what="$2" deadline
  shift 2
  deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    all_running
    [ "$SECONDS" -lt "$deadline" ] || die "$what within ${secs}s"
    sleep 0.25
  done
}

on_exit() {
  local rc=$?
  if [ "$shown" = 0 ]; then
    # A command that failed because a part died (kubectl against a dead API
    # server, say) names that part.
    [ "$named_dead" = 1 ] || dead_parts || true
    log "failed (exit $rc); stopping everything it started"
    stop
    [ "$rc" != 0 ] || rc=1
  fi
  exit "$rc"
}
trap on_exit EXIT
trap 'log "interrupted"; exit 130' INT TERM HUP

# Not `eval "$(scripts/setup.sh)"`: eval succeeds whatever setup exits with.
setup_env="$(scripts/setup.sh playground)"
eval "$setup_env"

# The binary cargo actually built, wherever CARGO_TARGET_DIR puts it (or
# PLAYGROUND_BIN, one built already).
if [ -n "${PLAYGROUND_BIN:-}" ]; then
  TL="$PLAYGROUND_BIN"
else
  log "building targetlease…"
  TL="$("${CARGO:-cargo}" build --quiet --locked --bin targetlease --message-format=json \
    | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "targetlease":
        print(m["executable"])')"
fi
[ -x "$TL" ] || die "no targetlease executable at '$TL'"
log "targetlease: $TL"

port="$(free_port)"
spawn "$PG" valkey-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$PG"
started "$PG" valkey-server
wait_for 30 "valkey-server did not answer" "$BIN/valkey-cli" -p "$port" ping
export TARGETLEASE_STORE_URL="redis://127.0.0.1:$port"

log "starting kube-apiserver + etcd…"
# A start that fails says why and stops what it started.
bash scripts/controlplane.sh start "$PG/cp" >&2 || { all_running; die "the control plane did not start (above)"; }
for name in etcd kube-apiserver kube-controller-manager; do
  [ ! -f "$PG/cp/$name.pid" ] || started "$PG/cp" "$name"
done
all_running
export KUBECONFIG="$PG/cp/kubeconfig"
# A request the API server cannot answer (its etcd died) gives up after 20 s.
kubectl() { "$BIN/kubectl" --request-timeout=20s "$@"; }
kubectl apply -f crds/ >/dev/null
wait_for 60 "the TargetLease CRD was not established" \
  "$BIN/kubectl" wait --for condition=established crd/targetleases.targetlease.dev --timeout=5s
kubectl create namespace targetlease-system --dry-run=client -o yaml | kubectl apply -f - >/dev/null

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PG/lease-id-key"
admin_port="$(free_port)"
BIN="$(dirname "$TL")" spawn "$PG" targetlease operator --lease-id-key-file "$PG/lease-id-key" \
  --floor-namespace targetlease-system --admin-addr "127.0.0.1:$admin_port"
started "$PG" targetlease
wait_for 60 "the operator was not ready" curl -fsS --max-time 2 "http://127.0.0.1:$admin_port/readyz"

kubectl apply -f examples/job-lease.yaml >/dev/null
kubectl apply -f examples/leader-election.yaml >/dev/null
# No kubelet runs here: stand in for the Deployment's pods (with its labels, the
# candidate opt-in among them) and mark them Ready.
for i in 0 1 2; do
  kubectl run "web-$i" --image=registry.example/web:1.0 --restart=Never \
    --labels=app=web,web-leader.targetlease.dev/candidate=true >/dev/null
  kubectl patch pod "web-$i" --subresource=status --type=merge \
    -p '{"status":{"conditions":[{"type":"Ready","status":"True"}]}}' >/dev/null
done

# Every election (a TargetLease with candidates) and its marked leader.
elections() {
  kubectl get tl -o jsonpath='{range .items[?(@.spec.candidates)]}{.metadata.name}{"\n"}{end}'
}
leader_of() { # ELECTION -> "POD TOKEN" of the pod carrying its leader mark
  kubectl get pods -l "$1.targetlease.dev/leader=true" \
    -o jsonpath="{range .items[*]}{.metadata.name}{\" \"}{.metadata.annotations['$1\.targetlease\.dev/fencing-token']}{\"\\n\"}{end}"
}
ready=0
for _ in $(seq 1 120); do
  all_running
  held="$(kubectl get tl -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c '^Held$' || true)"
  led=1
  for e in $(elections); do [ -n "$(leader_of "$e")" ] || led=0; done
  if [ "$held" -ge 2 ] && [ "$led" = 1 ]; then ready=1; break; fi
  sleep 0.5
done
[ "$ready" = 1 ] || { kubectl get tl >&2; tail -n 20 "$PG/targetlease.log" >&2; die "the leases were not Held (and every election led) within 60s"; }

echo
echo "== kubectl get tl"
kubectl get tl
echo
echo "== the leader of each election (its pod carries <election>.targetlease.dev/leader=true)"
printf '%-16s %-10s %s\n' ELECTION POD TOKEN
for e in $(elections); do
  read -r pod token <<<"$(leader_of "$e")"
  [ -n "$token" ] || die "election $e: leader $pod carries no fencing-token annotation"
  printf '%-16s %-10s %s\n' "$e" "$pod" "$token"
done
echo
echo "== a script holding a lease with targetlease run"
all_running
"$TL" run --target nightly-report --owner "${USER:-me}@playground" --ttl 10s -- \
  sh -c 'echo "  running with fencing token $TARGETLEASE_FENCING_TOKEN on $TARGETLEASE_TARGET"' \
  || die "targetlease run failed"
# Shown only if every part it started is still running.
all_running
shown=1
cat <<MSG

Try it:
  export KUBECONFIG=$KUBECONFIG TARGETLEASE_STORE_URL=$TARGETLEASE_STORE_URL
  alias kubectl=$BIN/kubectl
  kubectl delete tl orders-db-job-1 && kubectl get tl      # the waiter takes over with a larger token
  kubectl delete pod web-0 && kubectl get tl web-leader    # leadership moves to the next Ready pod
  $TL lease get --target orders-db
Logs: $PG/targetlease.log
Clean up: scripts/playground.sh stop
MSG
