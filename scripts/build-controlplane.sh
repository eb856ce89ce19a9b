#!/usr/bin/env bash
# Builds the test control plane binaries and test tools from Go modules:
#   etcd, kube-apiserver, kube-controller-manager  (tests/controlplane)
#   kubectl, only when asked                       (tests/controlplane/kubectl)
#   helm                                           (tests/controlplane/helm)
#   lua-health (Argo CD's Lua engine, gopher-lua)  (tests/controlplane/luahealth)
#   actionlint (checks .github/workflows)          (tests/controlplane/actionlint)
#   etcd-lock, only when asked (the bench's peer)  (tests/controlplane/etcdlock)
# into ${TARGETLEASE_TOOLS_DIR:-$HOME/.cache/targetlease/bin}.
#
# Incremental: each group is rebuilt only when the hash of its inputs (go.mod,
# go.sum, *.go sources, Go version, build flags) differs from the stamp saved
# next to the binaries. Compilation reuses the Go build cache (`go env GOCACHE`)
# and module cache (`go env GOMODCACHE`), so a rebuild on a warm machine is
# mostly linking.
#
# Usage: scripts/build-controlplane.sh [kube|helm|luahealth|actionlint|kubectl|etcdlock|all]   (default: all)
#        `all` is kube, helm, luahealth and actionlint; kubectl is built only when asked
#        (scripts/setup.sh asks when the machine has no kubectl), etcdlock only by
#        scripts/bench.sh (the tests do not use it).
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
kube_ldflags() {
  local v maj min
  v="$(mod_version "$SRC" k8s.io/kubernetes)"   # v1.37.2
  maj="${v#v}"; maj="${maj%%.*}"
  min="${v#v*.}"; min="${min%%.*}"
  local pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
      "$pkg" "$v" "$pkg" "$maj" "$pkg" "$min" "$pkg"
  done
  echo "-s -w"
}
helm_ldflags() {
  echo "-X helm.sh/helm/v3/internal/version.version=$(mod_version "$SRC/helm" helm.sh/helm/v3) -s -w"
}

inputs_hash() { # DIR LDFLAGS -> hash of the module's inputs (excluding nested modules)
  local dir="$1"
  {
    go version
    echo "${BUILD_FLAGS[*]} -ldflags=$2 CGO_ENABLED=$CGO_ENABLED"
    cd "$dir"
    # Files of this module only: stop at nested go.mod directories.
    find . \( -path ./helm -prune -o -path ./luahealth -prune -o -path ./kubectl -prune -o -path ./actionlint -prune -o -path ./etcdlock -prune \) -o -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) -print \
      | LC_ALL=C sort | xargs sha256sum
  } | sha256sum | cut -d' ' -f1
}

build_group() { # NAME DIR LDFLAGS PKG... (binaries named after the last path element, or OUT=name)
  local name="$1" dir="$2" ldflags="$3"; shift 3
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
  # Download first so a network failure is reported as such.
  (cd "$dir" && go mod download)
  if [[ "$*" == *=* ]]; then # named outputs: one package per build
    for p in "$@"; do
      (cd "$dir" && go build "${BUILD_FLAGS[@]}" -ldflags="$ldflags" -o "$tmp/$(out_name "$p")" "${p%%=*}")
    done
  else
    (cd "$dir" && go build "${BUILD_FLAGS[@]}" -ldflags="$ldflags" -o "$tmp/" "$@")
  fi
  for p in "$@"; do mv -f "$tmp/$(out_name "$p")" "$BIN/"; done
  rmdir "$tmp"
  echo "$want" > "$stamp"
  echo "build-controlplane: $name built in $((SECONDS - start))s"
}

out_name() { # PKG[=NAME] -> NAME, or the package's last path element
  case "$1" in *=*) echo "${1#*=}" ;; *) basename "$1" ;; esac
}

case "$WHAT" in
  kube|all) build_group kube "$SRC" "$(kube_ldflags)" ./cmd/etcd ./cmd/kube-apiserver ./cmd/kube-controller-manager ;;&
  helm|all) build_group helm "$SRC/helm" "$(helm_ldflags)" helm.sh/helm/v3/cmd/helm ;;&
  luahealth|all) build_group luahealth "$SRC/luahealth" "-s -w" .=lua-health ;;&
  actionlint|all) build_group actionlint "$SRC/actionlint" "-s -w" github.com/rhysd/actionlint/cmd/actionlint ;;&
  kubectl) build_group kubectl "$SRC/kubectl" "$(kube_ldflags)" k8s.io/kubernetes/cmd/kubectl ;;&
  etcdlock) build_group etcdlock "$SRC/etcdlock" "-s -w" .=etcd-lock ;;&
  kube|helm|luahealth|actionlint|kubectl|etcdlock|all) ;;
  *) echo "usage: $0 [kube|helm|luahealth|actionlint|kubectl|etcdlock|all]" >&2; exit 2 ;;
esac
