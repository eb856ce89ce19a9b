//! Contract cases: each asserts one promise of the lease protocol.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use targetlease::store::{
    AcquireRequest, CommitRequest, Lease, LeaseHandle, LeaseStore, Outcome, ReleaseRequest,
    RenewRequest, Reply, RevokeRequest, StoreError, Target,
};

use crate::{Corruption, Harness};

const LONG: Duration = Duration::from_secs(30);
const SHORT: Duration = Duration::from_millis(400);
/// Sleep long enough for a `SHORT` lease to be gone on any machine.
const PAST_SHORT: Duration = Duration::from_millis(700);

fn target(name: &str) -> Target {
    Target::new("contract", name)
}

async fn acquire(s: &dyn LeaseStore, t: &Target, owner: &str, ttl: Duration) -> Reply {
    s.acquire(&AcquireRequest::new(t.clone(), owner, ttl))
        .await
        .expect("acquire")
}

async fn held(s: &dyn LeaseStore, t: &Target, owner: &str, ttl: Duration) -> Lease {
    let r = acquire(s, t, owner, ttl).await;
    assert_eq!(r.outcome, Outcome::Acquired, "{r:?}");
    r.lease.expect("acquired reply carries the lease")
}

fn holder(l: &Lease) -> LeaseHandle {
    l.handle().expect("the holder's copy carries the lease id")
}

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
    let rel = s
        .release(&ReleaseRequest::new(t.clone(), holder(winner)))
        .await
        .unwrap();
    assert_eq!(rel.outcome, Outcome::Released);
    assert_eq!(held(&*s, &t, "next", LONG).await.fencing_token, 2);
}

pub async fn expiry_then_reacquire_gives_a_larger_token(h: &impl Harness) {
    let s = h.store();
    let t = target("expiring");
    let first = held(&*s, &t, "alice", SHORT).await;
    h.advance(PAST_SHORT).await;
    assert_eq!(s.get(&t).await.unwrap().outcome, Outcome::NotFound);
    let second = held(&*s, &t, "bob", LONG).await;
    assert!(second.fencing_token > first.fencing_token);
    assert_ne!(second.lease_id, first.lease_id);
}

pub async fn stale_owner_can_do_nothing_after_a_reacquire(h: &impl Harness) {
    let s = h.store();
    let t = target("stale");
    let old = held(&*s, &t, "alice", SHORT).await;
    h.advance(PAST_SHORT).await;
    // The same owner name coming back gets a new lease; the old tuple stays dead.
    let new = held(&*s, &t, "alice", LONG).await;
    assert!(new.fencing_token > old.fencing_token);

    let renew = s
        .renew(&RenewRequest::new(t.clone(), holder(&old), LONG))
        .await
        .unwrap();
    assert_eq!(renew.outcome, Outcome::NotOwner);
    let release = s
        .release(&ReleaseRequest::new(t.clone(), holder(&old)))
        .await
        .unwrap();
    assert_eq!(release.outcome, Outcome::NotOwner);
    let commit = s
        .commit(&CommitRequest::new(t.clone(), old.fencing_token, "k", "v"))
        .await
        .unwrap();
    assert_eq!(commit.outcome, Outcome::StaleToken);

    let now = s.get(&t).await.unwrap();
    assert_eq!(now.outcome, Outcome::Found);
    assert_eq!(
        now.lease.unwrap(),
        new.clone().without_lease_id(),
        "new lease untouched"
    );
    let ok = s
        .commit(&CommitRequest::new(t.clone(), new.fencing_token, "k", "v"))
        .await
        .unwrap();
    assert_eq!(ok.outcome, Outcome::Committed);
}

pub async fn renew_extends_and_requires_the_exact_tuple(h: &impl Harness) {
    let s = h.store();
    let t = target("renew");
    let l = held(&*s, &t, "alice", Duration::from_secs(5)).await;
    let r = s
        .renew(&RenewRequest::new(t.clone(), holder(&l), LONG))
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
            ..holder(&l)
        },
        LeaseHandle {
            lease_id: "forged".into(),
            ..holder(&l)
        },
        LeaseHandle {
            token: l.fencing_token + 1,
            ..holder(&l)
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
        .renew(&RenewRequest::new(other, holder(&l), LONG))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Expired);
}

pub async fn release_frees_the_target_and_keeps_the_counter(h: &impl Harness) {
    let s = h.store();
    let t = target("release");
    let l = held(&*s, &t, "alice", LONG).await;
    let r = s
        .release(&ReleaseRequest::new(t.clone(), holder(&l)))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Released);
    assert_eq!(s.get(&t).await.unwrap().outcome, Outcome::NotFound);
    let again = s
        .release(&ReleaseRequest::new(t.clone(), holder(&l)))
        .await
        .unwrap();
    assert_eq!(
        again.outcome,
        Outcome::Expired,
        "a new request id sees the lease gone"
    );
    assert_eq!(
        held(&*s, &t, "bob", LONG).await.fencing_token,
        l.fencing_token + 1
    );
}

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
        .renew(&RenewRequest::new(t.clone(), holder(&l), LONG * 2))
        .await
        .unwrap();
    let third = s.acquire(&req).await.unwrap();
    assert_eq!(third.outcome, Outcome::Acquired);
    assert_eq!(third.lease, renewed.lease);

    // No second token was allocated by the replays.
    s.release(&ReleaseRequest::new(t.clone(), holder(&l)))
        .await
        .unwrap();
    assert_eq!(
        held(&*s, &t, "bob", LONG).await.fencing_token,
        l.fencing_token + 1
    );
}

pub async fn acquire_replay_after_expiry_or_supersession_reports_no_active_lease(h: &impl Harness) {
    let s = h.store();
    let t = target("replay-expired");
    let req = AcquireRequest::new(t.clone(), "alice", SHORT);
    let first = s.acquire(&req).await.unwrap();
    assert_eq!(first.outcome, Outcome::Acquired);
    h.advance(PAST_SHORT).await;
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
    s.release(&ReleaseRequest::new(t.clone(), holder(&alice)))
        .await
        .unwrap();
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
    s.release(&ReleaseRequest::new(t.clone(), holder(&l)))
        .await
        .unwrap();
    assert_eq!(
        held(&*s, &t, "bob", LONG).await.fencing_token,
        l.fencing_token + 1
    );
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

pub async fn renew_and_release_replays_return_the_original_result(h: &impl Harness) {
    let s = h.store();
    let t = target("replays");
    let l = held(&*s, &t, "alice", LONG).await;
    let renew = RenewRequest::new(t.clone(), holder(&l), LONG);
    let a = s.renew(&renew).await.unwrap();
    let b = s.renew(&renew).await.unwrap();
    assert_eq!(a.outcome, Outcome::Renewed);
    assert_eq!(b.outcome, Outcome::Renewed);
    assert_eq!(a.lease, b.lease, "a replay does not extend again");

    let release = ReleaseRequest::new(t.clone(), holder(&l));
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
        h.corrupt(&t, how, &holder(&l)).await;
        let before = h.snapshot(&t).await;

        let acquire = acquire(&*s, &t, "bob", LONG).await;
        assert_eq!(acquire.outcome, Outcome::CorruptState, "{how:?} acquire");
        let renew = s
            .renew(&RenewRequest::new(t.clone(), holder(&l), LONG))
            .await
            .unwrap();
        assert_eq!(renew.outcome, Outcome::CorruptState, "{how:?} renew");
        assert_eq!(
            s.get(&t).await.unwrap().outcome,
            Outcome::CorruptState,
            "{how:?} get"
        );
        let commit = s
            .commit(&CommitRequest::new(t.clone(), l.fencing_token, "k", "v"))
            .await
            .unwrap();
        assert_eq!(commit.outcome, Outcome::CorruptState, "{how:?} commit");
        let stranger = LeaseHandle {
            owner: "mallory".into(),
            ..holder(&l)
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
    h.corrupt(&t, Corruption::NoExpiry, &holder(&l)).await;
    let r = s
        .release(&ReleaseRequest::new(t.clone(), holder(&l)))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Released);
    assert_eq!(
        held(&*s, &t, "bob", LONG).await.fencing_token,
        l.fencing_token + 1
    );

    // An unreadable record only goes through revoke; the counter survives it.
    let t = target("cleanup-admin");
    let l = held(&*s, &t, "alice", LONG).await;
    h.corrupt(&t, Corruption::Garbage, &holder(&l)).await;
    let r = s
        .release(&ReleaseRequest::new(t.clone(), holder(&l)))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::CorruptState);
    let r = s
        .revoke(&RevokeRequest {
            reason: Some("cleanup".into()),
            ..RevokeRequest::new(t.clone())
        })
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Revoked);
    assert_eq!(
        held(&*s, &t, "bob", LONG).await.fencing_token,
        l.fencing_token + 1
    );
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
        .renew(&RenewRequest::new(t.clone(), holder(&l), LONG))
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
        .renew(&RenewRequest::new(t.clone(), holder(&l), LONG))
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

fn assert_invalid(r: Result<Reply, StoreError>, what: &str) {
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

pub async fn fenced_commit_accepts_only_the_live_token(h: &impl Harness) {
    let s = h.store();
    let t = target("commit");
    let none = s
        .commit(&CommitRequest::new(t.clone(), 1, "k", "v"))
        .await
        .unwrap();
    assert_eq!(none.outcome, Outcome::Expired, "no live lease");

    let first = held(&*s, &t, "alice", SHORT).await;
    let c = s
        .commit(&CommitRequest::new(
            t.clone(),
            first.fencing_token,
            "k",
            "from-first",
        ))
        .await
        .unwrap();
    assert_eq!(c.outcome, Outcome::Committed);
    let wrong = s
        .commit(&CommitRequest::new(
            t.clone(),
            first.fencing_token + 5,
            "k",
            "x",
        ))
        .await
        .unwrap();
    assert_eq!(wrong.outcome, Outcome::StaleToken);

    h.advance(PAST_SHORT).await;
    let expired = s
        .commit(&CommitRequest::new(
            t.clone(),
            first.fencing_token,
            "k",
            "late",
        ))
        .await
        .unwrap();
    assert_eq!(expired.outcome, Outcome::Expired);

    let second = held(&*s, &t, "bob", LONG).await;
    let c = s
        .commit(&CommitRequest::new(
            t.clone(),
            second.fencing_token,
            "k",
            "from-second",
        ))
        .await
        .unwrap();
    assert_eq!(c.outcome, Outcome::Committed);
    let stale = s
        .commit(&CommitRequest::new(
            t.clone(),
            first.fencing_token,
            "k",
            "stale",
        ))
        .await
        .unwrap();
    assert_eq!(stale.outcome, Outcome::StaleToken);
}

pub async fn revoke_ends_the_lease_but_never_lowers_the_token(h: &impl Harness) {
    let s = h.store();
    let t = target("revoke");
    let l = held(&*s, &t, "alice", LONG).await;
    let r = s
        .revoke(&RevokeRequest {
            reason: Some("maintenance".into()),
            ..RevokeRequest::new(t.clone())
        })
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Revoked);
    assert_eq!(r.lease.as_ref().unwrap().lease_id, None);
    let renew = s
        .renew(&RenewRequest::new(t.clone(), holder(&l), LONG))
        .await
        .unwrap();
    assert_eq!(renew.outcome, Outcome::Expired);
    let again = s
        .revoke(&RevokeRequest {
            reason: None,
            ..RevokeRequest::new(t.clone())
        })
        .await
        .unwrap();
    assert_eq!(again.outcome, Outcome::NotFound);
    assert_eq!(
        held(&*s, &t, "bob", LONG).await.fencing_token,
        l.fencing_token + 1
    );
}

pub async fn token_floor_raises_the_next_token(h: &impl Harness) {
    let s = h.store();
    let t = target("floor");
    let mut req = AcquireRequest::new(t.clone(), "alice", LONG);
    req.token_floor = Some(1000);
    let l = s.acquire(&req).await.unwrap().lease.unwrap();
    assert_eq!(l.fencing_token, 1001);
    s.release(&ReleaseRequest::new(t.clone(), holder(&l)))
        .await
        .unwrap();
    // A floor below the counter changes nothing.
    let mut req = AcquireRequest::new(t.clone(), "alice", LONG);
    req.token_floor = Some(5);
    assert_eq!(
        s.acquire(&req).await.unwrap().lease.unwrap().fencing_token,
        1002
    );
}

pub async fn commit_refuses_a_lower_token_even_after_counter_loss(h: &impl Harness) {
    let s = h.store();
    let t = target("counter-loss");
    let first = held(&*s, &t, "alice", LONG).await;
    s.release(&ReleaseRequest::new(t.clone(), holder(&first)))
        .await
        .unwrap();
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
    s.release(&ReleaseRequest::new(t.clone(), holder(&reissued)))
        .await
        .unwrap();

    // A caller-kept floor restores monotonicity.
    let mut req = AcquireRequest::new(t.clone(), "bob", LONG);
    req.token_floor = Some(second.fencing_token);
    let floored = s.acquire(&req).await.unwrap().lease.unwrap();
    assert_eq!(floored.fencing_token, 3);
    let c = CommitRequest::new(t.clone(), floored.fencing_token, "k", "v3");
    assert_eq!(s.commit(&c).await.unwrap().outcome, Outcome::Committed);
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
        .renew(&RenewRequest::new(t.clone(), holder(&first), LONG))
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
                ..holder(&l)
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
            reason: None,
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
