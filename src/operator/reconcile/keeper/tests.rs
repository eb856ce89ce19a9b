use super::*;
use crate::operator::crd::Phase;
use crate::store::memory::MemoryStore;
use crate::store::{AcquireRequest, Lease, Outcome, ReleaseRequest, Reply, StoreError, Target};

pub(super) const S: Duration = Duration::from_secs(1);
pub(super) const MS: Duration = Duration::from_millis(1);

pub(super) fn handle(token: u64) -> LeaseHandle {
    LeaseHandle {
        owner: "job".into(),
        lease_id: "lease-id".into(),
        token,
    }
}

pub(super) fn kept(ttl: Duration, renew: Duration, at: Instant) -> Kept {
    let mut k = Kept::new(
        Target::new("ns", "t"),
        handle(7),
        (ttl, renew),
        at,
        (1_000, None),
    );
    k.published = true;
    k
}

pub(super) fn key(name: &str) -> ObjectRef<TargetLease> {
    ObjectRef::new(name).within("ns")
}

/// The keeper's own key of `key(name)`.
pub(super) fn nk(name: &str) -> NsName {
    NsName::of(&key(name))
}

pub(super) fn found(token: u64, expires_ms: u64, now_ms: u64) -> Result<Reply, StoreError> {
    Ok(Reply {
        outcome: Outcome::Found,
        lease: Some(Lease {
            target: "t".into(),
            lease_id: None,
            owner: "job".into(),
            fencing_token: token,
            acquired_at_ms: 0,
            expires_at_ms: expires_ms,
            max_expires_at_ms: None,
            metadata: None,
        }),
        server_time_ms: now_ms,
        message: String::new(),
    })
}

pub(super) fn outcome(o: Outcome) -> Result<Reply, StoreError> {
    Ok(Reply {
        outcome: o,
        lease: None,
        server_time_ms: 0,
        message: String::new(),
    })
}

#[test]
fn the_keeper_waits_for_the_reconcile_then_for_the_retry_time() {
    let t0 = Instant::now();
    // 9s lease renewed every 3s: the reconcile renews at 3s, the keeper at 4.5s.
    let mut k = kept(9 * S, 3 * S, t0);
    assert_eq!(due_at(&k), t0 + 4500 * MS);
    // Renew interval at half the duration: still before the lease runs out.
    assert_eq!(due_at(&kept(4 * S, 2 * S, t0)), t0 + 2500 * MS);
    k.retry_at = Some(t0 + 100 * MS);
    assert_eq!(due_at(&k), t0 + 100 * MS);
}

#[test]
fn the_lease_closest_to_its_expiry_is_renewed_first() {
    let keeper = Keeper::new(
        Arc::new(MemoryStore::default()),
        Arc::new(ServerClock::new()),
    );
    let t0 = Instant::now();
    for (name, expires_ms) in [("later", 9_000), ("soonest", 2_000), ("middle", 5_000)] {
        let mut k = kept(9 * S, 3 * S, t0);
        k.expires_ms = expires_ms;
        keeper.confirmed(&key(name), k, keeper.term());
        keeper.may_publish(&key(name), &status(7, Phase::Held), keeper.term());
    }
    let due: Vec<_> = keeper
        .take_due(t0 + 10 * S)
        .1
        .into_iter()
        .map(|(k, _)| k.name().to_owned())
        .collect();
    assert_eq!(due, ["soonest", "middle", "later"]);
    assert!(keeper.take_due(t0 + 10 * S).1.is_empty(), "now in flight");
}

#[test]
fn retries_back_off_but_never_past_half_the_time_left() {
    let long = 60 * S;
    let table = [
        (1, 200),
        (2, 400),
        (3, 800),
        (4, 1600),
        (5, 3200),
        (9, 3200),
    ];
    for (failures, ms) in table {
        assert_eq!(retry_after(failures, long), ms * MS, "{failures}");
    }
    assert_eq!(retry_after(5, 2 * S), S);
    assert_eq!(retry_after(5, 60 * MS), 50 * MS, "at least 50 ms");
    // Past the expiry: the plain backoff, never below a second.
    assert_eq!(retry_after(1, Duration::ZERO), S);
    assert_eq!(retry_after(5, Duration::ZERO), 3200 * MS);
    assert_eq!(retry_after(9, Duration::ZERO), 3200 * MS);
}

/// While another replica takes over, a lease is renewed from here only as
/// long as Valkey shows the expiry this process set: another expiry means
/// the new leader renewed it.
#[test]
fn a_handed_over_lease_is_renewed_until_the_new_leader_renews_it() {
    let k = kept(9 * S, 3 * S, Instant::now()); // expires_ms 1_000
    assert_eq!(still_ours(&k, found(7, 1_000, 500)), Ok(()));
    assert_eq!(
        still_ours(&k, found(7, 1_200, 500)),
        Err(After::HandedOver),
        "renewed by the new leader"
    );
    // Another lease (a new token) or none: this one ended.
    assert_eq!(still_ours(&k, found(8, 1_000, 500)), Err(After::Ended));
    assert_eq!(
        still_ours(&k, outcome(Outcome::NotFound)),
        Err(After::Ended)
    );
    assert_eq!(
        still_ours(&k, Err(StoreError::BackendUnavailable("down".into()))),
        Err(After::Retry)
    );
}

/// The keeper renews as soon as an expiry status may publish has passed
/// without a confirmation sent after it, not only on its own schedule.
#[test]
fn the_keeper_renews_once_a_published_expiry_passes_unconfirmed() {
    let t0 = Instant::now();
    let mut k = kept(9 * S, 3 * S, t0);
    k.confirmed_sent_ms = Some(10_000);
    k.publishes = vec![19_000];
    let early = t0 + S;
    assert!(!is_due(&k, early, 18_000), "before the expiry, not due");
    assert!(!is_due(&k, early, 19_000), "at it, not yet");
    assert!(is_due(&k, early, 19_001), "past it, due at once");
    // A confirmation sent after it covers it.
    k.confirmed_sent_ms = Some(19_050);
    assert!(!is_due(&k, early, 19_100));
    // Any of several candidate expiries counts.
    k.publishes = vec![19_000, 25_000];
    assert!(is_due(&k, early, 25_001));
    // A failed renewal waits for its retry time.
    k.confirmed_sent_ms = Some(10_000);
    k.retry_at = Some(t0 + 2 * S);
    assert!(!is_due(&k, early, 19_001));
    assert!(is_due(&k, t0 + 2 * S, 19_001));
    // Nothing published: only the schedule.
    let mut k = kept(9 * S, 3 * S, t0);
    k.confirmed_sent_ms = Some(10_000);
    assert!(!is_due(&k, early, 99_000));
    assert!(is_due(&k, t0 + 4500 * MS, 99_000));
}

#[test]
fn renewal_replies_decide_between_keeping_stopping_and_retrying() {
    let renewed = Ok(Reply {
        outcome: Outcome::Renewed,
        lease: found(7, 5_000, 0).unwrap().lease,
        server_time_ms: 0,
        message: String::new(),
    });
    assert_eq!(
        after_renew(&renewed),
        After::Renewed {
            expires_ms: 5_000,
            max_expires_ms: None
        }
    );
    for gone in [
        Outcome::NotOwner,
        Outcome::Expired,
        Outcome::NotFound,
        Outcome::CorruptState,
    ] {
        assert_eq!(after_renew(&outcome(gone)), After::Ended, "{gone}");
    }
    assert_eq!(
        after_renew(&Err(StoreError::OutcomeUnknown("lost".into()))),
        After::Unknown,
        "a lost reply: it may have been renewed"
    );
    assert_eq!(
        after_renew(&Err(StoreError::BackendUnavailable("down".into()))),
        After::Retry
    );
    assert_eq!(
        after_renew(&Err(StoreError::Invalid("bad".into()))),
        After::Ended
    );
}

#[test]
fn a_new_lease_replaces_the_kept_one_and_the_same_lease_stays_published() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::default());
    let keeper = Keeper::new(store, Arc::new(ServerClock::new()));
    let t0 = Instant::now();
    keeper.confirmed(&key("a"), kept(9 * S, 3 * S, t0), keeper.term());
    keeper.may_publish(&key("a"), &status(7, Phase::Held), keeper.term());
    let mut again = kept(9 * S, 3 * S, t0 + S);
    again.published = false;
    keeper.confirmed(&key("a"), again, keeper.term());
    assert!(
        keeper.lock()[&nk("a")].published,
        "same lease, still published"
    );
    let mut other = Kept::new(
        Target::new("ns", "t"),
        handle(8),
        (9 * S, 3 * S),
        t0 + 2 * S,
        (9_000, None),
    );
    other.published = false;
    keeper.confirmed(&key("a"), other, keeper.term());
    assert!(
        !keeper.lock()[&nk("a")].published,
        "a new token is not published yet"
    );
    keeper.may_publish(&key("a"), &status(7, Phase::Held), keeper.term());
    assert!(
        !keeper.lock()[&nk("a")].published,
        "status names the old token"
    );
    assert_eq!(keeper.confirmation(&key("a")).unwrap().token, 8);
}

pub(super) fn status(token: u64, phase: Phase) -> TargetLeaseStatus {
    TargetLeaseStatus {
        phase: Some(phase),
        holder: Some("job".into()),
        acquisition_id: Some("a1".into()),
        fencing_token: Some(token),
        expires_at: crate::operator::reconcile::transition::time_ms(20_000),
        ..Default::default()
    }
}

/// A lease counts as published from the write that may publish it (its
/// reply may be lost) until a write withdrawing it is acknowledged; a read
/// that does not show it (a stale cache) withdraws nothing.
#[test]
fn a_lease_is_published_from_the_write_until_its_withdrawal_is_acknowledged() {
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::default());
    let keeper = Keeper::new(store, Arc::new(ServerClock::new()));
    let mut k = kept(9 * S, 3 * S, Instant::now());
    k.published = false;
    keeper.confirmed(&key("a"), k, keeper.term());
    let published = || keeper.lock()[&nk("a")].published;
    let pending = TargetLeaseStatus {
        phase: Some(Phase::Pending),
        ..status(7, Phase::Pending)
    };
    keeper.may_publish(&key("a"), &pending, keeper.term());
    assert!(!published(), "nothing publishes it yet");
    // The status write that publishes Held is about to be sent.
    keeper.may_publish(&key("a"), &status(7, Phase::Held), keeper.term());
    assert!(published());
    assert_eq!(keeper.lock()[&nk("a")].publishes, vec![20_000]);
    // Its reply was lost; the cache still shows the old status.
    keeper.may_publish(&key("a"), &pending, keeper.term());
    assert!(published(), "a read never withdraws it");
    // A release: withdrawing Held is sent, its reply lost: still published.
    keeper.may_publish(&key("a"), &pending, keeper.term());
    assert!(published());
    // Acknowledged: now it is not.
    keeper.acknowledged(&key("a"), &pending);
    assert!(!published());
    assert!(keeper.lock()[&nk("a")].publishes.is_empty());
    // An acknowledged write that publishes it, with its expiry.
    keeper.acknowledged(&key("a"), &status(7, Phase::Unknown));
    assert!(published(), "Unknown still publishes the lease");
    assert_eq!(keeper.lock()[&nk("a")].publishes, vec![20_000]);
}

/// The keeper alone keeps a published lease alive in the store for many
/// times its duration, stops renewals an unpublished lease, and lets a
/// forgotten one run out.
#[tokio::test]
async fn published_leases_are_kept_alive_without_their_reconcile() {
    let store = Arc::new(MemoryStore::default());
    let dyn_store: Arc<dyn LeaseStore> = store.clone();
    let clock = Arc::new(ServerClock::new());
    let keeper = Arc::new(Keeper::new(dyn_store.clone(), clock.clone()));
    let ttl = 600 * MS;
    let mut leases = Vec::new();
    for name in ["published", "unpublished"] {
        let sent = Instant::now();
        let reply = store
            .acquire(&AcquireRequest::new(Target::new("ns", name), "job", ttl))
            .await
            .unwrap();
        let lease = reply.lease.unwrap();
        let handle = lease.handle().unwrap();
        let mut k = Kept::new(
            Target::new("ns", name),
            handle.clone(),
            (ttl, 200 * MS),
            sent,
            (lease.expires_at_ms, None),
        );
        k.published = name == "published";
        keeper.confirmed(&key(name), k, keeper.term());
        leases.push(handle);
    }
    let task = tokio::spawn(keeper.clone().run());
    tokio::time::sleep(3 * S).await;
    let live = |name: &'static str| {
        let store = store.clone();
        async move { store.get(&Target::new("ns", name)).await.unwrap().outcome == Outcome::Found }
    };
    assert!(live("published").await, "kept alive for 5 durations");
    assert!(!live("unpublished").await, "never renewed by the keeper");
    assert!(clock.is_anchored(), "the keeper's replies anchor the clock");
    let c = keeper.confirmation(&key("published")).unwrap();
    assert!(c.at.elapsed() < ttl, "confirmed recently");

    keeper.forget(&key("published"));
    tokio::time::sleep(2 * ttl).await;
    assert!(!live("published").await, "a forgotten lease runs out");
    task.abort();
}

/// A lease released elsewhere (its TargetLease moved it on another replica)
/// ends at the keeper's next renewal, which tells the reconcile.
#[tokio::test]
async fn a_lease_that_ended_is_dropped_and_its_reconcile_woken() {
    let store = Arc::new(MemoryStore::default());
    let dyn_store: Arc<dyn LeaseStore> = store.clone();
    let keeper = Arc::new(Keeper::new(dyn_store, Arc::new(ServerClock::new())));
    let (tx, mut rx) = futures::channel::mpsc::unbounded();
    keeper.wake_through(Some(tx));
    let target = Target::new("ns", "t");
    let ttl = 600 * MS;
    let sent = Instant::now();
    let lease = store
        .acquire(&AcquireRequest::new(target.clone(), "job", ttl))
        .await
        .unwrap()
        .lease
        .unwrap();
    let handle = lease.handle().unwrap();
    let mut k = Kept::new(
        target.clone(),
        handle.clone(),
        (ttl, 200 * MS),
        sent,
        (lease.expires_at_ms, None),
    );
    k.published = true;
    keeper.confirmed(&key("a"), k, keeper.term());
    store
        .release(&ReleaseRequest::new(target.clone(), handle))
        .await
        .unwrap();
    // The renewal finds nothing, and the keeper stops.
    let task = tokio::spawn(keeper.clone().run());
    let woken = tokio::time::timeout(2 * S, futures::StreamExt::next(&mut rx)).await;
    assert_eq!(woken.ok().flatten(), Some(key("a")));
    assert!(keeper.is_empty());
    task.abort();
}

/// A keeper renewal never shortens a lease: a longer renewal made by the
/// new leader (a spec edit lengthened it) is never cut short, even by a
/// replica that never saw that leader.
#[tokio::test]
async fn a_keeper_renewal_never_cuts_short_a_longer_one() {
    let store = Arc::new(MemoryStore::default());
    let dyn_store: Arc<dyn LeaseStore> = store.clone();
    let keeper = Arc::new(Keeper::new(dyn_store, Arc::new(ServerClock::new())));
    let target = Target::new("ns", "t");
    let ttl = 400 * MS;
    let sent = Instant::now();
    let lease = store
        .acquire(&AcquireRequest::new(target.clone(), "job", ttl))
        .await
        .unwrap()
        .lease
        .unwrap();
    let handle = lease.handle().unwrap();
    let mut k = Kept::new(
        target.clone(),
        handle.clone(),
        (ttl, 100 * MS),
        sent,
        (lease.expires_at_ms, None),
    );
    k.published = true;
    keeper.confirmed(&key("a"), k, keeper.term());
    // The new leader renews it for 30s (a spec edit lengthened it).
    let long = store
        .renew(&RenewRequest::new(target.clone(), handle, 30 * S))
        .await
        .unwrap();
    let promised = long.lease.unwrap().expires_at_ms;
    let task = tokio::spawn(keeper.clone().run());
    tokio::time::sleep(S).await;
    let c = keeper.confirmation(&key("a")).unwrap();
    assert!(c.at.elapsed() < S, "the keeper renewed");
    let now = store
        .get(&target)
        .await
        .unwrap()
        .lease
        .unwrap()
        .expires_at_ms;
    assert!(now >= promised, "{now} < {promised}");
    task.abort();
}

/// After another replica takes the lead, each lease is still renewed from
/// here until Valkey shows that the new leader renewed it; then it is left
/// to that replica for good, and nobody's reconcile is woken.
#[tokio::test]
async fn a_former_leader_renews_each_lease_until_the_new_leader_does() {
    let store = Arc::new(MemoryStore::default());
    let dyn_store: Arc<dyn LeaseStore> = store.clone();
    let keeper = Arc::new(Keeper::new(dyn_store, Arc::new(ServerClock::new())));
    let (tx, mut rx) = futures::channel::mpsc::unbounded();
    keeper.wake_through(Some(tx));
    let ttl = 600 * MS;
    let mut handles = Vec::new();
    for name in ["renewed-by-the-new-leader", "not-yet"] {
        let target = Target::new("ns", name);
        let sent = Instant::now();
        let lease = store
            .acquire(&AcquireRequest::new(target.clone(), "job", ttl))
            .await
            .unwrap()
            .lease
            .unwrap();
        let mut k = Kept::new(
            target,
            lease.handle().unwrap(),
            (ttl, 200 * MS),
            sent,
            (lease.expires_at_ms, None),
        );
        k.published = true;
        keeper.confirmed(&key(name), k, keeper.term());
        handles.push(lease.handle().unwrap());
    }
    keeper.hand_over();
    let task = tokio::spawn(keeper.clone().run());
    tokio::time::sleep(100 * MS).await;
    // The new leader's reconcile renews one of them.
    let target = Target::new("ns", "renewed-by-the-new-leader");
    store
        .renew(&RenewRequest::new(target.clone(), handles[0].clone(), ttl))
        .await
        .unwrap();
    tokio::time::sleep(3 * S).await;
    let live = |name: &'static str| {
        let store = store.clone();
        async move { store.get(&Target::new("ns", name)).await.unwrap().outcome == Outcome::Found }
    };
    assert!(live("not-yet").await, "kept alive for 5 durations");
    assert!(
        !live("renewed-by-the-new-leader").await,
        "left to the new leader (which renewed it once, then stopped)"
    );
    assert_eq!(keeper.keys(), vec![nk("not-yet")]);
    assert!(rx.try_recv().is_err(), "nobody woken");
    task.abort();
}
