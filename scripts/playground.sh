#!/usr/bin/env bash
# One-command local playground: a real Valkey, a real kube-apiserver + etcd,
# the CRD, the operator, and the examples; then `kubectl get tl` with held
# leases and their tokens.
#
#   scripts/playground.sh          start (or restart) everything, show the leases
#   scripts/playground.sh stop     stop everything and remove .playground/
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PG="$REPO/.playground"
cd "$REPO"

stop() {
  for pidfile in "$PG"/*.pid; do
    [ -f "$pidfile" ] || continue
    kill "$(cat "$pidfile")" 2>/dev/null || true
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

stop
mkdir -p "$PG"
# Not `eval "$(scripts/setup.sh)"`: eval succeeds whatever setup exits with.
setup_env="$(scripts/setup.sh)"
eval "$setup_env"
echo "building targetlease…" >&2
cargo build --quiet
TL="$REPO/target/debug/targetlease"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$VALKEY_SERVER_BIN" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$PG" \
  >"$PG/valkey.log" 2>&1 &
echo $! >"$PG/valkey.pid"
export TARGETLEASE_VALKEY_URL="redis://127.0.0.1:$port"

echo "starting kube-apiserver + etcd…" >&2
bash scripts/controlplane.sh start "$PG/cp" >&2
export KUBECONFIG="$PG/cp/kubeconfig"
kubectl apply -f crds/ >/dev/null
kubectl wait --for condition=established crd/targetleases.targetlease.dev --timeout=60s >/dev/null
kubectl create namespace targetlease-system --dry-run=client -o yaml | kubectl apply -f - >/dev/null

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PG/lease-id-key"
"$TL" operator --lease-id-key-file "$PG/lease-id-key" --floor-namespace targetlease-system \
  >"$PG/operator.log" 2>&1 &
echo $! >"$PG/operator.pid"

kubectl apply -f examples/job-lease.yaml >/dev/null
kubectl apply -f examples/leader-election.yaml >/dev/null
# No kubelet runs here: stand in for the Deployment's pods and mark them Ready.
for i in 0 1 2; do
  kubectl run "web-$i" --image=registry.example/web:1.0 --labels=app=web --restart=Never >/dev/null
  kubectl patch pod "web-$i" --subresource=status --type=merge \
    -p '{"status":{"conditions":[{"type":"Ready","status":"True"}]}}' >/dev/null
done

for _ in $(seq 1 60); do
  held=$(kubectl get tl -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c '^Held$' || true)
  [ "$held" -ge 2 ] && break
  sleep 0.5
done

echo
echo "== kubectl get tl"
kubectl get tl
echo
echo "== the elected leader pod"
kubectl get pods -l targetlease.dev/leader=true -L targetlease.dev/leader \
  -o custom-columns='POD:.metadata.name,TOKEN:.metadata.annotations.targetlease\.dev/fencing-token'
echo
echo "== a script holding a lease with targetlease run"
"$TL" run --target nightly-report --owner "${USER:-me}@playground" --ttl 10s -- \
  sh -c 'echo "  running with fencing token $TARGETLEASE_FENCING_TOKEN on $TARGETLEASE_TARGET"' || true
cat <<MSG

Try it:
  export KUBECONFIG=$KUBECONFIG TARGETLEASE_VALKEY_URL=$TARGETLEASE_VALKEY_URL
  kubectl delete tl orders-db-job-1 && kubectl get tl      # the waiter takes over with a larger token
  kubectl delete pod web-0 && kubectl get tl web-leader    # leadership moves to the next Ready pod
  $TL lease get --target orders-db
Logs: $PG/operator.log
Clean up: scripts/playground.sh stop
MSG
