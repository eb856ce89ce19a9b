//! Request ids: replays return the original result, revalidated; conflicts and refusals are never cached.

use super::*;

pub async fn acquire_replay_returns_the_original_lease(h: &impl Harness) {
    let s = h.store();
    let t = target("replay");
    let req = AcquireRequest::new(t.clone(), "alice", LONG);
    let first = s.acquire(&req).await.unwrap();
    assert_eq!(first.outcome, Outcome::Acquired);
    let second = s.acquire(&req).await.unwrap();
    assert_eq!(second.outcome, Outcome::Acquired);
    assert_eq!(second.lease, first.lease, "same lease id, same token");

    // A renew in between is reflected: the replay reports current state.
    let l = first.lease.unwrap();
    let renewed = s
        .renew(&RenewRequest::new(t.clone(), handle(&l), LONG * 2))
        .await
        .unwrap();
    let third = s.acquire(&req).await.unwrap();
    assert_eq!(third.outcome, Outcome::Acquired);
    assert_eq!(third.lease, renewed.lease);

    // No second token was allocated by the replays.
    release(&*s, &t, &l).await;
    assert_next_token_follows(&*s, &t, &l).await;
}

pub async fn acquire_replay_after_expiry_or_supersession_reports_no_active_lease(h: &impl Harness) {
    let s = h.store();
    let t = target("replay-expired");
    let req = AcquireRequest::new(t.clone(), "alice", h.short());
    let first = s.acquire(&req).await.unwrap();
    assert_eq!(first.outcome, Outcome::Acquired);
    h.advance(h.past_short()).await;
    let replay = s.acquire(&req).await.unwrap();
    assert_eq!(replay.outcome, Outcome::Expired);
    assert!(replay.lease.is_none());

    let bob = held(&*s, &t, "bob", LONG).await;
    let replay = s.acquire(&req).await.unwrap();
    assert_eq!(
        replay.outcome,
        Outcome::Held,
        "superseded: reports the other holder"
    );
    let shown = replay.lease.unwrap();
    assert_eq!(shown.owner, "bob");
    assert_eq!(shown.lease_id, None);
    assert_eq!(shown.fencing_token, bob.fencing_token);
}

pub async fn refusals_are_not_cached(h: &impl Harness) {
    let s = h.store();
    let t = target("refusal");
    let alice = held(&*s, &t, "alice", LONG).await;
    let req = AcquireRequest::new(t.clone(), "bob", LONG);
    assert_eq!(s.acquire(&req).await.unwrap().outcome, Outcome::Held);
    release(&*s, &t, &alice).await;
    let retry = s.acquire(&req).await.unwrap();
    assert_eq!(
        retry.outcome,
        Outcome::Acquired,
        "the retry wins once the holder is gone"
    );
    assert_eq!(retry.lease.unwrap().fencing_token, alice.fencing_token + 1);
}

pub async fn interrupted_acquire_is_resolved_by_its_request_id(h: &impl Harness) {
    let s = h.store();
    let t = target("interrupted");
    let req = AcquireRequest::new(t.clone(), "alice", LONG);
    // The caller never sees this reply (as if the connection dropped).
    let lost = {
        let other = h.another_client().await;
        other.acquire(&req).await.unwrap()
    };
    // Retrying on a fresh connection with the same request id resolves it.
    let retried = s.acquire(&req).await.unwrap();
    assert_eq!(retried.outcome, Outcome::Acquired);
    assert_eq!(retried.lease, lost.lease);
    let l = retried.lease.unwrap();
    release(&*s, &t, &l).await;
    assert_next_token_follows(&*s, &t, &l).await;
}

pub async fn reused_request_id_with_other_inputs_is_a_conflict(h: &impl Harness) {
    let s = h.store();
    let t = target("conflict");
    let req = AcquireRequest::new(t.clone(), "alice", LONG);
    s.acquire(&req).await.unwrap();
    let mut changed = req.clone();
    changed.ttl = LONG * 2;
    let r = s.acquire(&changed).await.unwrap();
    assert_eq!(r.outcome, Outcome::IdempotencyConflict);
    assert!(r.lease.is_none());

    let l = held(&*s, &target("conflict-commit"), "c", LONG).await;
    let ct = target("conflict-commit");
    let commit = CommitRequest::new(ct.clone(), l.fencing_token, "k", "v1");
    assert_eq!(s.commit(&commit).await.unwrap().outcome, Outcome::Committed);
    let mut other = commit.clone();
    other.value = "v2".into();
    assert_eq!(
        s.commit(&other).await.unwrap().outcome,
        Outcome::IdempotencyConflict
    );
}

/// The request id is bound to every input of the acquire: what `get` shows
/// (ttl, max life, metadata) is not enough to replay a request that chose its
/// lease id or floor; a replay needs all of them again.
pub async fn an_acquire_replay_needs_every_input_again(h: &impl Harness) {
    let s = h.store();
    let t = target("replay-inputs");
    let mut meta = serde_json::Map::new();
    meta.insert("acquisition".into(), "a-1".into());
    let mut req = AcquireRequest::new(t.clone(), "alice", LONG);
    req.max_lifetime = Some(LONG * 4);
    req.metadata = Some(meta);
    req.token_floor = Some(41);
    req.lease_id = Some("derived-capability-inputs-0001".into());
    let first = s.acquire(&req).await.unwrap();
    assert_eq!(first.outcome, Outcome::Acquired);
    assert_eq!(first.lease.as_ref().unwrap().fencing_token, 42);

    let mut variants: Vec<(&str, AcquireRequest)> = Vec::new();
    let mut v = req.clone();
    v.ttl = LONG * 2;
    variants.push(("ttl", v));
    let mut v = req.clone();
    v.max_lifetime = None;
    variants.push(("max lifetime", v));
    let mut v = req.clone();
    v.metadata = None;
    variants.push(("metadata", v));
    let mut v = req.clone();
    v.token_floor = None;
    variants.push(("no floor", v));
    let mut v = req.clone();
    v.token_floor = Some(40);
    variants.push(("another floor", v));
    let mut v = req.clone();
    v.lease_id = None;
    variants.push(("no lease id (a fresh random one)", v));
    let mut v = req.clone();
    v.lease_id = Some("derived-capability-inputs-0002".into());
    variants.push(("another lease id", v));
    for (what, v) in variants {
        let r = s.acquire(&v).await.unwrap();
        assert_eq!(r.outcome, Outcome::IdempotencyConflict, "{what}: {r:?}");
        assert!(r.lease.is_none(), "{what}: {r:?}");
    }

    // The exact request still replays, with its lease id.
    let again = s.acquire(&req).await.unwrap();
    assert_eq!(again.outcome, Outcome::Acquired);
    assert_eq!(again.lease, first.lease);
}

pub async fn renew_and_release_replays_return_the_original_result(h: &impl Harness) {
    let s = h.store();
    let t = target("replays");
    let l = held(&*s, &t, "alice", LONG).await;
    let renew = RenewRequest::new(t.clone(), handle(&l), LONG);
    let a = s.renew(&renew).await.unwrap();
    let b = s.renew(&renew).await.unwrap();
    assert_eq!(a.outcome, Outcome::Renewed);
    assert_eq!(b.outcome, Outcome::Renewed);
    assert_eq!(a.lease, b.lease, "a replay does not extend again");

    let release = ReleaseRequest::new(t.clone(), handle(&l));
    assert_eq!(
        s.release(&release).await.unwrap().outcome,
        Outcome::Released
    );
    assert_eq!(
        s.release(&release).await.unwrap().outcome,
        Outcome::Released
    );
    // The renew replay no longer reports a live lease.
    assert_eq!(s.renew(&renew).await.unwrap().outcome, Outcome::Expired);
}

pub async fn acquire_replay_needs_the_same_lease_id_and_token(h: &impl Harness) {
    let s = h.store();
    let t = target("replay-token");
    // Caller-chosen lease ids (as the operator derives them) can repeat.
    let id = "derived-capability-replayed-0001".to_string();
    let mut alice = AcquireRequest::new(t.clone(), "alice", LONG);
    alice.lease_id = Some(id.clone());
    let first = s.acquire(&alice).await.unwrap();
    assert_eq!(first.outcome, Outcome::Acquired);
    let revoked = s.revoke(&RevokeRequest::new(t.clone())).await.unwrap();
    assert_eq!(revoked.outcome, Outcome::Revoked);
    let mut bob = AcquireRequest::new(t.clone(), "bob", LONG);
    bob.lease_id = Some(id.clone());
    let bobs = s.acquire(&bob).await.unwrap();
    assert_eq!(bobs.outcome, Outcome::Acquired);
    let bobs = bobs.lease.unwrap();
    assert_eq!(bobs.lease_id.as_deref(), Some(id.as_str()), "same lease id");

    // Alice's retry finds a live lease with her lease id but not her token.
    let replay = s.acquire(&alice).await.unwrap();
    assert_ne!(replay.outcome, Outcome::Acquired, "{replay:?}");
    assert_eq!(replay.outcome, Outcome::Held, "superseded: {replay:?}");
    let shown = replay.lease.unwrap();
    assert_eq!(shown.owner, "bob");
    assert_eq!(shown.lease_id, None, "never another holder's capability");
}

pub async fn revoke_replays_and_never_ends_a_later_lease(h: &impl Harness) {
    let s = h.store();
    let t = target("revoke-replay");
    let alice = held(&*s, &t, "alice", LONG).await;
    let req = RevokeRequest::new(t.clone());
    let first = s.revoke(&req).await.unwrap();
    assert_eq!(first.outcome, Outcome::Revoked);
    assert_eq!(first.lease.unwrap().fencing_token, alice.fencing_token);

    // Bob acquires; a retry of the first revoke returns its result and leaves Bob alone.
    let bob = held(&*s, &t, "bob", LONG).await;
    let again = s.revoke(&req).await.unwrap();
    assert_eq!(again.outcome, Outcome::Revoked, "{again:?}");
    assert!(again.lease.is_none(), "a replay shows no lease");
    let now = s.get(&t).await.unwrap();
    assert_eq!(now.outcome, Outcome::Found);
    assert_eq!(now.lease.unwrap().fencing_token, bob.fencing_token);

    // A revoke that found nothing is remembered too.
    let empty = target("revoke-replay-empty");
    let nothing = RevokeRequest::new(empty.clone());
    assert_eq!(s.revoke(&nothing).await.unwrap().outcome, Outcome::NotFound);
    let carol = held(&*s, &empty, "carol", LONG).await;
    assert_eq!(s.revoke(&nothing).await.unwrap().outcome, Outcome::NotFound);
    let still = s.get(&empty).await.unwrap().lease.unwrap();
    assert_eq!(still.fencing_token, carol.fencing_token);

    // The same request id with another expected token is a conflict.
    let mut other = req.clone();
    other.token = Some(bob.fencing_token);
    assert_eq!(
        s.revoke(&other).await.unwrap().outcome,
        Outcome::IdempotencyConflict
    );
}
