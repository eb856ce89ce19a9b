#!/usr/bin/env bash
# Builds the targetlease images for the node of scripts/node.sh, without a
# registry or a Docker engine, as OCI image-layout tarballs
# (scripts/oci-image.py), and imports them into that node's containerd.
#
#   scripts/node-images.sh BINARY OUTDIR [NODE_DIR]
#
#   localhost/targetlease/targetlease:local   the operator image: BINARY
#       (stripped of debug info) as /usr/local/bin/targetlease, the shared
#       libraries `ldd BINARY` lists at the paths it lists them (what
#       distroless/cc provides), CA certificates, an /etc/passwd naming
#       nonroot 65532, lua/ and crds/ under /usr/share/targetlease; user
#       65532:65532, entrypoint targetlease, cmd operator. No shell, no
#       package manager. The Dockerfile's runtime contract.
#   localhost/targetlease/demo:local          a workload image: Debian's static
#       busybox (sh, httpd, cat) plus the same targetlease binary and
#       libraries, for pods that script around the CLI (the Job test).
#
# BINARY is normally the debug build `cargo test` already makes
# (target/debug/targetlease): `cargo build --release` would compile every
# dependency a second time. What differs from the Dockerfile's image: the
# binary's profile (debug, with overflow checks and debug assertions on) and
# the distroless base (here, the host's own libraries and certificates).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=lib/tools.sh
source "$REPO/scripts/lib/tools.sh"
BIN="$TOOLS"
OPERATOR_IMAGE=localhost/targetlease/targetlease:local
DEMO_IMAGE=localhost/targetlease/demo:local

log() { echo "node-images: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: $0 BINARY OUTDIR [NODE_DIR]" >&2; exit 2; }
binary="$1" out="$2" node="${3:-}"
[ -x "$binary" ] || die "$binary is not an executable (build it: cargo build --bin targetlease)"
[ -x "$BIN/busybox" ] && file -L "$BIN/busybox" 2>/dev/null | grep -q 'statically linked' \
  || die "$BIN/busybox is not a static busybox (run scripts/setup.sh)"
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

rm -rf "$out/operator" "$out/demo"
runtime_rootfs "$out/operator"
python3 "$REPO/scripts/oci-image.py" --out "$out/targetlease.tar" --name "$OPERATOR_IMAGE" \
  --rootfs "$out/operator" --user 65532:65532 \
  --entrypoint '["/usr/local/bin/targetlease"]' --cmd '["operator"]' \
  --env PATH=/usr/local/bin:/usr/bin:/bin --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  --label org.opencontainers.image.title=targetlease

runtime_rootfs "$out/demo"
mkdir -p "$out/demo/bin"
cp -L "$BIN/busybox" "$out/demo/bin/busybox"
for a in $("$BIN/busybox" --list); do
  [ "$a" = busybox ] || ln -sf busybox "$out/demo/bin/$a"
done
python3 "$REPO/scripts/oci-image.py" --out "$out/demo.tar" --name "$DEMO_IMAGE" \
  --rootfs "$out/demo" --user 65532:65532 --cmd '["/bin/sh"]' \
  --env PATH=/usr/local/bin:/usr/bin:/bin
rm -rf "$out/operator" "$out/demo"
log "built $OPERATOR_IMAGE and $DEMO_IMAGE in $((SECONDS - t0))s ($(du -h "$out/targetlease.tar" | cut -f1) and $(du -h "$out/demo.tar" | cut -f1))"

if [ -n "$node" ]; then
  t0=$SECONDS
  for t in "$out/targetlease.tar" "$out/demo.tar"; do
    "$BIN/ctr" --address "$node/containerd/containerd.sock" -n k8s.io images import --local "$t" >/dev/null \
      || die "ctr images import $t into the node in $node failed"
  done
  log "imported into the node in $node in $((SECONDS - t0))s"
fi
