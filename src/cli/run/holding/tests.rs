//! `run`'s hold loop on the reference store, with tokio's paused clock driving
//! both the loop and the store: renewals, losses and waits play out in
//! simulated time, deterministically.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;

use super::*;
use crate::cli::run::Signals;
use crate::cli::run::report::ending;
use crate::store::memory::{Clock, MemoryStore};
use crate::store::{Health, RevokeRequest};

/// The store's clock follows tokio's (paused) clock.
struct TokioClock(tokio::time::Instant);

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        1_700_000_000_000 + self.0.elapsed().as_millis() as u64
    }
}

fn memory() -> Arc<MemoryStore> {
    Arc::new(MemoryStore::new(Arc::new(TokioClock(
        tokio::time::Instant::now(),
    ))))
}

/// A store that stops answering (every call `backend_unavailable`) when told to.
struct Flaky {
    inner: Arc<MemoryStore>,
    down: AtomicBool,
}

impl Flaky {
    fn gate(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            Err(StoreError::BackendUnavailable("refused".into()))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl LeaseStore for Flaky {
    async fn acquire(&self, r: &AcquireRequest) -> Result<Reply, StoreError> {
        self.gate()?;
        self.inner.acquire(r).await
    }
    async fn renew(&self, r: &RenewRequest) -> Result<Reply, StoreError> {
        self.gate()?;
        self.inner.renew(r).await
    }
    async fn release(&self, r: &ReleaseRequest) -> Result<Reply, StoreError> {
        self.gate()?;
        self.inner.release(r).await
    }
    async fn get(&self, t: &Target) -> Result<Reply, StoreError> {
        self.gate()?;
        self.inner.get(t).await
    }
    async fn read(&self, t: &Target, key: &str) -> Result<crate::store::ReadReply, StoreError> {
        self.inner.read(t, key).await
    }
    async fn list(
        &self,
        ns: Option<&str>,
        prefix: &str,
    ) -> Result<Vec<crate::store::Listed>, StoreError> {
        self.inner.list(ns, prefix).await
    }
    async fn revoke(&self, r: &RevokeRequest) -> Result<Reply, StoreError> {
        self.inner.revoke(r).await
    }
    async fn commit(&self, r: &crate::store::CommitRequest) -> Result<Reply, StoreError> {
        self.inner.commit(r).await
    }
    async fn health(&self) -> Result<Health, StoreError> {
        self.inner.health().await
    }
}

const TTL: Duration = Duration::from_secs(3);

fn target() -> Target {
    Target::new("ns", "t")
}

async fn granted_on(store: &dyn LeaseStore) -> Granted {
    let sent = Instant::now();
    let reply = store
        .acquire(&AcquireRequest::new(target(), "me", TTL))
        .await
        .unwrap();
    granted(reply, sent).expect("a fresh target is granted")
}

#[tokio::test(start_paused = true)]
async fn renewals_keep_the_lease_through_many_ttls() {
    let store = memory();
    let g = granted_on(&*store).await;
    let token = g.handle.token;
    let (tx, mut rx) = oneshot::channel();
    let renewer = tokio::spawn(renew_until_lost(store.clone(), target(), g, TTL, tx));
    tokio::time::sleep(TTL * 10).await;
    assert!(rx.try_recv().is_err(), "no loss reported");
    let now = store.get(&target()).await.unwrap();
    assert_eq!(now.lease.unwrap().fencing_token, token);
    renewer.abort();
}

#[tokio::test(start_paused = true)]
async fn a_revoked_lease_is_reported_at_the_next_renewal() {
    let store = memory();
    let g = granted_on(&*store).await;
    let (tx, rx) = oneshot::channel();
    let started = Instant::now();
    tokio::spawn(renew_until_lost(store.clone(), target(), g, TTL, tx));
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.revoke(&RevokeRequest::new(target())).await.unwrap();
    let lost = rx.await.expect("a loss is reported");
    assert_ne!(lost.answer(), Answer::Store(Outcome::Renewed));
    assert!(
        started.elapsed() <= TTL / 3 + Duration::from_millis(50),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_silent_store_costs_the_lease_at_its_expiry_not_before() {
    let flaky = Arc::new(Flaky {
        inner: memory(),
        down: AtomicBool::new(false),
    });
    let g = granted_on(&*flaky).await;
    let expires = g.expires;
    let (tx, rx) = oneshot::channel();
    flaky.down.store(true, Ordering::SeqCst);
    tokio::spawn(renew_until_lost(flaky.clone(), target(), g, TTL, tx));
    let lost = rx.await.expect("a loss is reported");
    let now = Instant::now();
    assert!(now >= expires, "presumed lost only once it expired");
    assert!(now <= expires + Duration::from_millis(50));
    assert_eq!(lost.answer(), Answer::BackendUnavailable);
    assert!(lost.message.contains("presumed lost"), "{}", lost.message);
}

#[tokio::test(start_paused = true)]
async fn a_held_target_is_acquired_once_it_frees_within_the_wait() {
    let store = memory();
    store
        .acquire(&AcquireRequest::new(
            target(),
            "other",
            Duration::from_secs(2),
        ))
        .await
        .unwrap();
    let mut signals = Signals::install().unwrap();
    let s: Arc<dyn LeaseStore> = store.clone();
    let connect = move || -> BoxFuture<'static, Result<Arc<dyn LeaseStore>, StoreError>> {
        let s = s.clone();
        Box::pin(async move { Ok(s) })
    };
    let req = AcquireRequest::new(target(), "me", TTL);
    let started = Instant::now();
    let result = acquire_within(
        &connect,
        &req,
        Duration::from_secs(5),
        TTL,
        &mut signals,
        &mut |_| {},
    )
    .await;
    let (_, g) = result.ok().expect("acquired within the wait");
    assert_eq!(g.handle.token, 2);
    assert!(started.elapsed() >= Duration::from_secs(2));

    // Held past the wait: refused with the holder's outcome.
    let req = AcquireRequest::new(target(), "late", TTL);
    match acquire_within(
        &connect,
        &req,
        Duration::from_secs(1),
        TTL,
        &mut signals,
        &mut |_| {},
    )
    .await
    {
        Err(NotAcquired::Refused(env)) => assert_eq!(env.answer(), Answer::Store(Outcome::Held)),
        _ => panic!("must be refused as held"),
    }
}

/// `connect` for `acquire_within`, always answering with `store`.
fn connecting_to(
    store: Arc<dyn LeaseStore>,
) -> impl Fn() -> BoxFuture<'static, Result<Arc<dyn LeaseStore>, StoreError>> + Sync {
    move || {
        let s = store.clone();
        Box::pin(async move { Ok(s) })
    }
}

/// With release notices, a waiter asks again at the release itself (not
/// at a poll: it sends no acquire in between), and at the lease's expiry
/// when nothing announces it.
#[tokio::test(start_paused = true)]
async fn a_waiter_with_notices_asks_at_the_release_and_at_the_expiry_only() {
    let store = memory();
    let other = store
        .acquire(&AcquireRequest::new(
            target(),
            "other",
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    let mut signals = Signals::install().unwrap();
    let connect = connecting_to(store.clone());
    let asked = std::sync::atomic::AtomicUsize::new(0);
    let req = AcquireRequest::new(target(), "me", TTL);
    let started = Instant::now();
    let release_at = Duration::from_millis(5_300);
    let s = store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(release_at).await;
        let handle = other.lease.unwrap().handle().unwrap();
        s.release(&ReleaseRequest::new(target(), handle))
            .await
            .unwrap();
    });
    let mut count = |_: &Envelope| {
        asked.fetch_add(1, Ordering::SeqCst);
    };
    let (_, g) = acquire_within(
        &connect,
        &req,
        Duration::from_secs(30),
        TTL,
        &mut signals,
        &mut count,
    )
    .await
    .ok()
    .expect("acquired within the wait");
    assert_eq!(g.handle.token, 2);
    assert_eq!(started.elapsed(), release_at, "acquired at the release");
    // The first `held` (then subscribed) and the one asked right after it.
    assert_eq!(asked.load(Ordering::SeqCst), 1, "no polls while subscribed");

    // Nothing announces an expiry here: the lease's expiry wakes it.
    let t = Target::new("ns", "expiring");
    let ttl = Duration::from_secs(2);
    store
        .acquire(&AcquireRequest::new(t.clone(), "other", ttl))
        .await
        .unwrap();
    let req = AcquireRequest::new(t, "me", TTL);
    let started = Instant::now();
    acquire_within(
        &connect,
        &req,
        Duration::from_secs(30),
        TTL,
        &mut signals,
        &mut |_| {},
    )
    .await
    .ok()
    .expect("acquired at the lease's expiry");
    let took = started.elapsed();
    assert!(
        took >= ttl && took <= ttl + Duration::from_millis(50),
        "{took:?}"
    );
}

#[test]
fn run_exits_with_the_command_s_code_unless_the_lease_was_lost() {
    let released = Answer::Store(Outcome::Released);
    assert_eq!(ending(0, released, false), (0, false));
    assert_eq!(ending(7, released, false), (7, false));
    // Lost while CMD ran: the lost code, whatever CMD's.
    assert_eq!(
        ending(0, Answer::Store(Outcome::Expired), true),
        (124, true)
    );
    assert_eq!(ending(5, Answer::BackendUnavailable, true), (124, true));
    // The final release found the lease already gone: a loss too.
    assert_eq!(
        ending(0, Answer::Store(Outcome::NotOwner), false),
        (124, true)
    );
    // The release could not be confirmed: CMD's code stands.
    assert_eq!(ending(0, Answer::OutcomeUnknown, false), (0, false));
}
