#!/usr/bin/env bash
# The test command: installs what is missing, then formatting, lints and every
# test against real Valkey servers and a real kube-apiserver + etcd.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
eval "$(scripts/setup.sh)"
cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings
# Every test target, including the fault matrix's quick mode (the `faults`
# target: every scenario and positive control once; see scripts/faults.sh).
cargo test --locked --all-targets --no-fail-fast "$@"
