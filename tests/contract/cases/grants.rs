//! Granting, renewing, releasing and revoking: one winner, exact holders, tokens that only grow, limits, tenants.

use super::*;

pub async fn acquire_grants_a_token_and_then_reports_held(h: &impl Harness) {
    let s = h.store();
    let t = target("a");
    let r = acquire(&*s, &t, "alice", LONG).await;
    assert_eq!(r.outcome, Outcome::Acquired);
    let l = r.lease.unwrap();
    assert_eq!(l.owner, "alice");
    assert_eq!(l.target, "a");
    assert_eq!(l.fencing_token, 1);
    assert!(l.lease_id.as_deref().is_some_and(|id| !id.is_empty()));
    assert_eq!(l.acquired_at_ms, r.server_time_ms);
    assert_eq!(l.expires_at_ms, r.server_time_ms + LONG.as_millis() as u64);

    let again = acquire(&*s, &t, "bob", LONG).await;
    assert_eq!(again.outcome, Outcome::Held);
    let shown = again.lease.unwrap();
    assert_eq!(shown.owner, "alice");
    assert_eq!(shown.fencing_token, 1);

    let got = s.get(&t).await.unwrap();
    assert_eq!(got.outcome, Outcome::Found);
    assert_eq!(got.lease.unwrap(), l.clone().without_lease_id());
}

pub async fn concurrent_acquires_have_exactly_one_winner(h: &impl Harness) {
    let t = target("contended");
    let mut clients = Vec::new();
    for _ in 0..100 {
        clients.push(h.another_client().await);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(100));
    let mut tasks = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let t = t.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            c.acquire(&AcquireRequest::new(t, format!("owner-{i}"), LONG))
                .await
                .expect("acquire")
        }));
    }
    let mut winners = Vec::new();
    let mut held_count = 0;
    for task in tasks {
        let r = task.await.unwrap();
        match r.outcome {
            Outcome::Acquired => winners.push(r.lease.unwrap()),
            Outcome::Held => held_count += 1,
            other => panic!("unexpected outcome {other}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one winner");
    assert_eq!(held_count, 99);
    let winner = &winners[0];
    assert_eq!(
        winner.fencing_token, 1,
        "the counter advanced by exactly one"
    );

    // The counter advanced by exactly one: the next lease gets the next token.
    let s = h.store();
    let rel = release(&*s, &t, winner).await;
    assert_eq!(rel.outcome, Outcome::Released);
    assert_eq!(held(&*s, &t, "next", LONG).await.fencing_token, 2);
}

pub async fn expiry_then_reacquire_gives_a_larger_token(h: &impl Harness) {
    let s = h.store();
    let t = target("expiring");
    let first = held(&*s, &t, "alice", h.short()).await;
    h.advance(h.past_short()).await;
    assert_eq!(s.get(&t).await.unwrap().outcome, Outcome::NotFound);
    let second = held(&*s, &t, "bob", LONG).await;
    assert!(second.fencing_token > first.fencing_token);
    assert_ne!(second.lease_id, first.lease_id);
}

pub async fn stale_owner_can_do_nothing_after_a_reacquire(h: &impl Harness) {
    let s = h.store();
    let t = target("stale");
    let old = held(&*s, &t, "alice", h.short()).await;
    h.advance(h.past_short()).await;
    // The same owner name coming back gets a new lease; the old tuple stays dead.
    let new = held(&*s, &t, "alice", LONG).await;
    assert!(new.fencing_token > old.fencing_token);

    let renew = s
        .renew(&RenewRequest::new(t.clone(), handle(&old), LONG))
        .await
        .unwrap();
    assert_eq!(renew.outcome, Outcome::NotOwner);
    let release = release(&*s, &t, &old).await;
    assert_eq!(release.outcome, Outcome::NotOwner);
    assert_eq!(
        commit_k(&*s, &t, old.fencing_token, "v").await,
        Outcome::StaleToken
    );

    let now = s.get(&t).await.unwrap();
    assert_eq!(now.outcome, Outcome::Found);
    assert_eq!(
        now.lease.unwrap(),
        new.clone().without_lease_id(),
        "new lease untouched"
    );
    assert_eq!(
        commit_k(&*s, &t, new.fencing_token, "v").await,
        Outcome::Committed
    );
}

pub async fn renew_extends_and_requires_the_exact_tuple(h: &impl Harness) {
    let s = h.store();
    let t = target("renew");
    let l = held(&*s, &t, "alice", Duration::from_secs(5)).await;
    let r = s
        .renew(&RenewRequest::new(t.clone(), handle(&l), LONG))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Renewed);
    let renewed = r.lease.unwrap();
    assert_eq!(
        renewed.expires_at_ms,
        r.server_time_ms + LONG.as_millis() as u64
    );
    assert_eq!(renewed.fencing_token, l.fencing_token);
    assert_eq!(renewed.lease_id, l.lease_id);

    for wrong in [
        LeaseHandle {
            owner: "mallory".into(),
            ..handle(&l)
        },
        LeaseHandle {
            lease_id: "forged".into(),
            ..handle(&l)
        },
        LeaseHandle {
            token: l.fencing_token + 1,
            ..handle(&l)
        },
    ] {
        let r = s
            .renew(&RenewRequest::new(t.clone(), wrong, LONG))
            .await
            .unwrap();
        assert_eq!(r.outcome, Outcome::NotOwner);
        assert!(r.lease.is_none());
    }
    let other = target("renew-none");
    let r = s
        .renew(&RenewRequest::new(other, handle(&l), LONG))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Expired);
}

pub async fn release_frees_the_target_and_keeps_the_counter(h: &impl Harness) {
    let s = h.store();
    let t = target("release");
    let l = held(&*s, &t, "alice", LONG).await;
    let r = release(&*s, &t, &l).await;
    assert_eq!(r.outcome, Outcome::Released);
    assert_eq!(s.get(&t).await.unwrap().outcome, Outcome::NotFound);
    let again = release(&*s, &t, &l).await;
    assert_eq!(
        again.outcome,
        Outcome::Expired,
        "a new request id sees the lease gone"
    );
    assert_next_token_follows(&*s, &t, &l).await;
}

/// An extend-only renewal never moves the expiry earlier: asking for less
/// than the lease has left keeps what it has; asking for more extends it
/// like any renewal; the max lifetime still caps it; it needs the exact
/// tuple; and a replay with the same request id is the same renewal (a
/// plain renewal with that id is another one).
pub async fn an_extend_only_renewal_never_shortens_a_lease(h: &impl Harness) {
    let s = h.store();
    let t = target("extend-only");
    let l = held(&*s, &t, "alice", LONG).await;
    let short = RenewRequest::new(t.clone(), handle(&l), Duration::from_secs(5)).extending_only();
    let r = s.renew(&short).await.unwrap();
    assert_eq!(r.outcome, Outcome::Renewed);
    let kept = r.lease.unwrap();
    assert_eq!(kept.expires_at_ms, l.expires_at_ms, "never earlier");
    assert_eq!(kept.fencing_token, l.fencing_token);
    let got = s.get(&t).await.unwrap().lease.unwrap();
    assert_eq!(got.expires_at_ms, l.expires_at_ms, "the store kept it");

    let replay = s.renew(&short).await.unwrap();
    assert_eq!(replay.outcome, Outcome::Renewed);
    let mut plain = RenewRequest::new(t.clone(), handle(&l), Duration::from_secs(5));
    plain.request_id = short.request_id.clone();
    let conflict = s.renew(&plain).await.unwrap();
    assert_eq!(conflict.outcome, Outcome::IdempotencyConflict);

    let longer = 2 * LONG;
    let r = s
        .renew(&RenewRequest::new(t.clone(), handle(&l), longer).extending_only())
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Renewed);
    assert_eq!(
        r.lease.unwrap().expires_at_ms,
        r.server_time_ms + longer.as_millis() as u64
    );

    let wrong = LeaseHandle {
        token: l.fencing_token + 1,
        ..handle(&l)
    };
    let r = s
        .renew(&RenewRequest::new(t.clone(), wrong, LONG).extending_only())
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::NotOwner);

    // The max lifetime caps it as it caps every renewal.
    let capped = target("extend-only-capped");
    let mut req = AcquireRequest::new(capped.clone(), "alice", Duration::from_millis(1000));
    req.max_lifetime = Some(Duration::from_millis(1500));
    let l = s.acquire(&req).await.unwrap().lease.unwrap();
    let r = s
        .renew(&RenewRequest::new(capped, handle(&l), LONG).extending_only())
        .await
        .unwrap();
    assert_eq!(r.lease.unwrap().expires_at_ms, l.acquired_at_ms + 1500);
}

pub async fn max_lifetime_caps_every_renewal(h: &impl Harness) {
    let s = h.store();
    let t = target("max-lifetime");
    let mut req = AcquireRequest::new(t.clone(), "alice", Duration::from_millis(1000));
    req.max_lifetime = Some(Duration::from_millis(1500));
    let r = s.acquire(&req).await.unwrap();
    let l = r.lease.unwrap();
    let cap = l.acquired_at_ms + 1500;
    assert_eq!(l.max_expires_at_ms, Some(cap));
    assert_eq!(l.expires_at_ms, l.acquired_at_ms + 1000);

    let renewed = s
        .renew(&RenewRequest::new(t.clone(), handle(&l), LONG))
        .await
        .unwrap();
    assert_eq!(renewed.outcome, Outcome::Renewed);
    assert_eq!(
        renewed.lease.unwrap().expires_at_ms,
        cap,
        "renewal cannot pass the cap"
    );

    h.advance(Duration::from_millis(1800)).await;
    let late = s
        .renew(&RenewRequest::new(t.clone(), handle(&l), LONG))
        .await
        .unwrap();
    assert_eq!(late.outcome, Outcome::Expired);

    // A max lifetime shorter than the ttl bounds the first expiry too.
    let t2 = target("max-lifetime-short");
    let mut req = AcquireRequest::new(t2, "alice", LONG);
    req.max_lifetime = Some(Duration::from_millis(700));
    let l = s.acquire(&req).await.unwrap().lease.unwrap();
    assert_eq!(l.expires_at_ms, l.acquired_at_ms + 700);
}

pub async fn revoke_ends_the_lease_but_never_lowers_the_token(h: &impl Harness) {
    let s = h.store();
    let t = target("revoke");
    let l = held(&*s, &t, "alice", LONG).await;
    let r = s
        .revoke(&RevokeRequest {
            ..RevokeRequest::new(t.clone())
        })
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Revoked);
    assert_eq!(r.lease.as_ref().unwrap().lease_id, None);
    let renew = s
        .renew(&RenewRequest::new(t.clone(), handle(&l), LONG))
        .await
        .unwrap();
    assert_eq!(renew.outcome, Outcome::Expired);
    let again = s
        .revoke(&RevokeRequest {
            ..RevokeRequest::new(t.clone())
        })
        .await
        .unwrap();
    assert_eq!(again.outcome, Outcome::NotFound);
    assert_next_token_follows(&*s, &t, &l).await;
}

pub async fn token_floor_raises_the_next_token(h: &impl Harness) {
    let s = h.store();
    let t = target("floor");
    let mut req = AcquireRequest::new(t.clone(), "alice", LONG);
    req.token_floor = Some(1000);
    let l = s.acquire(&req).await.unwrap().lease.unwrap();
    assert_eq!(l.fencing_token, 1001);
    release(&*s, &t, &l).await;
    // A floor below the counter changes nothing.
    let mut req = AcquireRequest::new(t.clone(), "alice", LONG);
    req.token_floor = Some(5);
    assert_eq!(
        s.acquire(&req).await.unwrap().lease.unwrap().fencing_token,
        1002
    );
}

pub async fn a_caller_chosen_lease_id_is_used_and_replayed(h: &impl Harness) {
    let s = h.store();
    let t = target("chosen-id");
    let mut req = AcquireRequest::new(t.clone(), "alice", LONG);
    req.lease_id = Some("derived-capability-0123456789".into());
    let first = s.acquire(&req).await.unwrap().lease.unwrap();
    assert_eq!(
        first.lease_id.as_deref(),
        Some("derived-capability-0123456789")
    );
    assert_eq!(s.acquire(&req).await.unwrap().lease.unwrap(), first);
    let renewed = s
        .renew(&RenewRequest::new(t.clone(), handle(&first), LONG))
        .await
        .unwrap();
    assert_eq!(renewed.outcome, Outcome::Renewed);
    let mut short = AcquireRequest::new(target("chosen-short"), "alice", LONG);
    short.lease_id = Some("guessable".into());
    assert_invalid(s.acquire(&short).await, "short lease id");
}

pub async fn conflicts_never_reveal_the_lease_id(h: &impl Harness) {
    let s = h.store();
    let t = target("secret");
    let l = held(&*s, &t, "alice", LONG).await;
    let id = l.lease_id.clone().unwrap();
    let mut replies = vec![
        acquire(&*s, &t, "bob", LONG).await,
        s.get(&t).await.unwrap(),
        s.renew(&RenewRequest::new(
            t.clone(),
            LeaseHandle {
                owner: "bob".into(),
                ..handle(&l)
            },
            LONG,
        ))
        .await
        .unwrap(),
        s.commit(&CommitRequest::new(t.clone(), l.fencing_token, "k", "v"))
            .await
            .unwrap(),
    ];
    replies.push(
        s.revoke(&RevokeRequest {
            ..RevokeRequest::new(t.clone())
        })
        .await
        .unwrap(),
    );
    for r in replies {
        let text = format!("{r:?}");
        assert!(!text.contains(&id), "{} leaked the lease id", r.outcome);
    }
}

pub async fn tenants_are_isolated(h: &impl Harness) {
    let s = h.store();
    let a = Target::new("a:b", "c");
    let b = Target::new("a", "b:c");
    let la = held(&*s, &a, "alice", LONG).await;
    let lb = held(&*s, &b, "bob", LONG).await;
    assert_eq!(la.fencing_token, 1);
    assert_eq!(lb.fencing_token, 1, "separate counters: no key collision");
    let names: HashSet<_> = [la.lease_id, lb.lease_id].into_iter().collect();
    assert_eq!(names.len(), 2);
}

pub async fn health_reports_server_time(h: &impl Harness) {
    let s = h.store();
    let health = s.health().await.unwrap();
    let probe = s.get(&target("health")).await.unwrap();
    assert!(health.server_time_ms > 1_600_000_000_000);
    assert!(probe.server_time_ms >= health.server_time_ms);
}

pub async fn revoke_with_a_token_ends_only_that_lease(h: &impl Harness) {
    let s = h.store();
    let t = target("revoke-token");
    let alice = held(&*s, &t, "alice", LONG).await;
    let mut wrong = RevokeRequest::new(t.clone());
    wrong.token = Some(alice.fencing_token + 1);
    let r = s.revoke(&wrong).await.unwrap();
    assert_eq!(r.outcome, Outcome::NotOwner);
    assert!(r.lease.is_none());
    // Not remembered: the same request can still apply if that token ever lives.
    assert_eq!(s.get(&t).await.unwrap().outcome, Outcome::Found);
    let mut right = RevokeRequest::new(t.clone());
    right.token = Some(alice.fencing_token);
    let r = s.revoke(&right).await.unwrap();
    assert_eq!(r.outcome, Outcome::Revoked);
    assert_eq!(r.lease.unwrap().fencing_token, alice.fencing_token);
    assert_eq!(s.get(&t).await.unwrap().outcome, Outcome::NotFound);
    let mut gone = RevokeRequest::new(t.clone());
    gone.token = Some(alice.fencing_token);
    assert_eq!(s.revoke(&gone).await.unwrap().outcome, Outcome::NotFound);
}

pub async fn list_reads_every_record_like_get_and_never_shows_a_lease_id(h: &impl Harness) {
    let s = h.store();
    let t = |ns: &str, name: &str| Target::new(ns, name);
    let one = held(&*s, &t("list-a", "job-1"), "alice", LONG).await;
    let two = held(&*s, &t("list-a", "job-2"), "bob", LONG).await;
    held(&*s, &t("list-a", "other"), "carol", LONG).await;
    held(&*s, &t("list-b", "job-3"), "dave", LONG).await;
    held(&*s, &t("list-a", "job-x"), "erin", h.short()).await;
    h.corrupt(&t("list-a", "job-2"), Corruption::Garbage, &handle(&two))
        .await;
    h.advance(h.past_short()).await;

    let listed = s.list(Some("list-a"), "job-").await.unwrap();
    let names: Vec<(&str, &str)> = listed
        .iter()
        .map(|l| (l.target.name.as_str(), l.reply.outcome.as_str()))
        .collect();
    let expected_head = [("job-1", "found"), ("job-2", "corrupt_state")];
    assert_eq!(&names[..2], &expected_head, "{names:?}");
    // An expired record is gone or listed as expired, never as live.
    assert!(
        names[2..].is_empty() || names[2..] == [("job-x", "expired")],
        "{names:?}"
    );
    let first = listed[0]
        .reply
        .lease
        .as_ref()
        .expect("found shows the lease");
    assert_eq!(
        (first.owner.as_str(), first.fencing_token),
        ("alice", one.fencing_token)
    );
    assert!(
        listed
            .iter()
            .all(|l| l.reply.lease.as_ref().is_none_or(|l| l.lease_id.is_none())),
        "no lease id is ever listed"
    );

    let everywhere = s.list(None, "job-").await.unwrap();
    let found: Vec<(&str, &str)> = everywhere
        .iter()
        .filter(|l| l.reply.outcome == Outcome::Found)
        .map(|l| (l.target.namespace.as_str(), l.target.name.as_str()))
        .collect();
    assert_eq!(found, [("list-a", "job-1"), ("list-b", "job-3")]);
    let whole_namespace = s.list(Some("list-a"), "").await.unwrap();
    assert!(whole_namespace.iter().any(|l| l.target.name == "other"));
    assert!(s.list(Some("list-c"), "").await.unwrap().is_empty());
}
