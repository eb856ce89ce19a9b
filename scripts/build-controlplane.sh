#!/usr/bin/env bash
# Builds the test control plane binaries and test tools from Go modules:
#   etcd, kube-apiserver, kube-controller-manager  (tests/controlplane)
#   kubectl                                        (tests/controlplane/kubectl)
#   helm                                           (tests/controlplane/helm)
#   lua-health (Argo CD's Lua engine, gopher-lua)  (tests/controlplane/luahealth)
#   actionlint (checks .github/workflows)          (tests/controlplane/actionlint)
#   promtool (the chart's alerting-rule tests)     (tests/controlplane/promtool)
#   kubelet, kube-scheduler                        (tests/controlplane/kubelet)
#   containerd, containerd-shim-runc-v2, ctr and the
#   CNI plugins bridge, host-local, loopback (as
#   cni-bridge, cni-host-local, cni-loopback),
#                                                  (tests/controlplane/containerd)
#   etcd-lock, only when asked (the bench's peer)  (tests/controlplane/etcdlock)
# into ${TARGETLEASE_TOOLS_DIR:-$HOME/.cache/targetlease/bin}.
#
# Incremental: each group is rebuilt only when the hash of its inputs (go.mod,
# go.sum, *.go sources, Go version, build flags) differs from the stamp saved
# next to the binaries. Compilation reuses the Go build cache (`go env GOCACHE`)
# and module cache (`go env GOMODCACHE`), so a rebuild on a warm machine is
# mostly linking.
#
# Usage: scripts/build-controlplane.sh [kube|helm|luahealth|actionlint|promtool|kubectl|kubelet|containerd|node|etcdlock|all]
#        (default: all)
#        `all` is kube, kubectl, helm, luahealth, actionlint, promtool, kubelet and
#        containerd (`node` is the last two: what scripts/node.sh runs); etcdlock
#        only by scripts/bench.sh (the tests do not use it). kubectl is always
#        built, never taken from PATH: it must be the API server's minor version
#        (scripts/lib/tools.sh).
#        SETUP_TIMES=FILE appends `go-GROUP SECONDS` for each group built.
#        FORCE=1 scripts/build-controlplane.sh            rebuild regardless of stamps
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
SRC="$REPO/tests/controlplane"
BIN="${TARGETLEASE_TOOLS_DIR:-$HOME/.cache/targetlease/bin}"
WHAT="${1:-all}"

if ! command -v go >/dev/null 2>&1; then
  if [ -x /usr/local/go/bin/go ]; then
    export PATH="$PATH:/usr/local/go/bin"
  else
    echo "build-controlplane: 'go' not found (need Go >= 1.26)" >&2
    exit 1
  fi
fi

export CGO_ENABLED=0
# Do not let a go.work elsewhere, or GOFLAGS=-mod=vendor, change the build.
export GOWORK=off
export GOFLAGS="${GOFLAGS:-} -mod=readonly"
BUILD_FLAGS=(-trimpath)

mkdir -p "$BIN"

# Version stamps, as the upstream release builds set them (without them the
# apiserver reports v0.0.0-master and `helm version` a bare v3.22).
mod_version() { # DIR MODULE
  (cd "$1" && go list -m -f '{{.Version}}' "$2")
}
# Each binary is stamped with the Kubernetes release of the module it is
# built from (kubectl's own go.mod, not the API server's): the version check
# in scripts/setup.sh then compares what each binary really is.
kube_ldflags() { # DIR (the module the binary is built from)
  local v maj min
  v="$(mod_version "$1" k8s.io/kubernetes)"   # v1.37.2
  maj="${v#v}"; maj="${maj%%.*}"
  min="${v#v*.}"; min="${min%%.*}"
  local pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
      "$pkg" "$v" "$pkg" "$maj" "$pkg" "$min" "$pkg"
  done
  echo "-s -w"
}
containerd_ldflags() {
  local v
  v="$(mod_version "$SRC/containerd" github.com/containerd/containerd/v2)"
  echo "-X github.com/containerd/containerd/v2/version.Version=$v -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2 -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$(mod_version "$SRC/containerd" github.com/containernetworking/plugins) -s -w"
}
helm_ldflags() {
  echo "-X helm.sh/helm/v3/internal/version.version=$(mod_version "$SRC/helm" helm.sh/helm/v3) -s -w"
}

inputs_hash() { # DIR LDFLAGS -> hash of the module's inputs (excluding nested modules)
  local dir="$1"
  {
    go version
    echo "${BUILD_FLAGS[*]}${TAGS:+ -tags=$TAGS} -ldflags=$2 CGO_ENABLED=$CGO_ENABLED"
    cd "$dir"
    # Files of this module only: stop at nested go.mod directories.
    find . \( -path ./helm -prune -o -path ./luahealth -prune -o -path ./kubectl -prune -o -path ./actionlint -prune -o -path ./promtool -prune -o -path ./kubelet -prune -o -path ./containerd -prune -o -path ./etcdlock -prune \) -o -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) -print \
      | LC_ALL=C sort | xargs sha256sum
  } | sha256sum | cut -d' ' -f1
}

build_group() { # NAME DIR LDFLAGS PKG... (binaries named after the last path element, or OUT=name; TAGS=build tags)
  local name="$1" dir="$2" ldflags="$3"; shift 3
  local flags=("${BUILD_FLAGS[@]}" -tags="${TAGS:-}")
  local stamp="$BIN/.stamp-$name" want have="" missing=0 p
  want="$(inputs_hash "$dir" "$ldflags")"
  [ -f "$stamp" ] && have="$(cat "$stamp")"
  for p in "$@"; do [ -x "$BIN/$(out_name "$p")" ] || missing=1; done
  if [ "${FORCE:-}" != 1 ] && [ "$missing" = 0 ] && [ "$want" = "$have" ]; then
    echo "build-controlplane: $name up to date in $BIN"
    return 0
  fi
  echo "build-controlplane: building $name ($*) into $BIN ..."
  local start=$SECONDS tmp
  tmp="$(mktemp -d "$BIN/.build-$name.XXXXXX")"
  # Download first (only the modules these packages need) so a network
  # failure is reported as such.
  (cd "$dir" && go list -deps "${flags[@]:1}" "${@%%=*}" >/dev/null)
  if [[ "$*" == *=* ]]; then # named outputs: one package per build
    for p in "$@"; do
      (cd "$dir" && go build "${flags[@]}" -ldflags="$ldflags" -o "$tmp/$(out_name "$p")" "${p%%=*}")
    done
  else
    (cd "$dir" && go build "${flags[@]}" -ldflags="$ldflags" -o "$tmp/" "$@")
  fi
  for p in "$@"; do mv -f "$tmp/$(out_name "$p")" "$BIN/"; done
  rmdir "$tmp"
  echo "$want" > "$stamp"
  echo "build-controlplane: $name built in $((SECONDS - start))s"
  [ -z "${SETUP_TIMES:-}" ] || echo "go-$name $((SECONDS - start))" >>"$SETUP_TIMES"
}

out_name() { # PKG[=NAME] -> NAME, or the package's last path element
  case "$1" in *=*) echo "${1#*=}" ;; *) basename "$1" ;; esac
}

case "$WHAT" in
  kube|all) build_group kube "$SRC" "$(kube_ldflags "$SRC")" ./cmd/etcd ./cmd/kube-apiserver ./cmd/kube-controller-manager ;;&
  helm|all) build_group helm "$SRC/helm" "$(helm_ldflags)" helm.sh/helm/v3/cmd/helm ;;&
  luahealth|all) build_group luahealth "$SRC/luahealth" "-s -w" .=lua-health ;;&
  actionlint|all) build_group actionlint "$SRC/actionlint" "-s -w" github.com/rhysd/actionlint/cmd/actionlint ;;&
  # Prometheus' service-discovery plugins (and their cloud SDKs) left out.
  promtool|all) TAGS=remove_all_sd build_group promtool "$SRC/promtool" "-s -w" github.com/prometheus/prometheus/cmd/promtool ;;&
  kubectl|all) build_group kubectl "$SRC/kubectl" "$(kube_ldflags "$SRC/kubectl")" k8s.io/kubernetes/cmd/kubectl ;;&
  # The node (scripts/node.sh). The kubelet and the scheduler are upstream's
  # main packages, from a module with the API server's Kubernetes release and
  # replace block.
  kubelet|node|all) build_group kubelet "$SRC/kubelet" "$(kube_ldflags "$SRC/kubelet")" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler ;;&
  # no_btrfs: the btrfs snapshotter needs cgo and libbtrfs headers; overlayfs is used.
  containerd|node|all) TAGS=no_btrfs build_group containerd "$SRC/containerd" "$(containerd_ldflags)" \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr \
    github.com/containernetworking/plugins/plugins/main/bridge=cni-bridge \
    github.com/containernetworking/plugins/plugins/ipam/host-local=cni-host-local \
    github.com/containernetworking/plugins/plugins/main/loopback=cni-loopback ;;&
  etcdlock) build_group etcdlock "$SRC/etcdlock" "-s -w" .=etcd-lock ;;&
  kube|helm|luahealth|actionlint|promtool|kubectl|kubelet|containerd|node|etcdlock|all) ;;
  *) echo "usage: $0 [kube|helm|luahealth|actionlint|promtool|kubectl|kubelet|containerd|node|etcdlock|all]" >&2; exit 2 ;;
esac
