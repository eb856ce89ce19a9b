use super::*;

fn held(holder: &str) -> TargetLeaseStatus {
    TargetLeaseStatus {
        phase: Some(Phase::Held),
        holder: Some(holder.into()),
        fencing_token: Some(7),
        acquisition_id: Some("a1".into()),
        observed_generation: Some(1),
        ..Default::default()
    }
}

fn holder(owner: &str) -> Desired {
    Desired::Holder {
        owner: owner.into(),
        pod: None,
    }
}

fn pod_holder(owner: &str, uid: &str) -> Desired {
    Desired::Holder {
        owner: owner.into(),
        pod: Some(PodRef {
            name: owner.into(),
            uid: uid.into(),
        }),
    }
}

fn nobody(reason: Reason) -> Desired {
    Desired::Nobody {
        reason,
        message: "m".into(),
    }
}

fn observed(status: &TargetLeaseStatus, desired: Desired) -> Observed<'_> {
    Observed {
        status,
        generation: Some(1),
        desired,
        queued_behind: None,
        held_elsewhere: None,
        renew_due: false,
        rotation_due: false,
        acquisition: status.acquisition_id.is_some(),
    }
}

#[test]
fn a_new_resource_records_an_attempt_before_acquiring() {
    let st = TargetLeaseStatus::default();
    assert_eq!(plan(&observed(&st, holder("job"))), Step::RecordAcquisition);
    // The implicit first attempt (derived from the UID) needs no write first.
    let mut o = observed(&st, holder("job"));
    o.acquisition = true;
    assert_eq!(
        plan(&o),
        Step::Acquire {
            owner: "job".into()
        }
    );
    let st = TargetLeaseStatus {
        acquisition_id: Some("a1".into()),
        ..Default::default()
    };
    assert_eq!(
        plan(&observed(&st, holder("job"))),
        Step::Acquire {
            owner: "job".into()
        }
    );
}

#[test]
fn a_held_lease_renews_when_due_when_the_spec_changed_or_when_unconfirmed() {
    let renew = || Step::Renew {
        lease: Recorded {
            owner: "job".into(),
            acquisition: "a1".into(),
            token: 7,
        },
    };
    let st = held("job");
    let mut o = observed(&st, holder("job"));
    assert_eq!(plan(&o), Step::Idle);
    o.renew_due = true;
    assert_eq!(plan(&o), renew());
    o.renew_due = false;
    o.generation = Some(2);
    assert_eq!(plan(&o), renew(), "a spec edit is applied at once");
    let mut st = held("job");
    st.phase = Some(Phase::Unknown);
    assert_eq!(plan(&observed(&st, holder("job"))), renew());
}

#[test]
fn a_holder_that_no_longer_qualifies_is_released_first() {
    let st = held("pod-a");
    assert!(matches!(
        plan(&observed(&st, holder("pod-b"))),
        Step::Release {
            reason: Reason::HolderChanged,
            ..
        }
    ));
    assert!(matches!(
        plan(&observed(&st, nobody(Reason::PodNotReady))),
        Step::Release {
            reason: Reason::PodNotReady,
            ..
        }
    ));
    assert!(matches!(
        plan(&observed(&st, nobody(Reason::InvalidSpec))),
        Step::Release {
            reason: Reason::InvalidSpec,
            ..
        }
    ));
}

#[test]
fn a_pod_recreated_under_the_same_name_is_a_new_holder() {
    let mut st = held("web-0");
    st.holder_pod = Some("web-0".into());
    st.holder_pod_uid = Some("uid-1".into());
    assert_eq!(
        plan(&observed(&st, pod_holder("web-0", "uid-1"))),
        Step::Idle
    );
    assert!(matches!(
        plan(&observed(&st, pod_holder("web-0", "uid-2"))),
        Step::Release {
            reason: Reason::HolderChanged,
            ..
        }
    ));
    // A status that names the pod but not its UID cannot show it is the same pod.
    st.holder_pod_uid = None;
    assert!(matches!(
        plan(&observed(&st, pod_holder("web-0", "uid-1"))),
        Step::Release {
            reason: Reason::HolderChanged,
            ..
        }
    ));
}

#[test]
fn a_lease_at_its_max_lifetime_is_replaced() {
    let st = held("job");
    let mut o = observed(&st, holder("job"));
    o.rotation_due = true;
    assert!(matches!(
        plan(&o),
        Step::Release {
            reason: Reason::MaxLifetimeReached,
            ..
        }
    ));
}

#[test]
fn a_release_in_progress_is_finished_before_anything_else() {
    let mut st = held("job");
    st.phase = Some(Phase::Pending);
    st.releasing_acquisition_id = Some("a0".into());
    let finish = Step::FinishRelease {
        lease: Recorded {
            owner: "job".into(),
            acquisition: "a0".into(),
            token: 7,
        },
    };
    assert_eq!(plan(&observed(&st, holder("job"))), finish);
    assert_eq!(plan_cleanup(&st, true), finish);
}

#[test]
fn a_release_that_records_no_lease_ends_without_asking_the_store() {
    let releasing = |holder: Option<&str>, token: Option<u64>| TargetLeaseStatus {
        phase: Some(Phase::Pending),
        holder: holder.map(str::to_owned),
        fencing_token: token,
        releasing_acquisition_id: Some("a0".into()),
        ..Default::default()
    };
    for st in [
        releasing(None, Some(7)),
        releasing(Some("job"), None),
        releasing(None, None),
    ] {
        assert_eq!(plan(&observed(&st, holder("job"))), Step::ForgetRelease);
        assert_eq!(plan_cleanup(&st, true), Step::ForgetRelease);
    }
}

#[test]
fn waiters_queue_behind_older_leases_and_drop_unwanted_attempts() {
    let st = TargetLeaseStatus::default();
    let mut o = observed(&st, holder("job"));
    o.queued_behind = Some("first".into());
    assert!(matches!(
        plan(&o),
        Step::Wait {
            reason: Reason::Queued,
            ..
        }
    ));
    let attempt = TargetLeaseStatus {
        acquisition_id: Some("a1".into()),
        ..Default::default()
    };
    let mut o = observed(&attempt, holder("job"));
    o.queued_behind = Some("first".into());
    assert_eq!(plan(&o), Step::Abandon);
    assert_eq!(
        plan(&observed(&attempt, nobody(Reason::PodNotReady))),
        Step::Abandon
    );
    assert!(matches!(
        plan(&observed(&st, nobody(Reason::PodNotReady))),
        Step::Wait {
            reason: Reason::PodNotReady,
            ..
        }
    ));
}

#[test]
fn lost_leases_start_over() {
    let mut st = held("job");
    st.phase = Some(Phase::Lost);
    st.acquisition_id = None;
    assert_eq!(plan(&observed(&st, holder("job"))), Step::RecordAcquisition);
}

#[test]
fn cleanup_releases_then_abandons_then_finalizes() {
    assert!(matches!(
        plan_cleanup(&held("job"), true),
        Step::Release {
            reason: Reason::Released,
            ..
        }
    ));
    let attempt = TargetLeaseStatus {
        acquisition_id: Some("a1".into()),
        ..Default::default()
    };
    assert_eq!(plan_cleanup(&attempt, false), Step::Abandon);
    assert_eq!(plan_cleanup(&attempt, true), Step::Finalize);
    // Even without a recorded attempt the store is looked at once.
    assert_eq!(
        plan_cleanup(&TargetLeaseStatus::default(), false),
        Step::Abandon
    );
    assert_eq!(
        plan_cleanup(&TargetLeaseStatus::default(), true),
        Step::Finalize
    );
}

#[test]
fn the_published_expiry_is_rewritten_when_it_is_later_than_valkeys_or_about_to_pass() {
    let r = Duration::from_secs(30);
    let m = expiry_margin(r);
    assert_eq!(m, Duration::from_secs(1));
    assert_eq!(
        expiry_margin(Duration::from_millis(400)),
        Duration::from_millis(100)
    );
    assert!(expiry_to_publish(None, 61_000, 1000, r, m));
    assert!(!expiry_to_publish(Some(60_000), 61_000, 1000, r, m));
    assert!(
        expiry_to_publish(Some(60_000), 7_000, 1000, r, m),
        "a shorter renewal moves the expiry earlier"
    );
    assert!(expiry_to_publish(Some(32_000), 61_000, 1000, r, m));
    assert!(!expiry_to_publish(Some(32_001), 61_000, 1000, r, m));
}

#[test]
fn failures_back_off_to_a_cap() {
    assert_eq!(backoff(0), Duration::from_millis(250));
    assert_eq!(backoff(1), Duration::from_millis(500));
    assert_eq!(backoff(6), Duration::from_secs(16));
    assert_eq!(backoff(7), Duration::from_secs(30));
    assert_eq!(backoff(100), Duration::from_secs(30));
}

#[test]
fn a_failed_reconcile_of_a_published_lease_retries_before_its_published_expiry() {
    let margin = Duration::from_millis(500);
    let floor = Duration::from_secs(1);
    // 10 s left: at most 9.5 s of backoff.
    assert_eq!(
        retry_cap(20_000, 10_000, margin, floor),
        Duration::from_millis(9_500)
    );
    // Passed, or about to: no point trying faster than the floor.
    assert_eq!(retry_cap(10_200, 10_000, margin, floor), floor);
    assert_eq!(retry_cap(5_000, 10_000, margin, floor), floor);
}

#[test]
fn waiters_retry_just_after_the_holder_expires_and_recheck_on_their_own() {
    assert_eq!(retry_after_held(10_000, 9_000), Duration::from_millis(1050));
    assert_eq!(retry_after_held(9_020, 9_000), Duration::from_millis(100));
    // Held past its expiry (a store without a clock keeps the record a
    // little longer): its deletion wakes the waiter; no tight loop meanwhile.
    assert_eq!(retry_after_held(0, 9_000), Duration::from_secs(1));
    assert_eq!(retry_after_held(9_000, 9_000), Duration::from_secs(1));
    assert_eq!(retry_after_held(u64::MAX, 0), Duration::from_secs(60));
    assert_eq!(recheck_after(Reason::Queued), Some(Duration::from_secs(30)));
    assert!(recheck_after(Reason::InvalidSpec).is_none());
}

#[test]
fn nobody_is_granted_a_target_another_targetlease_still_publishes_as_held() {
    let st = TargetLeaseStatus::default();
    let mut o = observed(&st, holder("job"));
    o.held_elsewhere = Some(HeldElsewhere {
        name: "old".into(),
        recheck: Duration::from_secs(7),
    });
    match plan(&o) {
        Step::Wait {
            reason,
            message,
            recheck,
        } => {
            assert_eq!(reason, Reason::TargetHeld);
            assert!(message.contains("TargetLease old"), "{message}");
            assert_eq!(
                recheck,
                Some(Duration::from_secs(7)),
                "at the sibling's expiry"
            );
        }
        other => panic!("{other:?}"),
    }
    let attempt = TargetLeaseStatus {
        acquisition_id: Some("a1".into()),
        ..Default::default()
    };
    let mut o = observed(&attempt, holder("job"));
    o.held_elsewhere = Some(HeldElsewhere {
        name: "old".into(),
        recheck: Duration::from_secs(7),
    });
    assert_eq!(
        plan(&o),
        Step::Abandon,
        "an attempt that may have reached the store is given back"
    );
    // The lease it holds itself is not affected (a sibling's Held is stale, not this one's).
    let held = TargetLeaseStatus {
        phase: Some(Phase::Held),
        holder: Some("job".into()),
        fencing_token: Some(3),
        acquisition_id: Some("a1".into()),
        ..Default::default()
    };
    let alone = plan(&observed(&held, holder("job")));
    let mut o = observed(&held, holder("job"));
    o.held_elsewhere = Some(HeldElsewhere {
        name: "old".into(),
        recheck: Duration::from_secs(7),
    });
    assert_eq!(plan(&o), alone);
    assert!(
        matches!(alone, Step::Idle | Step::Renew { .. }),
        "{alone:?}"
    );
}
