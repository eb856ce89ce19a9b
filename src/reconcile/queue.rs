//! The queue of TargetLeases on one target (no client required).
//!
//! Leases on the same target are served in creation order (ties by name). A
//! TargetLease is in the queue while it wants the lease: not being deleted,
//! its spec valid and its holder qualifying (a Ready pod, for pod-tied
//! holders and elections). One that stops wanting it leaves the queue at
//! once; one that lost its lease keeps its place, it does not jump ahead.

use std::sync::Arc;

use kube::ResourceExt;

use crate::crd::{Phase, TargetLease};

/// Same namespace and target.
pub fn same_target(a: &TargetLease, b: &TargetLease) -> bool {
    a.namespace() == b.namespace() && a.spec.target == b.spec.target
}

/// The oldest TargetLease on `me`'s target, created before it, that wants the
/// lease (`wants` decides from the caches).
pub fn queued_behind(
    me: &TargetLease,
    leases: &[Arc<TargetLease>],
    wants: impl Fn(&TargetLease) -> bool,
) -> Option<String> {
    let mine = (me.creation_timestamp(), me.name_any());
    leases
        .iter()
        .filter(|o| same_target(o, me) && o.name_any() != me.name_any())
        .filter(|o| o.metadata.deletion_timestamp.is_none())
        .filter(|o| o.status.as_ref().and_then(|s| s.phase) != Some(Phase::Error))
        .filter(|o| (o.creation_timestamp(), o.name_any()) < mine)
        .filter(|o| wants(o))
        .min_by_key(|o| (o.creation_timestamp(), o.name_any()))
        .map(|o| o.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{TargetLeaseSpec, TargetLeaseStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn tl(name: &str, target: &str, created_s: i64) -> Arc<TargetLease> {
        let spec: TargetLeaseSpec = serde_json::from_value(
            serde_json::json!({"target": target, "holder": {"identity": name}}),
        )
        .unwrap();
        let mut t = TargetLease::new(name, spec);
        t.metadata.namespace = Some("ns".into());
        t.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created_s).unwrap()));
        Arc::new(t)
    }

    #[test]
    fn the_oldest_lease_that_wants_the_target_goes_first() {
        let me = tl("me", "t", 30);
        let mut error = (*tl("broken", "t", 5)).clone();
        error.status = Some(TargetLeaseStatus {
            phase: Some(Phase::Error),
            ..Default::default()
        });
        let leases = vec![
            tl("older", "t", 20),
            tl("oldest", "t", 10),
            tl("other-target", "u", 1),
            tl("newer", "t", 40),
            Arc::new(error),
            me.clone(),
        ];
        assert_eq!(
            queued_behind(&me, &leases, |_| true).as_deref(),
            Some("oldest")
        );
        // The oldest stops wanting the lease (its pod is not Ready): the next one is first.
        let wants = |o: &TargetLease| o.name_any() != "oldest";
        assert_eq!(queued_behind(&me, &leases, wants).as_deref(), Some("older"));
        assert_eq!(queued_behind(&me, &leases, |_| false), None);
        // Same second: ties go by name.
        let a = tl("a", "t", 30);
        assert_eq!(
            queued_behind(&me, &[a, me.clone()], |_| true).as_deref(),
            Some("a")
        );
    }
}
