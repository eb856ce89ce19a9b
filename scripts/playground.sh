#!/usr/bin/env bash
# One-command local playground: a real Valkey, a real kube-apiserver + etcd,
# the CRD, the operator, and the examples; then the held leases with their
# tokens, each election's leader pod with its token, and `targetlease run`.
#
#   scripts/playground.sh          start (or restart) everything, show the leases
#   scripts/playground.sh stop     stop everything and remove the playground's directory
#
# PLAYGROUND_DIR (default .playground in the repository) holds the logs, the
# kubeconfig and the pids; PLAYGROUND_BIN names a targetlease binary to use
# instead of the one `cargo build` makes. Everything is left running for you to try when
# the playground is shown; if anything it starts is not running (or does not
# get there), it says which, shows that part's log, stops everything it
# started and exits non-zero.
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
on_exit() {
  local rc=$?
  if [ "$shown" = 0 ]; then
    log "failed (exit $rc); stopping everything it started"
    stop
    [ "$rc" != 0 ] || rc=1
  fi
  exit "$rc"
}
trap on_exit EXIT
trap 'log "interrupted"; exit 130' INT TERM HUP

# A part that is not running ends the playground, with that part's story.
running() { # NAME (as spawned into $PG)
  local pid
  pid="$(cat "$PG/$1.pid" 2>/dev/null || true)"
  is_ours "$pid" "$1" && return 0
  explain_exit "$PG" "$1"
  die "$1 is not running (log: $PG/$1.log)"
}

# Not `eval "$(scripts/setup.sh)"`: eval succeeds whatever setup exits with.
setup_env="$(scripts/setup.sh playground)"
eval "$setup_env"

# The binary cargo actually built, wherever CARGO_TARGET_DIR puts it (or
# PLAYGROUND_BIN, one built already: the tests pass theirs).
if [ -n "${PLAYGROUND_BIN:-}" ]; then
  TL="$PLAYGROUND_BIN"
else
  log "building targetlease…"
  TL="$(cargo build --quiet --bin targetlease --message-format=json \
    | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "targetlease":
        print(m["executable"])')"
fi
[ -x "$TL" ] || die "no targetlease executable at '$TL'"

port="$(free_port)"
spawn "$PG" valkey-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$PG"
wait_until "$PG" valkey-server 30 "$BIN/valkey-cli" -p "$port" ping || running valkey-server
export TARGETLEASE_VALKEY_URL="redis://127.0.0.1:$port"

log "starting kube-apiserver + etcd…"
bash scripts/controlplane.sh start "$PG/cp" >&2
export KUBECONFIG="$PG/cp/kubeconfig"
kubectl() { "$BIN/kubectl" "$@"; }
kubectl apply -f crds/ >/dev/null
kubectl wait --for condition=established crd/targetleases.targetlease.dev --timeout=60s >/dev/null
kubectl create namespace targetlease-system --dry-run=client -o yaml | kubectl apply -f - >/dev/null

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PG/lease-id-key"
admin="127.0.0.1:$(free_port)"
BIN="$(dirname "$TL")" spawn "$PG" targetlease operator --lease-id-key-file "$PG/lease-id-key" \
  --floor-namespace targetlease-system --admin-addr "$admin"
wait_until "$PG" targetlease 60 curl -fsS --max-time 2 "http://$admin/readyz" || running targetlease

kubectl apply -f examples/job-lease.yaml >/dev/null
kubectl apply -f examples/leader-election.yaml >/dev/null
# No kubelet runs here: stand in for the Deployment's pods and mark them Ready.
for i in 0 1 2; do
  kubectl run "web-$i" --image=registry.example/web:1.0 --labels=app=web --restart=Never >/dev/null
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
  running targetlease
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
running targetlease
"$TL" run --target nightly-report --owner "${USER:-me}@playground" --ttl 10s -- \
  sh -c 'echo "  running with fencing token $TARGETLEASE_FENCING_TOKEN on $TARGETLEASE_TARGET"' \
  || die "targetlease run failed"
running targetlease
shown=1
cat <<MSG

Try it:
  export KUBECONFIG=$KUBECONFIG TARGETLEASE_VALKEY_URL=$TARGETLEASE_VALKEY_URL
  alias kubectl=$BIN/kubectl
  kubectl delete tl orders-db-job-1 && kubectl get tl      # the waiter takes over with a larger token
  kubectl delete pod web-0 && kubectl get tl web-leader    # leadership moves to the next Ready pod
  $TL lease get --target orders-db
Logs: $PG/targetlease.log
Clean up: scripts/playground.sh stop
MSG
