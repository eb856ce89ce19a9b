#!/usr/bin/env bash
# Starts / stops a one-node Kubernetes cluster on this machine: the control
# plane of scripts/controlplane.sh, plus kube-scheduler, the node's
# controllers (a second kube-controller-manager: EndpointSlices, ReplicaSets,
# Deployments, Jobs, node lifecycle), containerd with Debian's runc (or crun),
# a kubelet, and a private CNI bridge.
#
#   scripts/node.sh start DIR    start; writes DIR/kubeconfig, DIR/*.pid, DIR/*.log
#   scripts/node.sh stop DIR     stop everything started for DIR, remove its state
#   scripts/node.sh status DIR   exit 0 if the node in DIR is Ready
#
# Binaries come from ${TARGETLEASE_TOOLS_DIR:-$HOME/.cache/targetlease/bin}
# (built by `scripts/build-controlplane.sh node`, and `kube` for the control
# plane); runc or crun, busybox (busybox-static) and gcc from Debian.
#
# Everything is kept to DIR and to this machine: containerd's root and state,
# the runtime's state, the kubelet's root, pod logs, CNI config and IP
# allocations live under DIR; the API server, etcd, containerd's streaming
# server and the kubelet listen on 127.0.0.1 only (a socat forwards the
# bridge address's port 6443 to the API server, for pods); pods sit on a bridge of
# their own (tl<hash of DIR>) with a private /24, no default route and no
# masquerading, so they reach the host's bridge address and each other and
# nothing else. Cgroups go under /<cgroup>/targetlease-<hash of DIR>.
# Two things are shared with the rest of the machine, as containerd fixes them:
# the shims' sockets under /run/containerd/s/ (named by a hash of this
# containerd's address) and the cgroup v1 hierarchies themselves.
#
# Images: no registry is reachable, so `start` builds and imports two local
# images (scripts/oci-image.py): localhost/targetlease/pause:local (the
# upstream pause.c from the k8s.io/kubernetes module, compiled static; the
# sandbox image) and localhost/targetlease/busybox:local (Debian's static
# busybox, applets linked in /bin). More can be imported with
#   ctr --address DIR/containerd/containerd.sock -n k8s.io images import X.tar
#
# Environment:
#   NODE_WATCH_PID=PID        start a watchdog that stops everything as soon as
#                             PID exits or DIR is removed (the control plane
#                             started here watches the same PID)
#   NODE_CONTROLPLANE_DIR=D   reuse the running control plane of
#                             `scripts/controlplane.sh start D` instead of
#                             starting one in DIR/controlplane; `stop` leaves it
#   NODE_RUNTIME=runc|crun    the OCI runtime (default runc)
#   NODE_NAME=NAME            the Node's name (default localhost: see where it is set)
#   NODE_TIMEOUT=SECS         readiness timeout per step (default 180)
#
# Never `rm -rf DIR` while the node runs: containers' root filesystems, pod
# volumes and network namespaces are mounted under it. `stop` unmounts first.
set -euo pipefail

SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=lib/tools.sh
source "$(dirname "$SELF")/lib/tools.sh"
BIN="$TOOLS"
TIMEOUT="${NODE_TIMEOUT:-180}"
RUNTIME="${NODE_RUNTIME:-runc}"
# "localhost": the API server reaches a kubelet at its node's Hostname
# address first, and this one resolves to 127.0.0.1, where the kubelet
# listens, so `kubectl logs/exec/port-forward` work without the kubelet
# listening anywhere else.
NODE_NAME="${NODE_NAME:-localhost}"
PAUSE_IMAGE=localhost/targetlease/pause:local
BUSYBOX_IMAGE=localhost/targetlease/busybox:local
# What node.sh starts itself, clients before servers (the stop order).
COMPONENTS=(kubelet socat kube-scheduler kube-controller-manager containerd)

log() { echo "node: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Names derived from DIR alone, so `stop` and the watchdog find them even
# after DIR is gone.
dir_hash() { printf %s "$1" | sha256sum | cut -c1-8; }
bridge_name() { echo "tl$(dir_hash "$1")"; }
cgroup_name() { echo "targetlease-$(dir_hash "$1")"; }
sock() { echo "$1/containerd/containerd.sock"; }

# tail_logs_of, free_port, is_ours, stop_pid, kill_component, spawn, wait_until
# shellcheck source=lib/process.sh
source "$(dirname "$SELF")/lib/process.sh"

tail_logs() { tail_logs_of "$1" containerd kubelet kube-scheduler kube-controller-manager; }

started() { # DIR NAME SECS CMD... ; wait_until, or die with the logs
  local dir="$1" name="$2" secs="$3" rc=0
  wait_until "$@" || rc=$?
  [ "$rc" = 0 ] && return 0
  [ "$rc" = 2 ] && { explain_exit "$dir" "$name"; die "$name exited during startup (see $dir/$name.log)"; }
  tail_logs "$dir"
  die "$name was not ready within ${secs}s (see $dir/$name.log)"
}

kctl() { # DIR ARGS...
  local dir="$1"; shift
  "$BIN/kubectl" --kubeconfig "$dir/kubeconfig" "$@"
}

runtime_bin() {
  case "$RUNTIME" in
    runc) tool runc || die "runc not found" ;;
    crun) command -v crun || die "crun not found (apt-get install crun)" ;;
    *) die "NODE_RUNTIME must be runc or crun, not '$RUNTIME'" ;;
  esac
}

# A /24 under 10.88.0.0/16 that no interface or route of this machine uses.
pick_subnet() {
  local i
  for i in $(seq 0 255); do
    if ! ip -4 route show 2>/dev/null | grep -q "^10\.88\.$i\." \
      && ! ip -4 addr show 2>/dev/null | grep -q "inet 10\.88\.$i\."; then
      echo "10.88.$i"; return 0
    fi
  done
  die "no free /24 under 10.88.0.0/16"
}

setup_network() { # DIR
  local dir="$1" br net
  br="$(bridge_name "$dir")"
  net="$(cat "$dir/subnet")"
  # Made here rather than by the bridge plugin so the kubelet's node IP (the
  # bridge's address) exists before the first pod.
  ip link add "$br" type bridge
  ip addr add "$net.1/24" dev "$br"
  ip link set "$br" up
  mkdir -p "$dir/cni/net.d" "$dir/cni/bin" "$dir/cni/ipam"
  local p
  for p in bridge host-local loopback; do
    [ -x "$BIN/cni-$p" ] || die "$BIN/cni-$p not found. Build it with: scripts/build-controlplane.sh node"
    ln -sf "$BIN/cni-$p" "$dir/cni/bin/$p"
  done
  cat > "$dir/cni/net.d/10-targetlease.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "targetlease-$(dir_hash "$dir")",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$br",
      "isGateway": true,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$net.0/24", "rangeStart": "$net.10", "gateway": "$net.1"}]],
        "dataDir": "$dir/cni/ipam"
      }
    }
  ]
}
EOF
}

setup_cgroups() { # DIR
  local cg h
  cg="$(cgroup_name "$1")"
  for h in /sys/fs/cgroup/*/; do
    mkdir -p "$h$cg"
    # cgroup v1 cpuset: a new group starts with no CPUs and no memory nodes.
    if [ -f "$h/cpuset.cpus" ]; then
      cat "$h/cpuset.cpus" > "$h$cg/cpuset.cpus"
      cat "$h/cpuset.mems" > "$h$cg/cpuset.mems"
    fi
  done
}

write_containerd_config() { # DIR
  local dir="$1" rt
  rt="$(runtime_bin)"
  mkdir -p "$dir/containerd/root" "$dir/containerd/state" "$dir/runtime"
  cat > "$dir/containerd/config.toml" <<EOF
version = 3
root = "$dir/containerd/root"
state = "$dir/containerd/state"
# NRI and the plugins below want global paths or hardware this node has no use for.
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$(sock "$dir")"

[ttrpc]
  address = "$(sock "$dir").ttrpc"

[debug]
  level = "info"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"

[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = false
  cdi_spec_dirs = []
  netns_mounts_under_state_dir = true
  # No pod may get an oom_score_adj below containerd's own (0): lowering it
  # needs CAP_SYS_RESOURCE, which the sandboxes this runs in may not grant
  # (runc then fails every pod sandbox: "failed to update
  # /proc/self/oom_score_adj: Permission denied").
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$rt"
        Root = "$dir/runtime"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$dir/cni/bin"]
    conf_dir = "$dir/cni/net.d"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
}

start_containerd() { # DIR
  local dir="$1"
  write_containerd_config "$dir"
  : > "$dir/containerd.log"
  # The runc shim is found on PATH.
  PATH="$BIN:$PATH" spawn "$dir" containerd --config "$dir/containerd/config.toml"
  started "$dir" containerd "$TIMEOUT" "$BIN/ctr" --address "$(sock "$dir")" version
}

build_images() { # DIR
  local dir="$1" img="$dir/images" src
  command -v gcc >/dev/null || die "gcc not found (needed to compile the pause image)"
  [ -x "$BIN/busybox" ] && file -L "$BIN/busybox" 2>/dev/null | grep -q 'statically linked' \
    || die "$BIN/busybox is not a static busybox (run scripts/setup.sh)"
  src="$(cd "$REPO/tests/controlplane/kubelet" && GOWORK=off GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
  [ -f "$src" ] || die "pause.c not found at $src (go mod download in tests/controlplane/kubelet)"
  rm -rf "$img"; mkdir -p "$img/pause/rootfs" "$img/busybox/rootfs/bin" "$img/busybox/rootfs/tmp" \
    "$img/busybox/rootfs/etc"
  gcc -Os -static -s -DVERSION=targetlease -o "$img/pause/rootfs/pause" "$src"
  python3 "$REPO/scripts/oci-image.py" --out "$img/pause.tar" --name "$PAUSE_IMAGE" \
    --rootfs "$img/pause/rootfs" --entrypoint '["/pause"]' --user 65535:65535 2>>"$dir/images.log"
  cp -L "$BIN/busybox" "$img/busybox/rootfs/bin/busybox"
  local a
  for a in $("$BIN/busybox" --list); do
    [ "$a" = busybox ] || ln -s busybox "$img/busybox/rootfs/bin/$a"
  done
  chmod 1777 "$img/busybox/rootfs/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$img/busybox/rootfs/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' > "$img/busybox/rootfs/etc/group"
  python3 "$REPO/scripts/oci-image.py" --out "$img/busybox.tar" --name "$BUSYBOX_IMAGE" \
    --rootfs "$img/busybox/rootfs" --cmd '["/bin/sh"]' 2>>"$dir/images.log"
  rm -rf "$img/pause/rootfs" "$img/busybox/rootfs"
}

import_images() { # DIR
  local dir="$1" t
  for t in "$dir"/images/*.tar; do
    "$BIN/ctr" --address "$(sock "$dir")" -n k8s.io images import --local "$t" >>"$dir/images.log" 2>&1 \
      || { tail -n 20 "$dir/images.log" >&2; die "ctr images import $t failed"; }
  done
}

start_kube_controller_manager() { # DIR
  local dir="$1"
  : > "$dir/kube-controller-manager.log"
  # The control plane's own runs namespace deletion and garbage collection;
  # this one, what a node's workloads need.
  spawn "$dir" kube-controller-manager \
    --kubeconfig="$dir/kubeconfig" \
    --controllers=endpointslice-controller,endpoints-controller,replicaset-controller,deployment-controller,statefulset-controller,daemonset-controller,job-controller,disruption-controller,node-lifecycle-controller,pod-garbage-collector-controller,taint-eviction-controller,ttl-after-finished-controller,serviceaccount-controller,root-ca-certificate-publisher-controller \
    --root-ca-file="$(dirname "$(readlink -f "$dir/kubeconfig")")/pki/ca.crt" \
    --leader-elect=false \
    --secure-port=0 \
    --use-service-account-credentials=false
  sleep 1
  is_ours "$(cat "$dir/kube-controller-manager.pid")" kube-controller-manager \
    || { explain_exit "$dir" kube-controller-manager; die "kube-controller-manager exited during startup (see $dir/kube-controller-manager.log)"; }
}

# Pods reach the API server at the bridge address, port 6443: socat forwards
# it to the API server on 127.0.0.1 (there is no kube-proxy, so the
# `kubernetes` Service's ClusterIP leads nowhere). The serving certificate
# names the bridge address when node.sh started the control plane. Pods are
# told with KUBERNETES_SERVICE_HOST/PORT (explicit env wins over the
# kubelet's service variables).
start_apiserver_forwarder() { # DIR
  local dir="$1" addr port
  tool socat >/dev/null || die "socat not found"
  addr="$(cat "$dir/subnet").1"
  port="$(cat "$(readlink -f "$dir/kubeconfig" | xargs dirname)/kube-apiserver.port")"
  : > "$dir/socat.log"
  spawn "$dir" socat "TCP-LISTEN:6443,bind=$addr,reuseaddr,fork" "TCP:127.0.0.1:$port"
  echo "$addr:6443" > "$dir/apiserver.bridge"
  for _ in $(seq 1 50); do
    curl -sk --max-time 1 "https://$addr:6443/readyz" >/dev/null 2>&1 && return 0
    is_ours "$(cat "$dir/socat.pid")" socat || break
    sleep 0.1
  done
  explain_exit "$dir" socat; die "socat forwarder on $addr:6443 did not start"
}

start_kube_scheduler() { # DIR
  local dir="$1"
  : > "$dir/kube-scheduler.log"
  spawn "$dir" kube-scheduler \
    --kubeconfig="$dir/kubeconfig" \
    --authentication-kubeconfig="$dir/kubeconfig" \
    --authorization-kubeconfig="$dir/kubeconfig" \
    --leader-elect=false \
    --secure-port=0
  sleep 1
  is_ours "$(cat "$dir/kube-scheduler.pid")" kube-scheduler \
    || { explain_exit "$dir" kube-scheduler; die "kube-scheduler exited during startup (see $dir/kube-scheduler.log)"; }
}

write_kubelet_config() { # DIR CA PORT HEALTHZ_PORT
  local dir="$1" ca="$2" port="$3" hport="$4"
  mkdir -p "$dir/kubelet/root" "$dir/pod-logs"
  cat > "$dir/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts cgroup v1 hierarchies (plus an empty cgroup2 'unified').
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$(cgroup_name "$dir")
cgroupsPerQOS: true
enforceNodeAllocatable: ["pods"]
containerRuntimeEndpoint: unix://$(sock "$dir")
address: 127.0.0.1
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $hport
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: "$ca"}
authorization:
  mode: AlwaysAllow
podLogsDir: $dir/pod-logs
resolvConf: ""
hairpinMode: none
failSwapOn: false
maxPods: 30
# The disk is shared and may be fuller than the defaults (10%/15% free)
# allow; the images are local and must never be garbage-collected.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
  imagefs.inodesFree: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
}

healthz() { # PORT
  [ "$(curl -sS --max-time 2 "http://127.0.0.1:$1/healthz")" = ok ]
}

start_kubelet() { # DIR
  local dir="$1" ca port hport
  ca="$(dirname "$(readlink -f "$dir/kubeconfig")")/pki/ca.crt"
  port="$(free_port)"; hport="$(free_port)"
  write_kubelet_config "$dir" "$ca" "$port" "$hport"
  echo "$port" > "$dir/kubelet.port"
  : > "$dir/kubelet.log"
  spawn "$dir" kubelet \
    --config="$dir/kubelet/config.yaml" \
    --kubeconfig="$dir/kubeconfig" \
    --root-dir="$dir/kubelet/root" \
    --cert-dir="$dir/kubelet/pki" \
    --hostname-override="$NODE_NAME" \
    --node-ip="$(cat "$dir/subnet").1" \
    --oom-score-adj=0 \
    --v="${NODE_KUBELET_V:-1}"
  started "$dir" kubelet "$TIMEOUT" healthz "$hport"
  started "$dir" kubelet "$TIMEOUT" node_ready "$dir"
}

node_ready() { # DIR
  local name
  name="$(cat "$1/node.name" 2>/dev/null || echo "$NODE_NAME")"
  [ "$(kctl "$1" get node "$name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

start_watchdog() { start_watchdog_of "$1" "$2" NODE_WATCH_PID; }

cmd_watch() { # DIR PID
  local dir="$1" watch="$2" name pid seen=() entry
  while kill -0 "$watch" 2>/dev/null && [ -d "$dir" ]; do
    for name in "${COMPONENTS[@]}"; do
      pid="$(cat "$dir/$name.pid" 2>/dev/null || true)"
      case " ${seen[*]} " in *" $name:$pid "*) ;; *) [ -n "$pid" ] && seen+=("$name:$pid") ;; esac
    done
    sleep 1
  done
  log "watchdog: $( [ -d "$dir" ] && echo "pid $watch exited" || echo "$dir was removed"); stopping"
  for name in "${COMPONENTS[@]}"; do
    for entry in "${seen[@]}"; do
      [ "${entry%%:*}" = "$name" ] || continue
      [ "$name" = containerd ] && stop_containers "$dir"
      stop_pid "${entry#*:}" "$name"
    done
  done
  cmd_stop "$dir"
  return 0
}

# Every container of this node's runtime root, killed and deleted; then the
# shims serving this containerd (their command line names its socket).
stop_containers() { # DIR
  local dir="$1" rt root id pid s
  rt="$(cat "$dir/runtime.bin" 2>/dev/null || runtime_bin 2>/dev/null || true)"
  if [ -n "$rt" ]; then
    for root in "$dir"/runtime/*/; do
      [ -d "$root" ] || continue
      for id in $("$rt" --root "$root" list -q 2>/dev/null || true); do
        "$rt" --root "$root" delete --force "$id" >/dev/null 2>&1 || true
      done
    done
  fi
  s="$(sock "$dir")"
  for pid in $(shim_pids "$s"); do stop_pid "$pid" containerd-shim-runc-v2 5; done
}

shim_pids() { # SOCKET -> pids of the runc shims started by the containerd at SOCKET
  local f pid
  for f in /proc/[0-9]*/cmdline; do
    pid="${f#/proc/}"; pid="${pid%/cmdline}"
    tr '\0' '\n' 2>/dev/null < "$f" | grep -qxF -- "$1" || continue
    tr '\0' ' ' 2>/dev/null < "$f" | grep -q 'containerd-shim-runc-v2' && echo "$pid"
  done
  return 0
}

unmount_under() { # DIR
  local dir="$1" m
  for _ in 1 2 3; do
    mapfile -t mounts < <(awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r)
    [ "${#mounts[@]}" -gt 0 ] || return 0
    for m in "${mounts[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  done
}

# What the kubelet and containerd's CNI library write to fixed host paths,
# when the pods were not torn down one by one: the CNI result cache and the
# kubelet's /var/log/containers links, for this DIR's pods only.
forget_host_state() { # DIR
  local dir="$1" f
  for f in /var/lib/cni/results/*; do
    [ -f "$f" ] && grep -qF "\"netns\":\"$dir/" "$f" 2>/dev/null && rm -f "$f"
  done
  for f in /var/log/containers/*.log; do
    [ -L "$f" ] && case "$(readlink "$f")" in "$dir"/*) rm -f "$f" ;; esac
  done
  return 0
}

remove_cgroups() { # DIR
  local cg h pid
  cg="$(cgroup_name "$1")"
  # Whatever still runs in this node's cgroups (containers whose runtime state
  # went with DIR) is this node's: kill it, or the groups cannot go.
  if [ -d "/sys/fs/cgroup/pids/$cg" ]; then
    for pid in $(find "/sys/fs/cgroup/pids/$cg" -name cgroup.procs -exec cat {} + 2>/dev/null); do
      kill -KILL "$pid" 2>/dev/null || true
    done
  fi
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h$cg" ] || continue
    for _ in 1 2 3 4 5; do
      find "$h$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
      [ -d "$h$cg" ] || break
      sleep 0.5
    done
    [ -d "$h$cg" ] && log "could not remove cgroup $h$cg (processes left in it?)"
  done
  return 0
}

cmd_start() {
  local dir="$1" t0=$SECONDS b cp
  [ "$(id -u)" = 0 ] || die "must run as root (containers, mounts, bridges, cgroups)"
  local missing
  missing="$(missing_tools kubelet kube-scheduler kube-controller-manager kubectl containerd containerd-shim-runc-v2 ctr | tr '\n' ' ')"
  [ -z "$missing" ] || die "missing from $BIN: $missing(run scripts/setup.sh)"
  runtime_bin >/dev/null
  command -v ip >/dev/null || die "ip (iproute2) not found"
  if [ -e "$dir" ]; then
    [ -f "$dir/kubelet.pid" ] && die "$dir already holds a node; run: $0 stop $dir"
    [ -z "$(ls -A "$dir")" ] || die "$dir is not empty"
  fi
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  # Unix socket paths hold 107 bytes; the longest is containerd's ttrpc one.
  [ "${#dir}" -le 70 ] || { rmdir "$dir" 2>/dev/null || true; die "DIR path too long for containerd's sockets (${#dir} > 70 characters): $dir"; }
  touch "$dir/.created-by-node"
  # Whatever fails from here on, stop what was started (DIR expanded now: a
  # failing command under `set -e` leaves cmd_start's locals behind).
  trap "rc=\$?; if [ \$rc -ne 0 ]; then cmd_stop $(printf %q "$dir") >/dev/null 2>&1 || true; fi" EXIT
  if [ -n "${NODE_WATCH_PID:-}" ]; then start_watchdog "$dir" "$NODE_WATCH_PID"; fi
  runtime_bin > "$dir/runtime.bin"
  echo "$NODE_NAME" > "$dir/node.name"

  # The subnet first: the API server's certificate names the bridge address.
  pick_subnet > "$dir/subnet"
  if [ -n "${NODE_CONTROLPLANE_DIR:-}" ]; then
    cp="$(cd "$NODE_CONTROLPLANE_DIR" && pwd)"
    "$REPO/scripts/controlplane.sh" status "$cp" || die "no running control plane in $cp"
  else
    cp="$dir/controlplane"
    CONTROLPLANE_WATCH_PID="${NODE_WATCH_PID:-}" \
      CONTROLPLANE_APISERVER_SANS="IP:$(cat "$dir/subnet").1" CONTROLPLANE_SERVICE_ACCOUNTS=1 \
      "$REPO/scripts/controlplane.sh" start "$cp"
    touch "$dir/.owns-controlplane"
  fi
  ln -s "$cp/kubeconfig" "$dir/kubeconfig"
  echo "$cp" > "$dir/controlplane.dir"

  setup_network "$dir"
  setup_cgroups "$dir"
  build_images "$dir"
  start_containerd "$dir"
  import_images "$dir"
  start_kube_controller_manager "$dir"
  start_kube_scheduler "$dir"
  start_apiserver_forwarder "$dir"
  save_host_sysctls "$dir"
  start_kubelet "$dir"
  trap - EXIT
  log "ready in $((SECONDS - t0))s: node $NODE_NAME ($RUNTIME, pods on $(bridge_name "$dir") $(cat "$dir/subnet").0/24); kubeconfig: $dir/kubeconfig"
}

# The kernel settings the kubelet rewrites on the host when it starts (its
# container manager: overcommit, panic on oops/OOM, key quotas) and the one
# the CNI bridge plugin turns on (forwarding). Saved before the kubelet
# starts and put back by `stop`, so a node leaves the machine as it found it.
HOST_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward)

save_host_sysctls() { # DIR
  local k
  [ -f "$1/host-sysctls" ] && return 0
  for k in "${HOST_SYSCTLS[@]}"; do
    echo "$k=$(sysctl -n "$k")"
  done > "$1/host-sysctls"
}

restore_host_sysctls() { # DIR
  [ -f "$1/host-sysctls" ] || return 0
  sysctl -q -p "$1/host-sysctls" >/dev/null 2>&1 || log "could not restore every host sysctl in $1/host-sysctls"
}

cmd_stop() {
  local dir="$1" name
  [ -d "$dir" ] || { log "$dir does not exist; nothing to stop"; }
  if [ -d "$dir" ]; then
    dir="$(cd "$dir" && pwd)"
    [ -f "$dir/watchdog.pid" ] && stop_pid "$(cat "$dir/watchdog.pid")" __watch
    rm -f "$dir/watchdog.pid"
    for name in "${COMPONENTS[@]}"; do
      [ "$name" = containerd ] && stop_containers "$dir"
      kill_component "$dir" "$name"
    done
  fi
  stop_containers "$dir"
  unmount_under "$dir"
  ip link del "$(bridge_name "$dir")" 2>/dev/null || true
  forget_host_state "$dir"
  remove_cgroups "$dir"
  restore_host_sysctls "$dir"
  if [ -f "$dir/.owns-controlplane" ]; then
    "$REPO/scripts/controlplane.sh" stop "$dir/controlplane" || true
  fi
  if [ -f "$dir/.created-by-node" ]; then
    unmount_under "$dir"
    rm -rf "$dir"
  fi
}

cmd_status() {
  local dir="$1"
  [ -f "$dir/kubelet.pid" ] || die "no node in $dir"
  node_ready "$dir"
}

case "${1:-}" in
  start) [ $# -eq 2 ] || die "usage: $0 start DIR"; cmd_start "$2" ;;
  stop) [ $# -eq 2 ] || die "usage: $0 stop DIR"; cmd_stop "$2" ;;
  status) [ $# -eq 2 ] || die "usage: $0 status DIR"; cmd_status "$2" ;;
  __watch) [ $# -eq 3 ] || die "usage: $0 __watch DIR PID (internal)"; cmd_watch "$2" "$3" ;;
  *) echo "usage: $0 start|stop|status DIR" >&2; exit 2 ;;
esac
