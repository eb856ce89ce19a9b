#!/usr/bin/env bash
# Generates the `replace` block that maps every k8s.io staging module to its
# published tag, derived from k8s.io/kubernetes' own go.mod (which pins them
# at v0.0.0 and replaces them with ./staging/src/... paths that do not exist
# outside the kubernetes repository).
#
# Usage: ./gen-replaces.sh [KUBERNETES_VERSION]   (default: the version in go.mod)
# Rewrites the replace directives of ./go.mod in place, then runs `go mod tidy`.
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"

K8S_VERSION="${1:-$(go mod edit -json | python3 -c 'import json,sys; print(next(r["Version"] for r in json.load(sys.stdin)["Require"] if r["Path"]=="k8s.io/kubernetes"))')}"
case "$K8S_VERSION" in
  v1.*) ;;
  *) echo "gen-replaces: expected a k8s.io/kubernetes version like v1.37.2, got '$K8S_VERSION'" >&2; exit 2 ;;
esac
# v1.MINOR.PATCH[-pre] -> v0.MINOR.PATCH[-pre]
STAGING_VERSION="v0.${K8S_VERSION#v1.}"

MOD_FILE="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"

# Every replace in kubernetes' go.mod whose target is a local ./staging path.
mapfile -t STAGING < <(go mod edit -json "$MOD_FILE" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"]["Path"].startswith("./staging/"):
        print(r["Old"]["Path"])
')
if [ "${#STAGING[@]}" -eq 0 ]; then
  echo "gen-replaces: found no staging replaces in $MOD_FILE" >&2; exit 1
fi

# Drop our previous k8s.io replaces, then add the generated ones.
for old in $(go mod edit -json | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["Old"]["Path"].startswith("k8s.io/"):
        print(r["Old"]["Path"])
'); do
  go mod edit -dropreplace="$old"
done
args=(-require="k8s.io/kubernetes@${K8S_VERSION}")
for m in "${STAGING[@]}"; do
  args+=(-replace="${m}=${m}@${STAGING_VERSION}")
done
go mod edit "${args[@]}"
echo "gen-replaces: k8s.io/kubernetes ${K8S_VERSION}: ${#STAGING[@]} staging modules -> ${STAGING_VERSION}" >&2
if [ "${GEN_REPLACES_NO_TIDY:-}" != 1 ]; then
  go mod tidy
fi
