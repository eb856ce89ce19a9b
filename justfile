# Every entry point of this repository, one recipe each with what it is for.
# An index to read: `just RECIPE` runs one, but nothing needs `just` (each
# recipe is the command to type). tests/cli/index.rs fails when `.ci/run`, a
# script in scripts/ or tests/, a test target in tests/, the unit tests, a
# fuzz target, a workspace member with tests of its own, a bench target or
# a script in examples/ is missing here. What runs without a person has no
# recipe: build/protoc (cargo runs it, .cargo/config.toml), the helpers in
# scripts/lib/ (scripts/test.sh and scripts/setup.sh run them),
# contrib/argocd/health.lua (Argo CD runs it) and
# .github/workflows/release.yml (a version tag runs it).

# The two commands of the README.

# A local Valkey + kube-apiserver + etcd, the operator and the examples; prints `kubectl get tl`.
playground *args:
    scripts/playground.sh {{args}}

# The tests: fmt, clippy, and every test target against real servers (what CI runs).
test *args:
    scripts/test.sh {{args}}

# What CI runs on a fresh clone: the tests, with Cargo's cache outside the clone.
ci:
    bash .ci/run

# Scripts.

# Installs and builds every tool the tests and the playground need, into the tools directory.
setup *args:
    scripts/setup.sh {{args}}

# Builds the control plane (etcd, kube-apiserver, …) and test tools from Go modules.
build-controlplane *args:
    scripts/build-controlplane.sh {{args}}

# Rewrites the control plane module's replace block for a Kubernetes version (tests/controlplane/go.mod).
controlplane-replaces *args:
    tests/controlplane/gen-replaces.sh {{args}}

# Starts or stops a real control plane on loopback ports (`start DIR`, `stop DIR`).
controlplane *args:
    scripts/controlplane.sh {{args}}

# The fault matrix: quick (every scenario once), long runs, `fill` of docs/faults.md.
faults *args:
    scripts/faults.sh {{args}}

# Regenerates docs/benchmarks.md (store, operator at scale, CLI waiters).
bench *args:
    scripts/bench.sh {{args}}

# `.ci/run` the way a brand-new machine runs it: a fresh clone, empty caches.
fresh-ci *args:
    scripts/fresh-ci.sh {{args}}

# Starts or stops a one-node cluster (kubelet, containerd, CNI); needs root.
node *args:
    scripts/node.sh {{args}}

# Checks that the one-node cluster of scripts/node.sh runs pods, probes and Services.
node-smoke *args:
    scripts/node-smoke.sh {{args}}

# Builds the operator image as an OCI tarball, without Docker, and imports it into a node.
node-images *args:
    scripts/node-images.sh {{args}}

# Writes a one-layer OCI image from a directory (used by scripts/node-images.sh).
oci-image *args:
    python3 scripts/oci-image.py {{args}}

# The benchmarks alone, printed (scripts/bench.sh runs them and writes docs/benchmarks.md).
bench-run *args:
    cargo bench --bench targetlease -- {{args}}

# A fenced update of a ConfigMap: TOKEN CONFIGMAP KEY VALUE (docs/fencing.md).
fencing-kubernetes *args:
    examples/fencing/kubernetes.sh {{args}}

# Test targets, one at a time (`just test-cli crd` passes a name filter).

# The `targetlease` binary as users run it, and the committed CRD and docs it must match.
test-cli *args:
    cargo test --test cli -- {{args}}

# The lease protocol's contract, against the memory, Valkey and etcd backends.
test-contract *args:
    cargo test --test contract -- {{args}}

# The Valkey backend on real servers: protocol, ACL, TLS, Sentinel, Cluster, broken connections.
test-valkey *args:
    cargo test --test valkey -- {{args}}

# The Helm chart: render, lint, install and upgrade, RBAC and admission policies.
test-chart *args:
    cargo test --test chart -- {{args}}

# End to end on a real kube-apiserver + etcd and Valkey: the operator's promises, HA.
test-e2e *args:
    cargo test --test e2e -- {{args}}

# The PostgreSQL fencing recipe of examples/fencing/ against a real server.
test-fencing-postgresql *args:
    cargo test --test fencing_postgresql -- {{args}}

# The product's unit tests: pure planning and transitions, the executor's write order against a mocked API, the wire layer.
test-unit *args:
    cargo test --lib -- {{args}}

# Fuzzes the RESP decoder (fuzz/fuzz_targets/resp_decoder.rs) with libFuzzer on nightly; scripts/test.sh runs it for FUZZ_SECS.
fuzz-resp-decoder *args:
    RUSTUP_TOOLCHAIN=nightly cargo fuzz run resp_decoder fuzz/corpus/resp_decoder fuzz/seeds/resp_decoder -- {{args}}

# The fault matrix's checker (the targetlease-faults member's unit tests), on synthetic histories.
test-faults-checker *args:
    cargo test -p targetlease-faults -- {{args}}

# The fault matrix itself, quick mode (scripts/faults.sh drives its other modes).
test-faults *args:
    cargo test --features failpoints --test faults -- {{args}}

# On a real node: the image, the chart and every example; needs root (docs/node.md).
test-node *args:
    cargo test --test node -- {{args}}
