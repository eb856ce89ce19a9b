//! On a real node (kubelet + containerd + runc + CNI, `scripts/node.sh`): the
//! chart's operator running as pods from a locally built image, real pods
//! elected by readiness, a Job receiving its token, the operator's leader
//! killed. One node for the whole binary; the tests take turns.
//!
//! Run as root: `cargo test --test node` (docs/node.md). If the node cannot
//! start, every test fails with the reason: nothing here skips.

#[allow(dead_code)] // each binary uses a part of the shared support
#[path = "../support/mod.rs"]
mod support;

mod chart;
mod fixture;
mod job;
mod leader_election;
