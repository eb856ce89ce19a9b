#!/usr/bin/env bash
# Fenced update of a Kubernetes object (docs/fencing.md, "Kubernetes objects").
#
#   kubernetes.sh TOKEN CONFIGMAP KEY VALUE     (namespace: kubectl's current one,
#                                               or NAMESPACE=…)
#
# Writes KEY=VALUE into the ConfigMap only if TOKEN is not lower than the
# token of the last write (kept in the annotation targetlease.dev/fencing-token)
# and only if nobody wrote since we read: `kubectl replace` sends the
# resourceVersion we read, and the API server refuses the update (409) if the
# object changed meanwhile; then we read again and decide again.
# Exit 0 written, 1 refused (a newer token wrote), 2 any other error.
# Needs kubectl and jq. Tokens are compared as 64-bit integers.
set -euo pipefail
token="$1" name="$2" key="$3" value="$4"
ns=()
[ -n "${NAMESPACE:-}" ] && ns=(--namespace "$NAMESPACE")
err="$(mktemp)"
trap 'rm -f "$err"' EXIT
for _attempt in 1 2 3 4 5 6 7 8; do
  obj="$(kubectl "${ns[@]}" get configmap "$name" -o json)" || exit 2
  last="$(jq -r '.metadata.annotations["targetlease.dev/fencing-token"] // "0"' <<<"$obj")"
  if (( last > token )); then
    echo "refused: token $token is older than $last, which already wrote" >&2
    exit 1
  fi
  new="$(jq --arg t "$token" --arg k "$key" --arg v "$value" \
    '.metadata.annotations["targetlease.dev/fencing-token"] = $t | .data[$k] = $v' <<<"$obj")"
  if kubectl "${ns[@]}" replace -f - <<<"$new" >/dev/null 2>"$err"; then
    exit 0
  fi
  # Someone wrote between our read and our write: read again.
  grep -q "the object has been modified" "$err" || { cat "$err" >&2; exit 2; }
done
echo "gave up: the object keeps changing" >&2
exit 2
