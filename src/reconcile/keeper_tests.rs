use super::*;
use crate::store::memory::MemoryStore;
use crate::store::{AcquireRequest, Lease, ReleaseRequest};

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);

fn handle(token: u64) -> LeaseHandle {
    LeaseHandle {
        owner: "job".into(),
        lease_id: "lease-id".into(),
        token,
    }
}

fn kept(ttl: Duration, renew: Duration, at: Instant) -> Kept {
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

fn key(name: &str) -> ObjectRef<TargetLease> {
    ObjectRef::new(name).within("ns")
}

fn found(token: u64, expires_ms: u64, now_ms: u64) -> Result<Reply, StoreError> {
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

fn outcome(o: Outcome) -> Result<Reply, StoreError> {
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
        keeper.confirmed(&key(name), k);
        keeper.published(&key(name), Some(7), true);
    }
    let due: Vec<_> = keeper
        .take_due(t0 + 10 * S)
        .into_iter()
        .map(|(k, _)| k.name)
        .collect();
    assert_eq!(due, ["soonest", "middle", "later"]);
    assert!(keeper.take_due(t0 + 10 * S).is_empty(), "now in flight");
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
    assert_eq!(retry_after(5, Duration::ZERO), 50 * MS, "at least 50 ms");
}

#[test]
fn a_replica_that_may_not_lead_never_shortens_the_lease() {
    let ttl = 5 * S;
    // Another replica renewed it for 60s: ask for what is left of that.
    assert_eq!(
        keep_ttl(ttl, &handle(7), found(7, 100_000 + 42_000, 100_000)),
        Ok(42 * S)
    );
    assert_eq!(
        keep_ttl(ttl, &handle(7), found(7, 100_000 + 1_000, 100_000)),
        Ok(ttl)
    );
    // Another lease (a new token) or none: this one ended.
    assert_eq!(
        keep_ttl(ttl, &handle(7), found(8, 200_000, 100_000)),
        Err(After::Ended)
    );
    assert_eq!(
        keep_ttl(ttl, &handle(7), outcome(Outcome::NotFound)),
        Err(After::Ended)
    );
    assert_eq!(
        keep_ttl(
            ttl,
            &handle(7),
            Err(StoreError::BackendUnavailable("down".into()))
        ),
        Err(After::Retry)
    );
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
    keeper.confirmed(&key("a"), kept(9 * S, 3 * S, t0));
    keeper.published(&key("a"), Some(7), true);
    let mut again = kept(9 * S, 3 * S, t0 + S);
    again.published = false;
    keeper.confirmed(&key("a"), again);
    assert!(
        keeper.lock()[&key("a")].published,
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
    keeper.confirmed(&key("a"), other);
    assert!(
        !keeper.lock()[&key("a")].published,
        "a new token is not published yet"
    );
    keeper.published(&key("a"), Some(7), true);
    assert!(
        !keeper.lock()[&key("a")].published,
        "status names the old token"
    );
    assert_eq!(keeper.confirmation(&key("a")).unwrap().token, 8);
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
        keeper.confirmed(&key(name), k);
        leases.push(handle);
    }
    let task = tokio::spawn(keeper.clone().run(Leadership::always()));
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
    keeper.confirmed(&key("a"), k);
    store
        .release(&ReleaseRequest::new(target.clone(), handle))
        .await
        .unwrap();
    // Not leading: the keeper reads first, finds nothing, and stops.
    let gate = Leadership::elected();
    let task = tokio::spawn(keeper.clone().run(gate));
    let woken = tokio::time::timeout(2 * S, futures::StreamExt::next(&mut rx)).await;
    assert_eq!(woken.ok().flatten(), Some(key("a")));
    assert!(keeper.is_empty());
    task.abort();
}

/// Not leading, the keeper renews for at least what another replica left:
/// a longer renewal made by the new leader is never cut short.
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
    keeper.confirmed(&key("a"), k);
    // The new leader renews it for 30s (a spec edit lengthened it).
    let long = store
        .renew(&RenewRequest::new(target.clone(), handle, 30 * S))
        .await
        .unwrap();
    let promised = long.lease.unwrap().expires_at_ms;
    let task = tokio::spawn(keeper.clone().run(Leadership::elected()));
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
