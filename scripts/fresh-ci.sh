#!/usr/bin/env bash
# Runs `.ci/run` the way a brand-new machine would: on a fresh clone of the
# current commit, with the tools directory, Cargo's target directory and
# registry, and Go's build and module caches all pointed at empty
# directories under DIR. (System packages from apt and pip are the one thing
# it cannot forget: on a machine that has them, their install time is not in
# the figure.) Prints the time breakdown `scripts/test.sh` ends with.
#
#   scripts/fresh-ci.sh [DIR]     cold run in DIR (default: a new /tmp/tl-fresh.*)
#   WARM=1 scripts/fresh-ci.sh DIR   a second run reusing DIR's caches (the warm figure)
#
# Needs about 15 GiB of disk in DIR. Everything it caches stays in DIR;
# remove DIR afterwards.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${1:-$(mktemp -d /tmp/tl-fresh.XXXXXX)}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
if [ "${WARM:-0}" != 1 ]; then
  [ -z "$(ls -A "$DIR")" ] || { echo "fresh-ci: $DIR is not empty (WARM=1 reuses it)" >&2; exit 2; }
fi
rm -rf "$DIR/clone"
git clone -q "$REPO" "$DIR/clone"
git -C "$DIR/clone" checkout -q "$(git -C "$REPO" rev-parse HEAD)"
export TARGETLEASE_TOOLS_DIR="$DIR/tools"
export CARGO_TARGET_DIR="$DIR/cargo-target"
export CARGO_HOME="$DIR/cargo-home"
export GOCACHE="$DIR/go-build"
export GOMODCACHE="$DIR/go-mod"
echo "fresh-ci: $(git -C "$DIR/clone" log -1 --format='%h %s') in $DIR ($([ "${WARM:-0}" = 1 ] && echo warm || echo cold))" >&2
start=$SECONDS
rc=0
(cd "$DIR/clone" && bash .ci/run) 2>&1 | tee "$DIR/ci-$([ "${WARM:-0}" = 1 ] && echo warm || echo cold).log" || rc=$?
echo "fresh-ci: .ci/run exited $rc after $((SECONDS - start)) s; log: $DIR/ci-*.log" >&2
exit "$rc"
