//! Renewals, and withdrawing `Held` in time (helpers in `../tests.rs`).

use super::*;

#[test]
fn renewals_never_leave_a_later_expiry_published() {
    let f = facts();
    let far = NOW_MS + 60_000;
    // A renewal that extends the lease: status is not rewritten.
    let t = after_renew(
        &f,
        &held(far),
        reply(Outcome::Renewed, Some(lease("job", 7, NOW_MS + 90_000))),
    );
    assert_eq!(t.status.expires_at, time_ms(far));
    // A renewal with a shorter duration moves Valkey's expiry earlier: republished.
    let t = after_renew(
        &f,
        &held(far),
        reply(Outcome::Renewed, Some(lease("job", 7, NOW_MS + 6_000))),
    );
    assert_eq!(t.status.expires_at, time_ms(NOW_MS + 6_000));
    assert_eq!(t.status.phase, Some(Phase::Held));
    assert_eq!(t.next, Next::Renewal);
}

#[test]
fn a_renewal_that_finds_the_lease_gone_publishes_lost() {
    let f = facts();
    for outcome in [Outcome::Expired, Outcome::NotOwner] {
        let t = after_renew(&f, &held(NOW_MS + 60_000), reply(outcome, None));
        assert_eq!(t.status.phase, Some(Phase::Lost));
        assert_eq!(t.status.acquisition_id, None);
        assert_eq!(t.status.expires_at, None);
        assert_eq!(t.status.fencing_token, Some(7));
        assert_eq!(t.learned, Learned::Forget);
        assert!(t.wake_waiters);
        assert_eq!(t.notes[0].reason, Reason::LeaseLost);
    }
}

#[test]
fn held_is_withdrawn_when_the_store_is_silent_past_the_published_expiry() {
    let f = facts();
    let t = after_renew(&f, &held(NOW_MS + 5_000), down());
    assert_eq!(t.status.phase, Some(Phase::Held));
    assert_eq!(
        t.next,
        Next::Backoff {
            not_after: Some(Duration::from_secs(4))
        },
        "wakes one margin before the published expiry"
    );
    let t = after_renew(&f, &held(NOW_MS + 1_000), down());
    assert_eq!(t.status.phase, Some(Phase::Unknown));
    assert_eq!(
        condition(&t.status, HELD),
        ("Unknown".into(), "Unconfirmed".into())
    );
    // The store answers again: Held, same token, expiry republished.
    let back = after_renew(
        &f,
        &t.status,
        reply(Outcome::Renewed, Some(lease("job", 7, NOW_MS + 90_000))),
    );
    assert_eq!(back.status.phase, Some(Phase::Held));
    assert_eq!(back.status.expires_at, time_ms(NOW_MS + 90_000));
    assert_eq!(condition(&back.status, BACKEND_AVAILABLE).0, "True");
}

/// The API could not be written while the keeper renewed the lease: its
/// published expiry passed, Valkey's did not. A confirmation sent after the
/// published expiry had passed keeps Held standing (Valkey has the lease), the
/// next renewal republishes a fresh expiry in one write, and Held goes once
/// that confirmation's expiry is about to pass.
#[test]
fn a_lease_the_keeper_kept_alive_stays_held_and_is_republished() {
    let mut f = facts();
    f.confirmed = Some(Confirmed {
        sent_ms: NOW_MS - 1_000,
        expires_ms: NOW_MS + 6_000,
    });
    let stale = held(NOW_MS - 2_000);
    assert!(before_renew(&f, &stale, Duration::from_secs(90)).is_none());
    assert!(published_left(&f, &stale).is_none(), "a renewal is due");
    let t = after_renew(
        &f,
        &stale,
        reply(Outcome::Renewed, Some(lease("job", 7, NOW_MS + 90_000))),
    );
    assert_eq!(t.status.phase, Some(Phase::Held));
    assert_eq!(t.status.expires_at, time_ms(NOW_MS + 90_000));
    // The store is silent too: wait no later than Valkey's expiry less the margin.
    let t = after_renew(&f, &stale, down());
    assert_eq!(t.status.phase, Some(Phase::Held));
    assert_eq!(
        t.next,
        Next::Backoff {
            not_after: Some(Duration::from_secs(5))
        }
    );
    f.confirmed = Some(Confirmed {
        sent_ms: NOW_MS - 1_000,
        expires_ms: NOW_MS + 900,
    });
    let t = before_renew(&f, &stale, Duration::from_secs(90)).unwrap();
    assert_eq!(t.status.phase, Some(Phase::Unknown));
}

/// A confirmation sent before the published expiry passed, with a later
/// expiry (the keeper renewed the lease while the API server was out, and
/// it is back just before the published expiry; or a renewal that was not
/// republished), is credited: as the published expiry is about to pass,
/// the confirmed one is republished instead of withdrawing Held, so Held
/// neither outlives what status publishes nor flaps to Unknown and back.
/// A confirmation no later than what is published, or about to pass
/// itself, withdraws Held as before.
#[test]
fn a_later_confirmation_is_republished_instead_of_withdrawing_held() {
    let mut f = facts();
    f.confirmed = Some(Confirmed {
        sent_ms: NOW_MS - 3_000,
        expires_ms: NOW_MS + 5_000,
    });
    let t = before_renew(&f, &held(NOW_MS + 800), Duration::from_secs(9)).unwrap();
    assert_eq!(t.status.phase, Some(Phase::Held), "no flap");
    assert_eq!(t.status.expires_at, time_ms(NOW_MS + 5_000));
    assert!(!t.wake_waiters);
    assert_eq!(
        left_before_expiry(&f, &t.status),
        Some(Duration::from_secs(4)),
        "withdrawn by the republished expiry"
    );
    // Sent within the margin of the published expiry, before it passed: the same.
    f.confirmed = Some(Confirmed {
        sent_ms: NOW_MS - 100,
        expires_ms: NOW_MS + 5_000,
    });
    let t = before_renew(&f, &held(NOW_MS + 300), Duration::from_secs(9)).unwrap();
    assert_eq!(t.status.phase, Some(Phase::Held));
    assert_eq!(t.status.expires_at, time_ms(NOW_MS + 5_000));
    // Never later than what the renewal about to be sent can set.
    let t = before_renew(&f, &held(NOW_MS + 300), Duration::from_secs(3)).unwrap();
    assert_eq!(t.status.expires_at, time_ms(NOW_MS + 3_000));
    // The confirmation is what status publishes (rounded down), or about
    // to pass too: withdrawn.
    for expires_ms in [NOW_MS + 800, NOW_MS + 1_500] {
        f.confirmed = Some(Confirmed {
            sent_ms: NOW_MS - 3_000,
            expires_ms,
        });
        let t = before_renew(&f, &held(NOW_MS + 800), Duration::from_secs(9)).unwrap();
        assert_eq!(t.status.phase, Some(Phase::Unknown), "{expires_ms}");
    }
    // Until the published expiry is about to pass, the published one counts.
    f.confirmed = Some(Confirmed {
        sent_ms: NOW_MS - 3_000,
        expires_ms: NOW_MS + 5_000,
    });
    let t = after_renew(&f, &held(NOW_MS + 3_000), down());
    assert_eq!(
        t.next,
        Next::Backoff {
            not_after: Some(Duration::from_secs(2))
        },
        "wakes one margin before the published expiry, not Valkey's"
    );
}

#[test]
fn a_renewal_is_preceded_by_lowering_what_it_may_shorten() {
    let f = facts();
    let t = before_renew(&f, &held(NOW_MS + 60_000), Duration::from_secs(6)).unwrap();
    assert_eq!(t.status.expires_at, time_ms(NOW_MS + 6_000));
    assert_eq!(t.status.phase, Some(Phase::Held));
    assert!(before_renew(&f, &held(NOW_MS + 60_000), Duration::from_secs(90)).is_none());
    // Too close to the published expiry for a reply to arrive in time (it is
    // one margin away; published times are whole seconds): withdraw first.
    let t = before_renew(&f, &held(NOW_MS + 1_000), Duration::from_secs(90)).unwrap();
    assert_eq!(t.status.phase, Some(Phase::Unknown));
}

/// A replica that has just taken over (or just started) finds `Held`
/// published past its expiry — the API server was out for longer than the
/// lease, and the former leader's keeper kept the lease alive in Valkey — and
/// has no confirmation of its own. It renews with the published lease handle
/// before it withdraws anything: renewed keeps `Held` (no `Unknown` flap, no
/// mark removal, nobody woken) with the new expiry; ended is `Lost`; no
/// answer is `Unknown`, as before.
#[test]
fn a_lease_published_past_its_expiry_is_renewed_before_anything_is_withdrawn() {
    let f = facts();
    assert_eq!(f.confirmed, None);
    let stale = held(NOW_MS - 2_000);
    assert!(renews_first(&f, &stale));
    assert!(
        before_renew(&f, &stale, Duration::from_secs(90)).is_none(),
        "nothing is withdrawn before the renewal answers"
    );

    let t = after_renew(
        &f,
        &stale,
        reply(Outcome::Renewed, Some(lease("job", 7, NOW_MS + 90_000))),
    );
    assert_eq!(t.status.phase, Some(Phase::Held));
    assert_eq!(t.status.fencing_token, Some(7));
    assert_eq!(t.status.expires_at, time_ms(NOW_MS + 90_000));
    assert_eq!(
        condition(&t.status, HELD),
        ("True".into(), "Acquired".into())
    );
    assert!(!t.wake_waiters);
    assert!(t.notes.is_empty());
    assert_eq!(
        t.learned,
        Learned::Confirmed {
            expires_ms: NOW_MS + 90_000,
            max_expires_ms: None
        }
    );

    for outcome in [Outcome::Expired, Outcome::NotOwner] {
        let t = after_renew(&f, &stale, reply(outcome, None));
        assert_eq!(t.status.phase, Some(Phase::Lost), "{outcome}");
        assert!(t.wake_waiters);
    }
    for failure in [down(), Err(StoreError::OutcomeUnknown("no answer".into()))] {
        let t = after_renew(&f, &stale, failure);
        assert_eq!(t.status.phase, Some(Phase::Unknown));
        assert_eq!(
            condition(&t.status, HELD),
            ("Unknown".into(), "Unconfirmed".into())
        );
        assert!(t.wake_waiters);
    }
}

/// Renewing first is only for an expiry that has passed and a process that
/// knows nothing newer: one about to pass is withdrawn first (a reply could
/// come after it), and so is one this process confirmed before it passed
/// (its own renewals have been failing since).
#[test]
fn held_is_still_withdrawn_first_when_a_reply_could_come_too_late() {
    let f = facts();
    let soon = held(NOW_MS + 1_000);
    assert!(!renews_first(&f, &soon));
    let t = before_renew(&f, &soon, Duration::from_secs(90)).unwrap();
    assert_eq!(t.status.phase, Some(Phase::Unknown));

    let mut f = facts();
    f.confirmed = Some(Confirmed {
        sent_ms: NOW_MS - 9_000,
        expires_ms: NOW_MS - 1_000,
    });
    let stale = held(NOW_MS - 2_000);
    assert!(!renews_first(&f, &stale));
    let t = before_renew(&f, &stale, Duration::from_secs(90)).unwrap();
    assert_eq!(t.status.phase, Some(Phase::Unknown));
}

#[test]
fn a_release_that_records_no_lease_ends_without_claiming_the_store_answered() {
    let f = facts();
    let mut releasing =
        begin_release(&f, &held(NOW_MS + 60_000), Reason::PodNotReady, "gone").status;
    releasing.fencing_token = None;
    let t = release_unrecorded(&f, &releasing);
    assert_eq!(t.status.releasing_acquisition_id, None);
    assert_eq!(t.status.holder, None, "Pending forgets the holder");
    assert_eq!(t.store_answered, None, "the store was not asked");
    assert_eq!(
        conditions::get(&t.status.conditions, conditions::BACKEND_AVAILABLE),
        conditions::get(&releasing.conditions, conditions::BACKEND_AVAILABLE),
        "nothing said of the store"
    );
    assert!(t.notes.is_empty(), "{:?}", t.notes);
    assert!(t.wake_waiters);
    assert_eq!(t.learned, Learned::Forget);
    assert_eq!(t.next, Next::PlanAgain);
}
