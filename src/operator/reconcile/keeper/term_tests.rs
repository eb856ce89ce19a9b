//! The keeper across changes of leader and lost replies: what a renewal
//! whose reply was lost, a takeover and a term that ended leave kept
//! (helpers in `tests.rs`).

use std::sync::atomic::AtomicUsize;

use super::tests::{MS, S, found, handle, kept, key, nk, status};
use super::*;
use crate::operator::crd::Phase;
use crate::store::memory::MemoryStore;
use crate::store::{AcquireRequest, Outcome, Reply, StoreError};

/// A memory store whose next `lose` renewals take effect and lose their reply.
#[derive(Default)]
struct LosesReplies {
    inner: MemoryStore,
    lose: AtomicUsize,
    reads: AtomicUsize,
}

#[async_trait::async_trait]
impl LeaseStore for LosesReplies {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Reply, StoreError> {
        self.inner.acquire(req).await
    }
    async fn renew(&self, req: &RenewRequest) -> Result<Reply, StoreError> {
        let reply = self.inner.renew(req).await;
        let lost = self
            .lose
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if lost {
            return Err(StoreError::OutcomeUnknown("reply lost".into()));
        }
        reply
    }
    async fn release(&self, req: &crate::store::ReleaseRequest) -> Result<Reply, StoreError> {
        self.inner.release(req).await
    }
    async fn get(&self, target: &crate::store::Target) -> Result<Reply, StoreError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.inner.get(target).await
    }
    async fn revoke(&self, req: &crate::store::RevokeRequest) -> Result<Reply, StoreError> {
        self.inner.revoke(req).await
    }
    async fn commit(&self, req: &crate::store::CommitRequest) -> Result<Reply, StoreError> {
        self.inner.commit(req).await
    }
    async fn read(
        &self,
        target: &crate::store::Target,
        key: &str,
    ) -> Result<crate::store::ReadReply, StoreError> {
        self.inner.read(target, key).await
    }
    async fn list(
        &self,
        namespace: Option<&str>,
        target_prefix: &str,
    ) -> Result<Vec<crate::store::Listed>, StoreError> {
        self.inner.list(namespace, target_prefix).await
    }
    async fn health(&self) -> Result<crate::store::Health, StoreError> {
        self.inner.health().await
    }
}

/// A keeper on `store` keeping one published lease of `ttl` on target `t`
/// (renew interval a third of it), acquired now.
async fn keeping(store: Arc<LosesReplies>, ttl: Duration) -> (Arc<Keeper>, LeaseHandle) {
    let dyn_store: Arc<dyn LeaseStore> = store.clone();
    let keeper = Arc::new(Keeper::new(dyn_store, Arc::new(ServerClock::new())));
    let target = crate::store::Target::new("ns", "t");
    let sent = Instant::now();
    let lease = store
        .acquire(&AcquireRequest::new(target.clone(), "job", ttl))
        .await
        .unwrap()
        .lease
        .unwrap();
    let handle = lease.handle().unwrap();
    let mut k = Kept::new(
        target,
        handle.clone(),
        (ttl, ttl / 3),
        sent,
        (lease.expires_at_ms, None),
    );
    k.published = true;
    keeper.confirmed(&key("a"), k, keeper.term());
    (keeper, handle)
}

async fn live(store: &LosesReplies) -> bool {
    let target = crate::store::Target::new("ns", "t");
    store.inner.get(&target).await.unwrap().outcome == Outcome::Found
}

/// After another replica took the lead, the former leader's keeper renews
/// a lease and the reply is lost: the expiry Valkey now shows is its own
/// renewal's, not the new leader's. It is not taken for a handover: the
/// keeper renews with the same lease id, without reading, until a renewal
/// is answered, and keeps the lease alive (nobody else renews it here).
#[tokio::test]
async fn a_lost_renewal_reply_is_not_taken_for_the_new_leaders_renewal() {
    let store = Arc::new(LosesReplies::default());
    let (keeper, _) = keeping(store.clone(), 600 * MS).await;
    keeper.hand_over();
    store.lose.store(1, Ordering::SeqCst);
    let task = tokio::spawn(keeper.clone().run());
    tokio::time::sleep(3 * S).await;
    assert_eq!(store.lose.load(Ordering::SeqCst), 0, "a reply was lost");
    assert!(live(&store).await, "kept alive for 5 durations");
    assert_eq!(
        keeper.keys(),
        vec![nk("a")],
        "still this replica's to renew"
    );
    task.abort();
}

/// A renewal whose reply was lost (the keeper's or a reconcile's) may have
/// moved Valkey's expiry either way (a plain renewal can shorten it): no
/// reconcile relies on the last confirmation until a renewal is answered.
#[test]
fn a_lost_reply_hides_the_confirmation_until_a_renewal_is_answered() {
    let keeper = Keeper::new(
        Arc::new(MemoryStore::default()),
        Arc::new(ServerClock::new()),
    );
    let t0 = Instant::now();
    keeper.confirmed(&key("a"), kept(9 * S, 3 * S, t0), keeper.term());
    keeper.maybe_renewed(&key("a"), 6);
    assert!(keeper.confirmation(&key("a")).is_some(), "another lease's");
    keeper.maybe_renewed(&key("a"), 7);
    assert_eq!(keeper.confirmation(&key("a")), None);
    // The keeper's next renewal is answered.
    let (term, due) = keeper.take_due(t0 + 10 * S);
    assert_eq!(due.len(), 1);
    let renewed = After::Renewed {
        expires_ms: 12_000,
        max_expires_ms: None,
    };
    keeper.settle(&nk("a"), &handle(7), term, t0 + 10 * S, renewed);
    assert_eq!(keeper.confirmation(&key("a")).unwrap().expires_ms, 12_000);
    // Its own lost reply: the same.
    let (term, _) = keeper.take_due(t0 + 20 * S);
    keeper.settle(&nk("a"), &handle(7), term, t0 + 20 * S, After::Unknown);
    assert_eq!(keeper.confirmation(&key("a")), None);
}

/// A replica that takes the lead over goes on renewing every lease it kept
/// — one it was still renewing for a leader that never did (that leader was
/// cut off, or crashed) would otherwise run out before this replica's
/// reconcile reaches it — but no reconcile relies on what it confirmed
/// before, until Valkey confirms it again in the new term.
#[tokio::test]
async fn a_new_leader_keeps_renewing_the_leases_only_it_kept() {
    let store = Arc::new(LosesReplies::default());
    let (keeper, _) = keeping(store.clone(), 600 * MS).await;
    keeper.hand_over();
    keeper.take_over();
    assert_eq!(keeper.keys(), vec![nk("a")]);
    assert_eq!(
        keeper.confirmation(&key("a")),
        None,
        "confirmed in another term"
    );
    let task = tokio::spawn(keeper.clone().run());
    tokio::time::sleep(3 * S).await;
    assert!(live(&store).await, "kept alive for 5 durations");
    let c = keeper.confirmation(&key("a")).expect("confirmed afresh");
    assert!(c.at.elapsed() < 600 * MS);
    task.abort();
}

/// Whatever was started in a term that ended — a keeper renewal, a
/// reconcile pass — neither acts nor publishes after it: a handover decided
/// while another replica led does not drop a lease this replica now leads
/// for, a lease that ended then wakes nobody now, and a pass of the old
/// term confirms and publishes nothing.
#[test]
fn what_a_term_started_does_nothing_once_it_ended() {
    let keeper = Keeper::new(
        Arc::new(MemoryStore::default()),
        Arc::new(ServerClock::new()),
    );
    let (tx, mut rx) = futures::channel::mpsc::unbounded();
    keeper.wake_through(Some(tx));
    let t0 = Instant::now();
    keeper.confirmed(&key("a"), kept(9 * S, 3 * S, t0), keeper.term());
    keeper.hand_over();
    let (following, due) = keeper.take_due(t0 + 10 * S);
    assert_eq!(due.len(), 1);
    keeper.hand_over(); // every election round that sees the other leader
    assert_eq!(keeper.term(), following, "the same term");
    keeper.take_over();
    for after in [After::HandedOver, After::Ended] {
        keeper.settle(&nk("a"), &handle(7), following, t0 + 10 * S, after);
        assert_eq!(keeper.keys(), vec![nk("a")], "{after:?} from an ended term");
    }
    assert!(rx.try_recv().is_err(), "nobody woken");
    let (_, due) = keeper.take_due(t0 + 10 * S);
    assert_eq!(due.len(), 1, "due again, in the new term");

    // A pass that started before the takeover.
    let mut other = Kept::new(
        crate::store::Target::new("ns", "t"),
        handle(8),
        (9 * S, 3 * S),
        t0,
        (9_000, None),
    );
    other.published = true;
    keeper.confirmed(&key("b"), other.clone(), following);
    assert!(!keeper.keys().contains(&nk("b")), "confirms nothing");
    keeper.confirmed(&key("b"), kept(9 * S, 3 * S, t0), keeper.term());
    keeper.acknowledged(&key("b"), &status(1, Phase::Pending));
    keeper.may_publish(&key("b"), &status(7, Phase::Held), following);
    assert!(!keeper.lock()[&nk("b")].published, "publishes nothing");
}

/// A lease whose expiry reached its hard end (`maxLifetime`) shows the same
/// expiry whoever renews it: once capped, it is left to the new leader
/// (no renewal can extend it; that leader's reconcile replaces it).
#[test]
fn a_capped_lease_is_handed_over() {
    let mut k = kept(9 * S, 3 * S, Instant::now()); // expires_ms 1_000
    k.max_expires_ms = Some(1_000);
    let capped = |end: Option<u64>| {
        let mut r = found(7, 1_000, 500).unwrap();
        r.lease.as_mut().unwrap().max_expires_at_ms = end;
        Ok(r)
    };
    assert_eq!(still_ours(&k, capped(Some(1_000))), Err(After::HandedOver));
    assert_eq!(
        still_ours(&k, capped(Some(5_000))),
        Ok(()),
        "not capped yet"
    );
}

/// A keeper renewal sent while leading and answered after this replica first
/// sees another leader: its answer publishes nothing, but the expiry it set
/// is this replica's own, never taken for the new leader's renewal — the
/// keeper goes on renewing until Valkey shows someone else did.
#[tokio::test]
async fn a_renewal_answered_after_the_term_ended_is_not_taken_for_the_new_leaders() {
    let store = Arc::new(LosesReplies::default());
    let (keeper, h) = keeping(store.clone(), 600 * MS).await;
    let (term, due) = keeper.take_due(Instant::now() + 10 * S);
    assert_eq!(due.len(), 1);
    // The renewal takes effect in Valkey...
    let req = RenewRequest::new(crate::store::Target::new("ns", "t"), h.clone(), 600 * MS)
        .extending_only();
    tokio::time::sleep(50 * MS).await;
    let after = after_renew(&store.renew(&req).await);
    // ...but another leader is seen before its answer is settled.
    keeper.hand_over();
    keeper.settle(&nk("a"), &h, term, Instant::now(), after);
    // Nobody else renews; the keeper runs on past the lease's duration.
    let task = tokio::spawn(keeper.clone().run());
    tokio::time::sleep(2 * S).await;
    let kept = keeper.keys();
    let alive = live(&store).await;
    task.abort();
    assert_eq!(
        kept,
        vec![nk("a")],
        "the keeper let go of a lease nobody else renews"
    );
    assert!(alive, "the lease ran out in the store");
}
