//! The queue of TargetLeases on one target (no client required).
//!
//! Leases on the same target are served in creation order (ties by name). A
//! TargetLease is in the queue while it wants the lease: not being deleted,
//! its spec valid and its holder qualifying (a Ready pod, for pod-tied
//! holders and elections). One that stops wanting it leaves the queue at
//! once; one that lost its lease keeps its place, it does not jump ahead.
//! The queue is read through [`super::index::LeaseIndex::queued_behind`].

use kube::ResourceExt;

use crate::operator::crd::{Phase, TargetLease};

/// Same namespace and target.
pub fn same_target(a: &TargetLease, b: &TargetLease) -> bool {
    a.namespace() == b.namespace() && a.spec.target == b.spec.target
}

/// Whether `o` may be in its target's queue at all (it is not being deleted
/// and its spec is not in error); whether it wants the lease is asked next.
pub fn may_queue(o: &TargetLease) -> bool {
    o.metadata.deletion_timestamp.is_none()
        && o.status.as_ref().and_then(|s| s.phase) != Some(Phase::Error)
}
