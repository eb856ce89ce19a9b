//! On a real node (kubelet + containerd + runc + CNI, `scripts/node.sh`),
//! the path docs/install.md gives any cluster: the operator image built by
//! the project's own OCI builder, the chart installed with it, then every
//! example in examples/ run to completion (or to holding) with its fencing
//! token, and the operator's leader killed. One node for the whole binary;
//! the tests take turns.
//!
//! Run as root: `cargo test --test node` (docs/node.md). If the node cannot
//! start, every test fails with the reason: nothing here skips.

use targetlease_test_support as support;

mod chart;
mod examples;
mod fixture;
mod leader_election;
