//! Stored state: corrupt records fail closed, inputs are bounded before anything is written, fenced commits.

use super::*;

pub async fn corrupt_records_fail_closed_and_change_nothing(h: &impl Harness) {
    let s = h.store();
    for (i, how) in [
        Corruption::NoExpiry,
        Corruption::UnknownVersion,
        Corruption::Garbage,
    ]
    .into_iter()
    .enumerate()
    {
        let t = target(&format!("corrupt-{i}"));
        let l = held(&*s, &t, "alice", LONG).await;
        h.corrupt(&t, how, &handle(&l)).await;
        let before = h.snapshot(&t).await;

        let acquire = acquire(&*s, &t, "bob", LONG).await;
        assert_eq!(acquire.outcome, Outcome::CorruptState, "{how:?} acquire");
        let renew = s
            .renew(&RenewRequest::new(t.clone(), handle(&l), LONG))
            .await
            .unwrap();
        assert_eq!(renew.outcome, Outcome::CorruptState, "{how:?} renew");
        assert_eq!(
            s.get(&t).await.unwrap().outcome,
            Outcome::CorruptState,
            "{how:?} get"
        );
        assert_eq!(
            commit_k(&*s, &t, l.fencing_token, "v").await,
            Outcome::CorruptState,
            "{how:?} commit"
        );
        let stranger = LeaseHandle {
            owner: "mallory".into(),
            ..handle(&l)
        };
        let release = s
            .release(&ReleaseRequest::new(t.clone(), stranger))
            .await
            .unwrap();
        assert_eq!(
            release.outcome,
            Outcome::CorruptState,
            "{how:?} foreign release"
        );

        assert_eq!(
            h.snapshot(&t).await,
            before,
            "{how:?}: nothing was repaired or overwritten"
        );
    }
}

pub async fn holder_release_and_admin_revoke_clean_up_corrupt_records(h: &impl Harness) {
    let s = h.store();
    // The exact holder may clear a record whose identity is still readable.
    let t = target("cleanup-holder");
    let l = held(&*s, &t, "alice", LONG).await;
    h.corrupt(&t, Corruption::NoExpiry, &handle(&l)).await;
    let r = release(&*s, &t, &l).await;
    assert_eq!(r.outcome, Outcome::Released);
    assert_next_token_follows(&*s, &t, &l).await;

    // An unreadable record only goes through revoke; the counter survives it.
    let t = target("cleanup-admin");
    let l = held(&*s, &t, "alice", LONG).await;
    h.corrupt(&t, Corruption::Garbage, &handle(&l)).await;
    let r = release(&*s, &t, &l).await;
    assert_eq!(r.outcome, Outcome::CorruptState);
    let r = s
        .revoke(&RevokeRequest {
            ..RevokeRequest::new(t.clone())
        })
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Revoked);
    assert_next_token_follows(&*s, &t, &l).await;
}

pub(super) fn assert_invalid(r: Result<Reply, StoreError>, what: &str) {
    match r {
        Err(StoreError::Invalid(msg)) => assert!(!msg.is_empty()),
        other => panic!("{what}: expected an invalid-request error, got {other:?}"),
    }
}

pub async fn input_bounds_are_enforced_and_nothing_is_written(h: &impl Harness) {
    let s = h.store();
    let t = target("bounds");
    let ok = || AcquireRequest::new(t.clone(), "alice", LONG);

    let mut r = ok();
    r.target.name = String::new();
    assert_invalid(s.acquire(&r).await, "empty target");
    let mut r = ok();
    r.target.name = "x".repeat(257);
    assert_invalid(s.acquire(&r).await, "long target");
    let mut r = ok();
    r.owner = String::new();
    assert_invalid(s.acquire(&r).await, "empty owner");
    let mut r = ok();
    r.owner = "o".repeat(257);
    assert_invalid(s.acquire(&r).await, "long owner");
    let mut r = ok();
    r.ttl = Duration::ZERO;
    assert_invalid(s.acquire(&r).await, "zero ttl");
    let mut r = ok();
    r.ttl = Duration::from_secs(400 * 24 * 3600);
    assert_invalid(s.acquire(&r).await, "huge ttl");
    let mut r = ok();
    let mut meta = serde_json::Map::new();
    meta.insert("blob".into(), "x".repeat(5000).into());
    r.metadata = Some(meta);
    assert_invalid(s.acquire(&r).await, "metadata over 4 KiB");
    let mut r = ok();
    r.token_floor = Some(i64::MAX as u64);
    assert_invalid(s.acquire(&r).await, "floor at the maximum");
    let bad_holder = LeaseHandle {
        owner: "alice".into(),
        lease_id: "L".into(),
        token: 0,
    };
    assert_invalid(
        s.renew(&RenewRequest::new(t.clone(), bad_holder, LONG))
            .await,
        "token zero",
    );
    assert_invalid(
        s.commit(&CommitRequest::new(t.clone(), 1, "", "v")).await,
        "empty commit key",
    );

    // 256 bytes exactly is fine, and none of the refusals wrote anything.
    assert_eq!(s.get(&t).await.unwrap().outcome, Outcome::NotFound);
    let mut r = ok();
    r.owner = "o".repeat(256);
    let l = s.acquire(&r).await.unwrap().lease.unwrap();
    assert_eq!(l.fencing_token, 1, "refused requests allocated no token");
}

fn nested(levels: usize) -> serde_json::Map<String, serde_json::Value> {
    let mut v = serde_json::Value::from(1);
    for _ in 1..levels {
        let mut m = serde_json::Map::new();
        m.insert("a".into(), v);
        v = serde_json::Value::Object(m);
    }
    let mut top = serde_json::Map::new();
    top.insert("a".into(), v);
    top
}

pub async fn metadata_that_cannot_be_read_back_is_refused_up_front(h: &impl Harness) {
    let s = h.store();
    let t = target("deep-metadata");
    for levels in [130, targetlease::store::MAX_METADATA_DEPTH + 1] {
        let mut r = AcquireRequest::new(t.clone(), "alice", LONG);
        r.metadata = Some(nested(levels));
        assert_invalid(s.acquire(&r).await, "deeply nested metadata");
    }
    assert_eq!(
        s.get(&t).await.unwrap().outcome,
        Outcome::NotFound,
        "nothing written"
    );
    // The deepest accepted document is stored and read back as itself.
    let mut r = AcquireRequest::new(t.clone(), "alice", LONG);
    r.metadata = Some(nested(targetlease::store::MAX_METADATA_DEPTH));
    let got = s.acquire(&r).await.unwrap();
    assert_eq!(got.outcome, Outcome::Acquired);
    assert_eq!(got.lease.unwrap().metadata, r.metadata);
    let seen = s.get(&t).await.unwrap();
    assert_eq!(seen.outcome, Outcome::Found);
    assert_eq!(seen.lease.unwrap().metadata, r.metadata);
}

pub async fn fenced_commit_accepts_only_the_live_token(h: &impl Harness) {
    let s = h.store();
    let t = target("commit");
    assert_eq!(
        commit_k(&*s, &t, 1, "v").await,
        Outcome::Expired,
        "no live lease"
    );

    let first = held(&*s, &t, "alice", h.short()).await;
    assert_eq!(
        commit_k(&*s, &t, first.fencing_token, "from-first").await,
        Outcome::Committed
    );
    assert_eq!(
        commit_k(&*s, &t, first.fencing_token + 5, "x").await,
        Outcome::StaleToken
    );

    h.advance(h.past_short()).await;
    assert_eq!(
        commit_k(&*s, &t, first.fencing_token, "late").await,
        Outcome::Expired
    );

    let second = held(&*s, &t, "bob", LONG).await;
    assert_eq!(
        commit_k(&*s, &t, second.fencing_token, "from-second").await,
        Outcome::Committed
    );
    assert_eq!(
        commit_k(&*s, &t, first.fencing_token, "stale").await,
        Outcome::StaleToken
    );
}

pub async fn commit_refuses_a_lower_token_even_after_counter_loss(h: &impl Harness) {
    let s = h.store();
    let t = target("counter-loss");
    let first = held(&*s, &t, "alice", LONG).await;
    release(&*s, &t, &first).await;
    let second = held(&*s, &t, "alice", LONG).await;
    assert_eq!(second.fencing_token, 2);
    let c = CommitRequest::new(t.clone(), second.fencing_token, "k", "v2");
    assert_eq!(s.commit(&c).await.unwrap().outcome, Outcome::Committed);

    h.lose_counter(&t).await;
    let reissued = held(&*s, &t, "bob", LONG).await;
    assert_eq!(reissued.fencing_token, 1, "the store lost its counter");
    let c = CommitRequest::new(t.clone(), reissued.fencing_token, "k", "regressed");
    assert_eq!(
        s.commit(&c).await.unwrap().outcome,
        Outcome::StaleToken,
        "the commit record still refuses a lower token"
    );
    release(&*s, &t, &reissued).await;

    // A caller-kept floor restores monotonicity.
    let mut req = AcquireRequest::new(t.clone(), "bob", LONG);
    req.token_floor = Some(second.fencing_token);
    let floored = s.acquire(&req).await.unwrap().lease.unwrap();
    assert_eq!(floored.fencing_token, 3);
    let c = CommitRequest::new(t.clone(), floored.fencing_token, "k", "v3");
    assert_eq!(s.commit(&c).await.unwrap().outcome, Outcome::Committed);
}

pub async fn committed_values_read_back_with_their_token_without_a_lease(h: &impl Harness) {
    let s = h.store();
    let t = target("read-back");
    let nothing = s.read(&t, "k").await.unwrap();
    assert_eq!(nothing.outcome, Outcome::NotFound, "{nothing:?}");
    assert!(nothing.committed.is_none() && nothing.server_time_ms > 0);

    let first = held(&*s, &t, "alice", LONG).await;
    let c = CommitRequest::new(t.clone(), first.fencing_token, "k", "v1");
    assert_eq!(s.commit(&c).await.unwrap().outcome, Outcome::Committed);
    let read = s.read(&t, "k").await.unwrap();
    assert_eq!(read.outcome, Outcome::Found, "{read:?}");
    let got = read.committed.expect("found carries the value");
    assert_eq!(
        (got.key.as_str(), got.value.as_str(), got.fencing_token),
        ("k", "v1", first.fencing_token)
    );
    assert!(got.committed_at_ms >= first.acquired_at_ms);
    assert!(got.committed_at_ms <= read.server_time_ms);

    // No lease is needed to read; a later holder's commit replaces the value.
    release(&*s, &t, &first).await;
    assert_eq!(
        s.read(&t, "k").await.unwrap().committed.unwrap().value,
        "v1"
    );
    let second = held(&*s, &t, "bob", LONG).await;
    for (key, value) in [("k", "v2"), ("other", "o2")] {
        let c = CommitRequest::new(t.clone(), second.fencing_token, key, value);
        assert_eq!(s.commit(&c).await.unwrap().outcome, Outcome::Committed);
    }
    let k = s.read(&t, "k").await.unwrap().committed.unwrap();
    assert_eq!(
        (k.value.as_str(), k.fencing_token),
        ("v2", second.fencing_token)
    );
    let other = s.read(&t, "other").await.unwrap().committed.unwrap();
    assert_eq!(other.value, "o2");
    assert_eq!(
        s.read(&target("read-back-elsewhere"), "k")
            .await
            .unwrap()
            .outcome,
        Outcome::NotFound,
        "values belong to their target"
    );

    // Committed values survive the loss of the counter, as they would downstream.
    h.lose_counter(&t).await;
    let k = s.read(&t, "k").await.unwrap().committed.unwrap();
    assert_eq!(
        (k.value.as_str(), k.fencing_token),
        ("v2", second.fencing_token)
    );

    for bad in [String::new(), "x".repeat(257), "a\nb".into()] {
        assert!(
            matches!(s.read(&t, &bad).await, Err(StoreError::Invalid(_))),
            "key {bad:?} is refused before anything is sent"
        );
    }
}
