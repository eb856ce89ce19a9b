use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::operator::crd::{Phase, TargetLeaseStatus};

const NOW_MS: u64 = 1_000_000;

/// A TargetLease published as Held until 60 s from now, renewed every 10 s.
fn held() -> TargetLease {
    let spec = serde_json::from_value(serde_json::json!({
        "target": "t",
        "holder": {"identity": "j"},
        "leaseDuration": "60s",
        "renewInterval": "10s",
    }));
    let mut tl = TargetLease::new("job", spec.unwrap());
    tl.metadata.namespace = Some("team".into());
    tl.metadata.resource_version = Some("7".into());
    tl.metadata.generation = Some(1);
    tl.status = Some(TargetLeaseStatus {
        phase: Some(Phase::Held),
        fencing_token: Some(3),
        holder: Some("j".into()),
        acquisition_id: Some("a".into()),
        observed_generation: Some(1),
        expires_at: Some(Time(
            Timestamp::from_millisecond(NOW_MS as i64 + 60_000).unwrap(),
        )),
        ..Default::default()
    });
    tl
}

fn remembered(due: Instant) -> Carryover {
    Carryover {
        known_version: Some("7".into()),
        renewal_at: Some(due),
        ..Default::default()
    }
}

#[test]
fn a_pod_or_a_wake_up_near_a_renewal_takes_a_slot_at_once() {
    let now = Instant::now();
    let tl = held();
    let quiet = remembered(now);
    let s = scheduled_renewal(&tl, &quiet, NOW_MS).expect("a renewal on its schedule");
    assert_eq!(
        (s.due, s.renew, s.ttl),
        (now, Duration::from_secs(10), Duration::from_secs(60))
    );
    assert!(
        plan::timing::slot_deadline(now, Some(s)) > now,
        "it may wait"
    );
    // Woken from outside (a pod change, a release, another lease): at once.
    let woken = Carryover {
        woken: true,
        ..remembered(now)
    };
    assert_eq!(scheduled_renewal(&tl, &woken, NOW_MS), None);
    // Changed since the last pass: at once.
    let stale = Carryover {
        known_version: Some("6".into()),
        ..remembered(now)
    };
    assert_eq!(scheduled_renewal(&tl, &stale, NOW_MS), None);
}

#[test]
fn a_map_key_finds_what_the_full_reference_finds_without_its_version_and_uid() {
    let mut tl = held();
    tl.metadata.uid = Some("uid-1".into());
    let full = ObjectRef::from_obj(&tl);
    let key = key_of(&tl);
    assert_eq!(key, full, "lookups treat them as one");
    assert_eq!(key.namespace.as_deref(), Some("team"));
    assert_eq!(key.name, "job");
    assert!(full.extra.resource_version.is_some() && full.extra.uid.is_some());
    assert_eq!(key.extra.resource_version, None);
    assert_eq!(key.extra.uid, None);
    let mut map = std::collections::HashMap::new();
    map.insert(key, ());
    assert!(map.contains_key(&full));
}
