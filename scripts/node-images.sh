#!/usr/bin/env bash
# Builds the targetlease operator image without a registry or a Docker
# engine, as an OCI image-layout tarball (scripts/oci-image.py), and, given a
# node of scripts/node.sh, imports it there.
#
#   scripts/node-images.sh BINARY OUTDIR [NODE_DIR]
#
#   ghcr.io/targetlease/targetlease:<appVersion of the chart>  (OUTDIR/targetlease.tar)
#       the name the chart and the examples use by default, so they need no
#       image setting: BINARY (stripped of debug info) as
#       /usr/local/bin/targetlease, the shared libraries `ldd BINARY` lists
#       at the paths it lists them (what distroless/cc provides), CA
#       certificates, an /etc/passwd naming nonroot 65532, lua/ and crds/
#       under /usr/share/targetlease; user 65532:65532, entrypoint
#       targetlease, cmd operator. No shell, no package manager. The
#       Dockerfile's runtime contract.
#
# Load the tarball into any cluster: `kind load image-archive`, `minikube
# image load`, `ctr -n k8s.io images import` (docs/install.md). With
# NODE_DIR it is imported into that node's containerd, and the node's busybox
# is also tagged `docker.io/library/busybox:1.36`, the stock image the
# examples name (the node cannot pull from a registry).
#
# BINARY is normally the debug build `cargo test` already makes
# (target/debug/targetlease): `cargo build --release` would compile every
# dependency a second time. What differs from the Dockerfile's image: the
# binary's profile (whatever BINARY is) and the distroless base (here, the
# host's own libraries and certificates).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=lib/tools.sh
source "$REPO/scripts/lib/tools.sh"
BIN="$TOOLS"
APP_VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$REPO/charts/targetlease/Chart.yaml")"
[ -n "$APP_VERSION" ] || { echo "node-images: no appVersion in charts/targetlease/Chart.yaml" >&2; exit 1; }
OPERATOR_IMAGE="ghcr.io/targetlease/targetlease:$APP_VERSION"
# The node's busybox (scripts/node.sh), under the stock name the examples use.
NODE_BUSYBOX=localhost/targetlease/busybox:local
STOCK_BUSYBOX=docker.io/library/busybox:1.36

log() { echo "node-images: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: $0 BINARY OUTDIR [NODE_DIR]" >&2; exit 2; }
binary="$1" out="$2" node="${3:-}"
[ -x "$binary" ] || die "$binary is not an executable (build it: cargo build --bin targetlease)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
t0=$SECONDS

# The binary and its runtime: the libraries the dynamic loader resolves, at
# the paths it resolves them (ld.so by its absolute path, the rest by theirs).
runtime_rootfs() { # ROOTFS
  local root="$1" lib
  mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/usr/share/targetlease"
  strip --strip-debug -o "$root/usr/local/bin/targetlease" "$binary"
  for lib in $(ldd "$binary" | awk '/=> \// { print $3 } /^\t\// { print $1 }'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  cp -r "$REPO/lua" "$REPO/crds" "$root/usr/share/targetlease/"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$root/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' > "$root/etc/group"
  mkdir -p "$root/tmp" "$root/home/nonroot"
  chmod 1777 "$root/tmp"
}

rm -rf "$out/operator"
runtime_rootfs "$out/operator"
python3 "$REPO/scripts/oci-image.py" --out "$out/targetlease.tar" --name "$OPERATOR_IMAGE" \
  --rootfs "$out/operator" --user 65532:65532 \
  --entrypoint '["/usr/local/bin/targetlease"]' --cmd '["operator"]' \
  --env PATH=/usr/local/bin:/usr/bin:/bin --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  --label org.opencontainers.image.title=targetlease
rm -rf "$out/operator"
log "built $OPERATOR_IMAGE in $((SECONDS - t0))s ($(du -h "$out/targetlease.tar" | cut -f1)): $out/targetlease.tar"

if [ -n "$node" ]; then
  t0=$SECONDS
  ctr=("$BIN/ctr" --address "$node/containerd/containerd.sock" -n k8s.io)
  "${ctr[@]}" images import --local "$out/targetlease.tar" >/dev/null \
    || die "ctr images import $out/targetlease.tar into the node in $node failed"
  "${ctr[@]}" images rm "$STOCK_BUSYBOX" >/dev/null 2>&1 || true
  "${ctr[@]}" images tag "$NODE_BUSYBOX" "$STOCK_BUSYBOX" >/dev/null \
    || die "ctr images tag $NODE_BUSYBOX $STOCK_BUSYBOX in the node in $node failed"
  log "imported into the node in $node in $((SECONDS - t0))s ($STOCK_BUSYBOX is the node's busybox)"
fi
