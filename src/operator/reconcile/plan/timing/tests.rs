use super::*;
use crate::operator::reconcile::transition::Reclaim;

const S: Duration = Duration::from_secs(1);

/// Renew every 10 s, store clock at 100 s, confirmed 2 s ago, no hard end.
fn timing() -> LeaseTiming {
    LeaseTiming {
        renew: 10 * S,
        max_lifetime: None,
        server_now_ms: 100_000,
        confirmed_ago: Some(2 * S),
        enforced_end_ms: None,
        acquired_ms: Some(90_000),
    }
}

#[test]
fn a_renewal_is_due_when_the_last_confirmation_is_nine_tenths_of_an_interval_old() {
    let with = |f: fn(&mut LeaseTiming)| {
        let mut h = timing();
        f(&mut h);
        h
    };
    // (held, confirm asked, published expiry has time left) -> due
    let cases: &[(&str, Option<LeaseTiming>, bool, bool, bool)] = &[
        ("fresh confirmation", Some(timing()), false, true, false),
        ("invalid spec", None, false, true, true),
        ("release announced", Some(timing()), true, true, true),
        (
            "never confirmed here",
            Some(with(|h| h.confirmed_ago = None)),
            false,
            true,
            true,
        ),
        (
            "8.9 s ago",
            Some(with(|h| {
                h.confirmed_ago = Some(Duration::from_millis(8_900))
            })),
            false,
            true,
            false,
        ),
        (
            "9 s ago (a tenth early)",
            Some(with(|h| h.confirmed_ago = Some(9 * S))),
            false,
            true,
            true,
        ),
        (
            "published expiry about to pass",
            Some(timing()),
            false,
            false,
            true,
        ),
    ];
    for (name, h, confirm, published_ok, due) in cases {
        assert_eq!(
            renew_due(h.as_ref(), *confirm, *published_ok),
            *due,
            "{name}"
        );
    }
}

#[test]
fn the_hard_end_is_the_earliest_of_the_store_and_the_spec() {
    type Case = (Option<u64>, Option<Duration>, Option<u64>, Option<u64>);
    // (enforced by the store, maxLifetime, acquired) -> hard end
    let cases: &[Case] = &[
        (None, None, Some(90_000), None),
        (Some(150_000), None, Some(90_000), Some(150_000)),
        (None, Some(60 * S), Some(90_000), Some(150_000)),
        (None, Some(60 * S), None, None),
        // An edit that shortens maxLifetime applies to the held lease.
        (Some(150_000), Some(30 * S), Some(90_000), Some(120_000)),
        // The store enforces an earlier end than the spec now asks.
        (Some(110_000), Some(60 * S), Some(90_000), Some(110_000)),
    ];
    for (i, (enforced, max, acquired, end)) in cases.iter().enumerate() {
        let h = LeaseTiming {
            enforced_end_ms: *enforced,
            max_lifetime: *max,
            acquired_ms: *acquired,
            ..timing()
        };
        assert_eq!(hard_end_ms(&h), *end, "case {i}");
    }
}

#[test]
fn a_rotation_falls_due_one_renew_interval_before_the_hard_end() {
    // hard end (enforced) -> (rotation due, until rotation)
    let cases: &[(Option<u64>, bool, Option<Duration>)] = &[
        (None, false, None),
        (Some(200_000), false, Some(90 * S)),
        (Some(110_001), false, Some(Duration::from_millis(1))),
        (Some(110_000), true, Some(Duration::ZERO)),
        (Some(50_000), true, Some(Duration::ZERO)),
    ];
    for (end, due, until) in cases {
        let h = LeaseTiming {
            enforced_end_ms: *end,
            ..timing()
        };
        assert_eq!(rotation_due(Some(&h)), *due, "end {end:?}");
        assert_eq!(until_rotation(&h), *until, "end {end:?}");
    }
    assert!(!rotation_due(None), "an invalid spec never rotates");
}

#[test]
fn a_renewal_sleeps_out_the_interval_but_not_past_the_rotation_nor_less_than_the_floor() {
    let renew = 10 * S;
    let ms = Duration::from_millis;
    // (confirmed ago, until rotation) -> sleep
    let cases: &[(Option<Duration>, Option<Duration>, Duration)] = &[
        (Some(2 * S), None, 8 * S),
        (Some(20 * S), None, ms(250)),
        (None, None, ms(250)),
        (Some(2 * S), Some(3 * S), 3 * S),
        (Some(2 * S), Some(Duration::ZERO), ms(250)),
        (None, Some(30 * S), ms(250)),
    ];
    for (ago, rotation, wait) in cases {
        assert_eq!(
            until_renewal(renew, *ago, *rotation),
            *wait,
            "{ago:?} {rotation:?}"
        );
    }
    // A short interval: the floor is a quarter of it.
    assert_eq!(until_renewal(ms(400), Some(ms(400)), None), ms(100));
}

#[test]
fn each_next_maps_to_one_action() {
    let no_jitter = |d: Duration| d;
    let reclaim = Next::Reclaim(Reclaim {
        owner: "job".into(),
        acquisition: "a".into(),
        token: 1,
        then_forget_acquisition: false,
    });
    let ms = Duration::from_millis;
    // (next, failures) -> action
    let cases: Vec<(Next, u32, Action)> = vec![
        (Next::Renewal, 0, Action::requeue(7 * S)),
        (Next::Requeue(3 * S), 5, Action::requeue(3 * S)),
        (
            Next::Backoff { not_after: None },
            1,
            Action::requeue(ms(250)),
        ),
        (
            Next::Backoff { not_after: None },
            3,
            Action::requeue(ms(1000)),
        ),
        (
            Next::Backoff {
                not_after: Some(ms(100)),
            },
            3,
            Action::requeue(ms(120)),
        ),
        (
            Next::Backoff {
                not_after: Some(60 * S),
            },
            0,
            Action::requeue(ms(250)),
        ),
        (Next::AwaitChange, 0, Action::await_change()),
        (Next::PlanAgain, 0, Action::requeue(Duration::ZERO)),
        (reclaim, 0, Action::requeue(Duration::ZERO)),
    ];
    for (next, failures, want) in cases {
        assert_eq!(action(&next, 7 * S, failures, no_jitter), want, "{next:?}");
    }
    let doubled = action(&Next::Backoff { not_after: None }, S, 1, |d| d * 2);
    assert_eq!(doubled, Action::requeue(ms(500)), "the jitter is applied");
}

#[test]
fn only_a_renewal_on_its_schedule_waits_for_a_slot() {
    let now = Instant::now();
    let ms = Duration::from_millis;
    let on = |due: Instant| Scheduled {
        due,
        renew: 30 * S,
        ttl: 90 * S,
        expires: due + 60 * S,
    };
    // A new TargetLease, an edit, a pod, a release: at once.
    assert_eq!(slot_deadline(now, None), now);
    // A renewal at its time: 60 s left after the interval, an eighth of it.
    assert_eq!(slot_deadline(now, Some(on(now))), now + ms(7500));
    assert_eq!(
        slot_deadline(now, Some(on(now + 2 * S))),
        now + ms(9500),
        "a tenth of an interval early counts as on time"
    );
    // Woken well before its renewal (by a pod, a wake-up): at once.
    assert_eq!(slot_deadline(now, Some(on(now + 10 * S))), now);
    // Late already: its deadline stays where it was.
    assert_eq!(slot_deadline(now, Some(on(now - 20 * S))), now - ms(12500));
}

#[test]
fn a_rotation_gets_its_slot_before_the_hard_end() {
    // ttl 60 s, renew 5 s, maxLifetime 10 m: the hard end at 600 s, the
    // rotation due at 595 s, the published expiry capped at the hard end.
    let now = Instant::now();
    let ms = Duration::from_millis;
    let rotation = Scheduled {
        due: now,
        renew: 5 * S,
        ttl: 60 * S,
        expires: now + 5 * S,
    };
    let deadline = slot_deadline(now, Some(rotation));
    assert!(
        deadline < now + 5 * S,
        "past the hard end by {:?}",
        deadline - now
    );
    assert_eq!(deadline, now + ms(625), "an eighth of the 5 s left");
    // A published expiry already passed: at once.
    let passed = Scheduled {
        expires: now - S,
        ..rotation
    };
    assert_eq!(slot_deadline(now, Some(passed)), now);
}
