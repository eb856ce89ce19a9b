#!/usr/bin/env bash
# Proves the one-node cluster of scripts/node.sh works: the node is Ready, a
# pod (busybox httpd, non-root, read-only root filesystem, no capabilities)
# becomes Ready through an HTTP readiness probe the kubelet sends over the
# pod network, a downward-API file appears inside the container and follows
# an annotation change, a Service's EndpointSlice lists the pod as ready, and
# a readiness failure inside the container takes it out again.
#
#   scripts/node-smoke.sh          start a node in a temporary DIR, check, stop it
#   scripts/node-smoke.sh DIR      check the node already running in DIR
#
# The container serves its downward-API files over HTTP, so the host reads
# them from the pod's address on the node's private bridge; `kubectl exec`
# reads the file too (API server -> kubelet on 127.0.0.1 -> containerd).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=lib/tools.sh
source "$REPO/scripts/lib/tools.sh"
BIN="$TOOLS"
NS=node-smoke
T0=$SECONDS

log() { echo "node-smoke: $*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

if [ $# -ge 1 ]; then
  DIR="$(cd "$1" && pwd)"
else
  DIR="$(mktemp -d /tmp/tl-node.XXXXXX)"
  rmdir "$DIR"
  trap '"$REPO/scripts/node.sh" stop "$DIR"' EXIT
  NODE_WATCH_PID=$$ "$REPO/scripts/node.sh" start "$DIR"
fi

k() {
  "$BIN/kubectl" --kubeconfig "$DIR/kubeconfig" "$@"
}

"$REPO/scripts/node.sh" status "$DIR" || fail "node in $DIR is not Ready"
log "node Ready"

# The ServiceAccount admission plugin is on (pods get their token volume):
# a bare pod is refused until the namespace's default ServiceAccount exists.
k create namespace "$NS" >/dev/null
t=$SECONDS
until k -n "$NS" get serviceaccount default >/dev/null 2>&1; do
  [ $((SECONDS - t)) -lt 30 ] || fail "no ServiceAccount default in $NS after 30s"
  sleep 0.2
done
k apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Namespace
metadata:
  name: node-smoke
---
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: node-smoke
  labels: {app: web}
  annotations: {targetlease.dev/token: "41"}
spec:
  terminationGracePeriodSeconds: 2
  securityContext:
    runAsNonRoot: true
    runAsUser: 65534
    runAsGroup: 65534
    seccompProfile: {type: RuntimeDefault}
  containers:
    - name: web
      image: localhost/targetlease/busybox:local
      imagePullPolicy: Never
      command:
        - /bin/sh
        - -c
        - |
          mkdir -p /tmp/www
          ln -s /etc/podinfo/token /tmp/www/token
          ln -s /etc/podinfo/labels /tmp/www/labels
          echo ok > /tmp/www/healthz
          exec httpd -f -p 8080 -h /tmp/www
      ports: [{name: http, containerPort: 8080}]
      readinessProbe:
        httpGet: {path: /healthz, port: http}
        periodSeconds: 1
      securityContext:
        readOnlyRootFilesystem: true
        allowPrivilegeEscalation: false
        capabilities: {drop: [ALL]}
      volumeMounts:
        - {name: podinfo, mountPath: /etc/podinfo}
        - {name: tmp, mountPath: /tmp}
  volumes:
    - name: podinfo
      downwardAPI:
        items:
          - path: token
            fieldRef: {fieldPath: "metadata.annotations['targetlease.dev/token']"}
          - path: labels
            fieldRef: {fieldPath: metadata.labels}
    - name: tmp
      emptyDir: {}
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: node-smoke
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
EOF

t=$SECONDS
k -n "$NS" wait --for=condition=Ready pod/web --timeout=120s >/dev/null \
  || { k -n "$NS" describe pod web >&2 || true; fail "pod web did not become Ready"; }
log "pod Ready through its readiness probe in $((SECONDS - t))s"

ip="$(k -n "$NS" get pod web -o jsonpath='{.status.podIP}')"
[ -n "$ip" ] || fail "pod web has no IP"
token() { curl -sS --max-time 2 "http://$ip:8080/token"; }
[ "$(token)" = 41 ] || fail "downward-API file /etc/podinfo/token reads '$(token || true)', want 41"
in_pod="$(k -n "$NS" exec web -- cat /etc/podinfo/token)" \
  || fail "kubectl exec into pod web failed"
[ "$in_pod" = 41 ] || fail "kubectl exec: /etc/podinfo/token reads '$in_pod', want 41"
log "downward-API file in the container: token=41 (over HTTP from $ip and by kubectl exec)"

# An annotation change reaches the file on the kubelet's next sync of the pod.
k -n "$NS" annotate pod web --overwrite targetlease.dev/token=42 >/dev/null
t=$SECONDS
until [ "$(token 2>/dev/null)" = 42 ]; do
  [ $((SECONDS - t)) -lt 150 ] || fail "token file still '$(token || true)' 150s after the annotation changed"
  sleep 0.5
done
log "annotation change reached the file in $((SECONDS - t))s"

t=$SECONDS
until [ "$(k -n "$NS" get endpointslices -l kubernetes.io/service-name=web \
  -o jsonpath='{range .items[*].endpoints[?(@.conditions.ready==true)]}{.addresses[0]}{"\n"}{end}')" = "$ip" ]; do
  [ $((SECONDS - t)) -lt 60 ] || { k -n "$NS" get endpointslices -o yaml >&2; fail "Service web's EndpointSlice does not list $ip as ready"; }
  sleep 0.5
done
log "Service web's EndpointSlice lists $ip as ready"

# A readiness failure inside the container: the pod turns unready and leaves
# the Service's ready endpoints.
k -n "$NS" exec web -- rm /tmp/www/healthz || fail "kubectl exec rm failed"
k -n "$NS" wait --for=condition=Ready=false pod/web --timeout=30s >/dev/null \
  || fail "pod web stayed Ready after its readiness endpoint went away"
t=$SECONDS
until [ -z "$(k -n "$NS" get endpointslices -l kubernetes.io/service-name=web \
  -o jsonpath='{range .items[*].endpoints[?(@.conditions.ready==true)]}{.addresses[0]}{end}')" ]; do
  [ $((SECONDS - t)) -lt 30 ] || fail "Service web's EndpointSlice still lists $ip as ready"
  sleep 0.5
done
log "readiness failure in the container: pod unready, gone from the ready endpoints"

k delete namespace "$NS" --wait=false >/dev/null
log "1 passed, 0 failed ($((SECONDS - T0))s)"
