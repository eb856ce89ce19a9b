#!/usr/bin/env bash
# Starts / stops a real Kubernetes control plane (etcd + kube-apiserver, and
# kube-controller-manager when built) on free 127.0.0.1 ports, configured the
# way controller-runtime's envtest configures it.
#
#   scripts/controlplane.sh start DIR   start; writes DIR/kubeconfig, DIR/*.pid, DIR/*.log
#   scripts/controlplane.sh stop DIR    stop everything started for DIR, remove its data
#   scripts/controlplane.sh status DIR  exit 0 if the apiserver in DIR answers /readyz
#
# Binaries come from ${TARGETLEASE_TOOLS_DIR:-$HOME/.cache/targetlease/bin}
# (built by scripts/build-controlplane.sh).
#
# Environment:
#   CONTROLPLANE_WATCH_PID=PID   also start a watchdog that stops everything as
#                                soon as PID exits or DIR is removed (used by the
#                                Rust fixture so nothing outlives the test
#                                process); it keeps the pids in memory, so it
#                                does not need DIR to still exist
#   CONTROLPLANE_TIMEOUT=SECS    readiness timeout per component (default 120)
#   CONTROLPLANE_KCM=0|1         start kube-controller-manager (default: 1 if built)
#   CONTROLPLANE_OWN_DIR=1       DIR exists but is empty and belongs to us: `stop`
#                                removes it entirely
#   CONTROLPLANE_AUDIT=0|1       write the API server audit log DIR/audit.log
#                                (default 1): one JSON line per write to the
#                                resources the operator touches, and per list
#                                of pods, with the user, so tests can prove
#                                who wrote (or asked) what and when
#   CONTROLPLANE_APISERVER_SANS=L  more subjectAltName entries for the API
#                                server's certificate, e.g. IP:10.88.3.1 (the
#                                address scripts/node.sh forwards to it for pods)
#   CONTROLPLANE_SERVICE_ACCOUNTS=1  keep the ServiceAccount admission plugin on,
#                                so pods get their token volume (scripts/node.sh;
#                                the host-only tests create pods with no
#                                ServiceAccount to mount, so it is off by default)
#
# `start` on a DIR that does not exist creates it and `stop` then removes the
# whole DIR; on a pre-existing DIR, `stop` removes only what `start` created.
set -euo pipefail

SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
# shellcheck source=lib/tools.sh
source "$(dirname "$SELF")/lib/tools.sh"
BIN="$TOOLS"
TIMEOUT="${CONTROLPLANE_TIMEOUT:-120}"

log() { echo "controlplane: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# tail_logs_of, free_port, is_ours, stop_pid, kill_component, spawn, wait_until
# shellcheck source=lib/process.sh
source "$(dirname "$SELF")/lib/process.sh"

tail_logs() { tail_logs_of "$1" etcd kube-apiserver kube-controller-manager; }

port_clash() { # LOGFILE
  grep -qiE 'address already in use|bind: address' "$1" 2>/dev/null
}

gen_certs() { # DIR/pki
  local pki="$1"
  mkdir -p "$pki"
  (
    cd "$pki"
    umask 077
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -sha256 \
      -keyout ca.key -out ca.crt -subj "/CN=targetlease-test-ca" \
      -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
    # kube-apiserver serving certificate
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr \
      -subj "/CN=kube-apiserver" 2>/dev/null
    cat > apiserver.ext <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local${CONTROLPLANE_APISERVER_SANS:+,$CONTROLPLANE_APISERVER_SANS}
EXT
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -days 3650 -sha256 -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    # admin client certificate (system:masters bypasses RBAC)
    openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr \
      -subj "/O=system:masters/CN=targetlease-admin" 2>/dev/null
    cat > client.ext <<'EXT'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
EXT
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -days 3650 -sha256 -extfile client.ext -out admin.crt 2>/dev/null
    # service account token signing key pair
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
    openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr ./*.ext ca.srl
  ) || die "openssl failed to generate certificates in $pki"
}

write_kubeconfig() { # DIR PORT
  local dir="$1" port="$2"
  local ca crt key
  ca="$(base64 -w0 < "$dir/pki/ca.crt")"
  crt="$(base64 -w0 < "$dir/pki/admin.crt")"
  key="$(base64 -w0 < "$dir/pki/admin.key")"
  (umask 077; cat > "$dir/kubeconfig.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: targetlease-test
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority-data: $ca
users:
- name: admin
  user:
    client-certificate-data: $crt
    client-key-data: $key
contexts:
- name: targetlease-test
  context:
    cluster: targetlease-test
    user: admin
    namespace: default
current-context: targetlease-test
EOF
  )
  mv "$dir/kubeconfig.tmp" "$dir/kubeconfig"
}

readyz() { # DIR PORT
  local out
  out="$(curl -sS --max-time 5 --cacert "$1/pki/ca.crt" --cert "$1/pki/admin.crt" \
    --key "$1/pki/admin.key" "https://127.0.0.1:$2/readyz")" && [ "$out" = ok ]
}

start_etcd() { # DIR
  local dir="$1" attempt cport pport rc
  for attempt in 1 2 3; do
    cport="$(free_port)"; pport="$(free_port)"
    [ "$cport" != "$pport" ] || continue
    rm -rf "$dir/etcd-data"
    : > "$dir/etcd.log"
    spawn "$dir" etcd \
      --name=default \
      --data-dir="$dir/etcd-data" \
      --listen-client-urls="http://127.0.0.1:$cport" \
      --advertise-client-urls="http://127.0.0.1:$cport" \
      --listen-peer-urls="http://127.0.0.1:$pport" \
      --initial-advertise-peer-urls="http://127.0.0.1:$pport" \
      --initial-cluster="default=http://127.0.0.1:$pport" \
      --initial-cluster-state=new \
      --unsafe-no-fsync=true \
      --log-level=warn
    rc=0
    wait_until "$dir" etcd "$TIMEOUT" curl -fsS --max-time 2 "http://127.0.0.1:$cport/health" || rc=$?
    if [ "$rc" = 0 ]; then echo "$cport" > "$dir/etcd.port"; return 0; fi
    if [ "$rc" = 2 ] && port_clash "$dir/etcd.log"; then
      log "etcd: port $cport/$pport taken, retrying on other ports"; rm -f "$dir/etcd.pid"; continue
    fi
    if [ "$rc" = 2 ]; then
      explain_exit "$dir" etcd
      kill_component "$dir" etcd
      die "etcd exited during startup (see $dir/etcd.log)"
    fi
    kill_component "$dir" etcd
    tail_logs "$dir"; die "etcd did not become healthy within ${TIMEOUT}s"
  done
  tail_logs "$dir"; die "etcd: could not find free ports after 3 attempts"
}

# Metadata (who, what, when, response code) of every write to what the
# operator touches; reads and everything else are not logged.
write_audit_policy() { # DIR
  cat > "$1/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
    resources:
      - group: "targetlease.dev"
        resources: ["targetleases", "targetleases/status"]
      - group: ""
        resources: ["pods", "configmaps", "events"]
      - group: "coordination.k8s.io"
        resources: ["leases"]
      - group: "events.k8s.io"
        resources: ["events"]
  - level: Metadata
    verbs: ["list"]
    resources:
      - group: ""
        resources: ["pods"]
  - level: None
EOF
}

start_apiserver() { # DIR
  local dir="$1" attempt port rc etcd_port
  local audit=()
  etcd_port="$(cat "$dir/etcd.port")"
  local admission=(--disable-admission-plugins=ServiceAccount)
  [ "${CONTROLPLANE_SERVICE_ACCOUNTS:-0}" = 1 ] && admission=()
  if [ "${CONTROLPLANE_AUDIT:-1}" = 1 ]; then
    write_audit_policy "$dir"
    audit=(--audit-policy-file="$dir/audit-policy.yaml" --audit-log-path="$dir/audit.log"
      --audit-log-format=json --audit-log-mode=blocking --audit-log-maxbackup=0)
  fi
  for attempt in 1 2 3; do
    port="$(free_port)"
    : > "$dir/kube-apiserver.log"
    spawn "$dir" kube-apiserver \
      --advertise-address=127.0.0.1 \
      --bind-address=127.0.0.1 \
      --secure-port="$port" \
      --etcd-servers="http://127.0.0.1:$etcd_port" \
      --tls-cert-file="$dir/pki/apiserver.crt" \
      --tls-private-key-file="$dir/pki/apiserver.key" \
      --client-ca-file="$dir/pki/ca.crt" \
      --kubelet-client-certificate="$dir/pki/admin.crt" \
      --kubelet-client-key="$dir/pki/admin.key" \
      --authorization-mode=RBAC \
      --service-account-issuer="https://127.0.0.1:$port/" \
      --service-account-key-file="$dir/pki/sa.pub" \
      --service-account-signing-key-file="$dir/pki/sa.key" \
      "${admission[@]}" \
      --service-cluster-ip-range=10.0.0.0/24 \
      --allow-privileged=true \
      --endpoint-reconciler-type=none \
      --profiling=false \
      "${audit[@]}"
    rc=0
    wait_until "$dir" kube-apiserver "$TIMEOUT" readyz "$dir" "$port" || rc=$?
    if [ "$rc" = 0 ]; then echo "$port" > "$dir/kube-apiserver.port"; return 0; fi
    if [ "$rc" = 2 ] && port_clash "$dir/kube-apiserver.log"; then
      log "kube-apiserver: port $port taken, retrying on another port"; rm -f "$dir/kube-apiserver.pid"; continue
    fi
    if [ "$rc" = 2 ]; then
      explain_exit "$dir" kube-apiserver
      kill_component "$dir" kube-apiserver
      die "kube-apiserver exited during startup (see $dir/kube-apiserver.log)"
    fi
    kill_component "$dir" kube-apiserver
    tail_logs "$dir"; die "kube-apiserver did not answer /readyz within ${TIMEOUT}s"
  done
  tail_logs "$dir"; die "kube-apiserver: could not find a free port after 3 attempts"
}

start_kcm() { # DIR
  local dir="$1" rc=0
  : > "$dir/kube-controller-manager.log"
  # Only what tests need: namespace deletion and garbage collection.
  # --secure-port=0: no serving endpoint, so parallel control planes never clash.
  spawn "$dir" kube-controller-manager \
    --kubeconfig="$dir/kubeconfig" \
    --controllers=namespace-controller,garbage-collector-controller \
    --leader-elect=false \
    --secure-port=0 \
    --use-service-account-credentials=false \
    --concurrent-namespace-syncs=2
  # There is no readiness endpoint without a serving port; make sure it did not
  # exit straight away on bad flags.
  sleep 1
  if ! is_ours "$(cat "$dir/kube-controller-manager.pid")" kube-controller-manager; then
    explain_exit "$dir" kube-controller-manager
    die "kube-controller-manager exited during startup (see $dir/kube-controller-manager.log)"
  fi
}

start_watchdog() { start_watchdog_of "$1" "$2" CONTROLPLANE_WATCH_PID; }

# The watchdog: remembers every component pid it sees in DIR, in memory, so
# that it can stop them once PID exits or DIR disappears (a caller's cleanup
# may remove DIR before it stops anything: the pid files go with it).
cmd_watch() { # DIR PID
  local dir="$1" watch="$2" name pid seen=()
  while kill -0 "$watch" 2>/dev/null && [ -d "$dir" ]; do
    for name in kube-controller-manager kube-apiserver etcd; do
      pid="$(cat "$dir/$name.pid" 2>/dev/null || true)"
      case " ${seen[*]} " in *" $name:$pid "*) ;; *) [ -n "$pid" ] && seen+=("$name:$pid") ;; esac
    done
    sleep 1
  done
  log "watchdog: $( [ -d "$dir" ] && echo "pid $watch exited" || echo "$dir was removed"); stopping"
  # Clients before servers: kube-controller-manager, kube-apiserver, etcd.
  for name in kube-controller-manager kube-apiserver etcd; do
    for entry in "${seen[@]}"; do
      [ "${entry%%:*}" = "$name" ] || continue
      stop_pid "${entry#*:}" "$name"
    done
  done
  # What is left (pid files written after the last look, the data): `stop`
  # skips the watchdog's own pid, which this process still has.
  [ -d "$dir" ] && cmd_stop "$dir"
  return 0
}

cmd_start() {
  local dir="$1" t0=$SECONDS b
  for b in etcd kube-apiserver; do
    [ -x "$BIN/$b" ] || die "$BIN/$b not found. Build it with scripts/build-controlplane.sh (or set TARGETLEASE_TOOLS_DIR)"
  done
  command -v openssl >/dev/null || die "openssl not found"
  command -v curl >/dev/null || die "curl not found"
  if [ -e "$dir" ]; then
    [ -f "$dir/kube-apiserver.pid" ] && die "$dir already holds a control plane; run: $0 stop $dir"
    mkdir -p "$dir"
    if [ "${CONTROLPLANE_OWN_DIR:-}" = 1 ]; then
      [ -z "$(ls -A "$dir")" ] || die "CONTROLPLANE_OWN_DIR=1 but $dir is not empty"
      touch "$dir/.created-by-controlplane"
    fi
  else
    mkdir -p "$dir"
    touch "$dir/.created-by-controlplane"
  fi
  dir="$(cd "$dir" && pwd)"
  # Whatever fails from here on, stop what was started.
  trap 'rc=$?; if [ $rc -ne 0 ]; then cmd_stop "$dir" >/dev/null 2>&1 || true; fi' EXIT
  if [ -n "${CONTROLPLANE_WATCH_PID:-}" ]; then start_watchdog "$dir" "$CONTROLPLANE_WATCH_PID"; fi
  gen_certs "$dir/pki"
  start_etcd "$dir"
  start_apiserver "$dir"
  write_kubeconfig "$dir" "$(cat "$dir/kube-apiserver.port")"
  if [ "${CONTROLPLANE_KCM:-1}" = 1 ] && [ -x "$BIN/kube-controller-manager" ]; then
    start_kcm "$dir"
  fi
  trap - EXIT
  log "ready in $((SECONDS - t0))s: https://127.0.0.1:$(cat "$dir/kube-apiserver.port") (etcd 127.0.0.1:$(cat "$dir/etcd.port")); kubeconfig: $dir/kubeconfig"
}

cmd_stop() {
  local dir="$1"
  [ -d "$dir" ] || { log "$dir does not exist; nothing to stop"; return 0; }
  # Watchdog first, so it does not race us; then clients before servers.
  [ -f "$dir/watchdog.pid" ] && stop_pid "$(cat "$dir/watchdog.pid")" __watch
  rm -f "$dir/watchdog.pid"
  kill_component "$dir" kube-controller-manager
  kill_component "$dir" kube-apiserver
  kill_component "$dir" etcd
  if [ -f "$dir/.created-by-controlplane" ]; then
    rm -rf "$dir"
  else
    rm -rf "$dir/etcd-data" "$dir/pki" "$dir/kubeconfig" "$dir"/*.port \
      "$dir/audit-policy.yaml" "$dir"/audit*.log
  fi
}

cmd_status() {
  local dir="$1"
  [ -f "$dir/kube-apiserver.port" ] || die "no control plane in $dir"
  readyz "$dir" "$(cat "$dir/kube-apiserver.port")"
}

case "${1:-}" in
  start) [ $# -eq 2 ] || die "usage: $0 start DIR"; cmd_start "$2" ;;
  stop) [ $# -eq 2 ] || die "usage: $0 stop DIR"; cmd_stop "$2" ;;
  status) [ $# -eq 2 ] || die "usage: $0 status DIR"; cmd_status "$2" ;;
  __watch) [ $# -eq 3 ] || die "usage: $0 __watch DIR PID (internal)"; cmd_watch "$2" "$3" ;;
  *) echo "usage: $0 start|stop|status DIR" >&2; exit 2 ;;
esac
