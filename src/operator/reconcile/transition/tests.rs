use super::*;
use crate::store::{Lease, Reply};

const NOW_MS: u64 = 1_000_000;

fn facts() -> Facts {
    Facts {
        generation: Some(2),
        now: time_ms(NOW_MS).unwrap(),
        server_now_ms: NOW_MS,
        me: "ns/tl".into(),
        deleting: false,
        renew_interval: Duration::from_secs(30),
        expiry_margin: Duration::from_secs(1),
        confirmed: None,
    }
}

fn lease(owner: &str, token: u64, expires_ms: u64) -> Lease {
    Lease {
        target: "t".into(),
        lease_id: None,
        owner: owner.into(),
        fencing_token: token,
        acquired_at_ms: NOW_MS - 1000,
        expires_at_ms: expires_ms,
        max_expires_at_ms: None,
        metadata: None,
    }
}

fn ours(mut l: Lease, acquisition: &str) -> Lease {
    let mut meta = serde_json::Map::new();
    meta.insert(META_TARGETLEASE.into(), "ns/tl".into());
    meta.insert(META_ACQUISITION.into(), acquisition.into());
    l.metadata = Some(meta);
    l
}

fn reply(outcome: Outcome, lease: Option<Lease>) -> Result<Reply, StoreError> {
    Ok(Reply {
        outcome,
        lease,
        server_time_ms: NOW_MS,
        message: "m".into(),
    })
}

fn down() -> Result<Reply, StoreError> {
    Err(StoreError::BackendUnavailable("refused".into()))
}

fn attempt() -> TargetLeaseStatus {
    TargetLeaseStatus {
        phase: Some(Phase::Pending),
        acquisition_id: Some("a1".into()),
        fencing_token: Some(6),
        observed_generation: Some(1),
        ..Default::default()
    }
}

fn held(expires_ms: u64) -> TargetLeaseStatus {
    TargetLeaseStatus {
        phase: Some(Phase::Held),
        holder: Some("job".into()),
        holder_pod: Some("job-pod".into()),
        holder_pod_uid: Some("u1".into()),
        fencing_token: Some(7),
        acquisition_id: Some("a1".into()),
        expires_at: time_ms(expires_ms),
        observed_generation: Some(2),
        ..Default::default()
    }
}

fn condition(s: &TargetLeaseStatus, type_: &str) -> (String, String) {
    let c = conditions::get(&s.conditions, type_).expect(type_);
    (c.status.clone(), c.reason.clone())
}

fn pod() -> PodRef {
    PodRef {
        name: "job-pod".into(),
        uid: "u1".into(),
    }
}

#[test]
fn acquire_outcomes() {
    let f = facts();
    let t = after_acquire(
        &f,
        &attempt(),
        "a1",
        Some(&pod()),
        reply(Outcome::Acquired, Some(lease("job", 7, NOW_MS + 90_000))),
    );
    assert_eq!(t.status.phase, Some(Phase::Held));
    assert_eq!(t.status.fencing_token, Some(7));
    assert_eq!(t.status.holder_pod_uid.as_deref(), Some("u1"));
    assert_eq!(t.status.expires_at, time_ms(NOW_MS + 90_000));
    assert_eq!(t.status.observed_generation, Some(2));
    assert_eq!(
        condition(&t.status, HELD),
        ("True".into(), "Acquired".into())
    );
    assert_eq!(t.next, Next::Renewal);
    assert_eq!(t.notes[0].reason, Reason::Acquired);
    assert!(matches!(t.learned, Learned::Confirmed { .. }));

    let t = after_acquire(
        &f,
        &attempt(),
        "a1",
        None,
        reply(Outcome::Held, Some(lease("cron", 3, NOW_MS + 10_000))),
    );
    assert_eq!(t.status.phase, Some(Phase::Pending));
    assert_eq!(t.status.acquisition_id.as_deref(), Some("a1"), "kept");
    assert_eq!(t.status.fencing_token, Some(6), "the last token stays");
    assert_eq!(condition(&t.status, HELD).1, "TargetHeld");
    assert_eq!(t.next, Next::Requeue(Duration::from_millis(10_050)));

    let t = after_acquire(
        &f,
        &attempt(),
        "a1",
        None,
        reply(
            Outcome::Held,
            Some(ours(lease("job", 5, NOW_MS + 10_000), "a0")),
        ),
    );
    assert_eq!(
        t.next,
        Next::Reclaim(Reclaim {
            owner: "job".into(),
            acquisition: "a0".into(),
            token: 5,
            then_forget_acquisition: false
        })
    );
    assert_eq!(t.status.phase, Some(Phase::Pending));

    for outcome in [Outcome::Expired, Outcome::IdempotencyConflict] {
        let t = after_acquire(&f, &attempt(), "a1", None, reply(outcome, None));
        assert_eq!(t.status.acquisition_id, None);
        assert_eq!(t.next, Next::PlanAgain);
    }

    let t = after_acquire(
        &f,
        &attempt(),
        "a1",
        None,
        reply(Outcome::CorruptState, None),
    );
    assert_eq!(t.status.phase, Some(Phase::Error));
    assert_eq!(
        condition(&t.status, HELD),
        ("Unknown".into(), "CorruptState".into())
    );
    assert_eq!(t.next, Next::Requeue(Duration::from_secs(60)));

    let t = after_acquire(
        &f,
        &attempt(),
        "a1",
        None,
        Err(StoreError::Invalid("target is 300 bytes".into())),
    );
    assert_eq!(t.status.phase, Some(Phase::Error));
    assert_eq!(
        condition(&t.status, SPEC_VALID),
        ("False".into(), "InvalidSpec".into())
    );
    assert_eq!(t.next, Next::AwaitChange);
}

#[test]
fn store_failures_flag_the_backend_once_per_outage_and_keep_the_attempt() {
    let f = facts();
    for err in [
        StoreError::BackendUnavailable("x".into()),
        StoreError::OutcomeUnknown("y".into()),
    ] {
        let t = after_acquire(&f, &attempt(), "a1", None, Err(err));
        assert_eq!(
            t.status.acquisition_id.as_deref(),
            Some("a1"),
            "replayed later"
        );
        assert_eq!(condition(&t.status, BACKEND_AVAILABLE).0, "False");
        assert_eq!(t.notes.len(), 1);
        assert_eq!(t.store_answered, Some(false));
        assert_eq!(t.next, Next::Backoff { not_after: None });
        let again = after_acquire(&f, &t.status, "a1", None, down());
        assert!(again.notes.is_empty(), "one Event per outage");
    }
}

#[test]
fn a_release_unpublishes_first_and_keeps_the_finalizer_until_confirmed() {
    let mut f = facts();
    let t = begin_release(&f, &held(NOW_MS + 60_000), Reason::PodNotReady, "gone");
    assert_eq!(t.status.phase, Some(Phase::Pending));
    assert_eq!(t.status.releasing_acquisition_id.as_deref(), Some("a1"));
    assert_eq!(t.status.acquisition_id, None);
    assert_eq!(t.status.holder.as_deref(), Some("job"), "names the lease");
    assert_eq!(t.status.expires_at, None);
    assert_eq!(
        condition(&t.status, HELD),
        ("False".into(), "PodNotReady".into())
    );
    // The keeper renews it until the withdrawal is acknowledged.
    assert_eq!(
        t.learned,
        Learned::Keep,
        "not forgotten before it is unpublished"
    );

    let failed = after_release(&f, &t.status, down());
    assert_eq!(
        failed.status.releasing_acquisition_id.as_deref(),
        Some("a1")
    );
    assert_eq!(failed.next, Next::Backoff { not_after: None });
    assert_eq!(failed.learned, Learned::Keep, "the release is retried");

    let done = after_release(&f, &t.status, reply(Outcome::Released, None));
    assert_eq!(done.status.releasing_acquisition_id, None);
    assert_eq!(done.status.holder, None);
    assert_eq!(done.status.fencing_token, Some(7));
    assert_eq!(condition(&done.status, HELD).1, "PodNotReady");
    assert_eq!(done.notes[0].reason, Reason::Released);
    assert!(done.wake_waiters);
    assert_eq!(done.learned, Learned::Forget, "released: nothing to keep");

    // A lease that had already ended is not reported as released.
    let gone = after_release(&f, &t.status, reply(Outcome::NotOwner, None));
    assert_eq!(gone.status.releasing_acquisition_id, None);
    assert_eq!(gone.notes[0].reason, Reason::LeaseLost);
    assert_eq!(gone.learned, Learned::Forget);

    f.deleting = true;
    let t = begin_release(&f, &held(NOW_MS + 60_000), Reason::Released, "deleted");
    assert_eq!(t.status.phase, Some(Phase::Released));
}

#[test]
fn an_abandoned_attempt_is_reclaimed_only_when_it_is_ours() {
    let f = facts();
    // Any live lease of this resource is unpublished here, whichever attempt made it.
    for acquisition in ["a1", "a0"] {
        let own = reply(
            Outcome::Found,
            Some(ours(lease("job", 8, NOW_MS + 9_000), acquisition)),
        );
        let t = after_abandon_read(&f, &attempt(), own);
        assert_eq!(
            t.next,
            Next::Reclaim(Reclaim {
                owner: "job".into(),
                acquisition: acquisition.into(),
                token: 8,
                then_forget_acquisition: true
            })
        );
    }
    for r in [
        reply(Outcome::Found, Some(lease("cron", 8, NOW_MS + 9_000))),
        reply(Outcome::NotFound, None),
    ] {
        let t = after_abandon_read(&f, &attempt(), r);
        assert_eq!(t.status.acquisition_id, None);
        assert!(t.forget_acquisition);
        assert_eq!(t.next, Next::PlanAgain);
    }
    let t = after_abandon_read(&f, &attempt(), down());
    assert_eq!(t.status.acquisition_id.as_deref(), Some("a1"));
}

#[test]
fn a_reclaim_frees_the_target_or_waits_for_a_lease_it_cannot_release() {
    let f = facts();
    let r = Reclaim {
        owner: "job".into(),
        acquisition: "a1".into(),
        token: 8,
        then_forget_acquisition: true,
    };
    let t = after_reclaim(&f, &attempt(), &r, reply(Outcome::Released, None));
    assert_eq!(t.status.acquisition_id, None);
    assert!(t.wake_waiters);
    let r = Reclaim {
        then_forget_acquisition: false,
        ..r
    };
    let t = after_reclaim(&f, &attempt(), &r, reply(Outcome::Released, None));
    assert_eq!(t.status.acquisition_id.as_deref(), Some("a1"));
    assert_eq!(t.next, Next::PlanAgain);
    let t = after_reclaim(&f, &attempt(), &r, reply(Outcome::NotOwner, None));
    assert_eq!(condition(&t.status, HELD).1, "TargetHeld");
    assert!(matches!(t.next, Next::Requeue(_)));
}

#[test]
fn waits_recheck_on_their_own_and_an_invalid_spec_is_an_error() {
    let f = facts();
    let t = wait(&f, &attempt(), Reason::Queued, "behind first");
    assert_eq!(t.status.phase, Some(Phase::Pending));
    assert_eq!(t.next, Next::Requeue(Duration::from_secs(30)));
    let t = wait(&f, &attempt(), Reason::InvalidSpec, "bad selector");
    assert_eq!(t.status.phase, Some(Phase::Error));
    assert_eq!(t.next, Next::AwaitChange);
    let checked = spec_checked(&f, &attempt(), &Err("bad selector".into()));
    assert_eq!(
        condition(&checked, SPEC_VALID),
        ("False".into(), "InvalidSpec".into())
    );
}

#[test]
fn a_pod_that_did_not_opt_in_is_a_warning_once_not_on_every_pass() {
    let f = facts();
    let why = "pod w has not opted in";
    let first = wait(&f, &attempt(), Reason::PodNotOptedIn, why);
    assert_eq!(first.status.phase, Some(Phase::Pending));
    assert_eq!(condition(&first.status, HELD).1, "PodNotOptedIn");
    let warnings: Vec<_> = first.notes.iter().map(|n| (n.warning, n.reason)).collect();
    assert_eq!(warnings, [(true, Reason::PodNotOptedIn)]);
    assert_eq!(first.next, Next::Requeue(Duration::from_secs(300)));
    let again = wait(&f, &first.status, Reason::PodNotOptedIn, why);
    assert!(again.notes.is_empty(), "no Event while nothing changed");
    // A holder that drops its opt-in: the release says why, once.
    let t = begin_release(&f, &held(NOW_MS + 60_000), Reason::PodNotOptedIn, why);
    assert_eq!(t.notes.len(), 1);
    assert!(
        wait(&f, &attempt(), Reason::PodNotReady, "not Ready")
            .notes
            .is_empty()
    );
}

#[test]
fn a_new_attempt_keeps_lost_visible_and_idle_changes_nothing() {
    let f = facts();
    let mut lost = held(NOW_MS);
    lost.phase = Some(Phase::Lost);
    lost.acquisition_id = None;
    let t = record_acquisition(&f, &lost, "a2".into());
    assert_eq!(t.status.phase, Some(Phase::Lost));
    assert_eq!(t.status.acquisition_id.as_deref(), Some("a2"));
    let t = record_acquisition(&f, &TargetLeaseStatus::default(), "a2".into());
    assert_eq!(t.status.phase, Some(Phase::Pending));
    assert_eq!(condition(&t.status, HELD).1, "Acquiring");

    let t = idle(&f, &held(NOW_MS + 60_000));
    assert_eq!(t.status, held(NOW_MS + 60_000));
}

#[test]
fn published_times_are_whole_seconds() {
    assert_eq!(time_ms(1_796_118_559_863), time_ms(1_796_118_559_000));
    assert_eq!(
        time_ms(1_796_118_559_863).unwrap().0.as_millisecond(),
        1_796_118_559_000
    );
}

/// Renewals and withdrawing Held in time.
mod hold;

#[test]
fn only_an_acquisition_of_a_pod_that_other_elections_select_warns_of_the_overlap() {
    let f = facts();
    let note = |reason| Note {
        warning: false,
        reason,
        message: "m".into(),
    };
    let with = |pod: Option<&str>, notes: Vec<Note>| {
        let mut t = idle(&f, &TargetLeaseStatus::default());
        t.status.holder_pod = pod.map(str::to_owned);
        t.notes = notes;
        t
    };
    // (holder pod, notes) -> the pod granted
    let cases = [
        (
            with(Some("web-0"), vec![note(Reason::Acquired)]),
            Some("web-0"),
        ),
        (with(Some("web-0"), vec![note(Reason::Released)]), None),
        (with(Some("web-0"), vec![]), None),
        (with(None, vec![note(Reason::Acquired)]), None),
    ];
    for (t, want) in &cases {
        assert_eq!(granted_pod(t), *want, "{:?}", t.notes);
    }
    assert_eq!(overlap_warning("web-0", &[]), None);
    let w = overlap_warning("web-0", &["a".into(), "b".into()]).unwrap();
    assert!(w.warning);
    assert_eq!(w.reason, Reason::OverlappingCandidates);
    assert!(
        w.message
            .starts_with("pod web-0 is also a candidate of a, b:"),
        "{}",
        w.message
    );
}

fn note(message: &str) -> Note {
    Note {
        warning: false,
        reason: Reason::Acquired,
        message: message.into(),
    }
}

#[test]
fn two_grants_never_share_an_action_and_a_repeat_does() {
    let first = event_action(&note("acquired by web-0 with fencing token 1"));
    let second = event_action(&note("acquired by web-1 with fencing token 2"));
    assert_ne!(first, second);
    assert_eq!(
        first,
        event_action(&note("acquired by web-0 with fencing token 1"))
    );
    assert!(first.len() <= 128, "the API's limit on an action");
}
