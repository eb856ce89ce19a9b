use super::*;
use crate::store::Target;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// An acquire or release still waiting when the gate closes is dropped
/// there (never sent later), and reported as of unknown outcome.
#[tokio::test]
async fn a_gated_call_ends_when_the_gate_closes() {
    let gate = Leadership::elected();
    let never = async { Ok(unreachable_reply()) };
    assert_eq!(
        gated(&gate, never).await.err(),
        Some(NotLeader),
        "closed: not even started"
    );

    gate.lead_until(Instant::now() + Duration::from_millis(200));
    let sent = Arc::new(AtomicBool::new(false));
    let flag = sent.clone();
    let slow = async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        flag.store(true, Ordering::SeqCst);
        Ok(unreachable_reply())
    };
    let started = Instant::now();
    let reply = gated(&gate, slow).await.unwrap();
    assert!(
        matches!(reply, Err(StoreError::OutcomeUnknown(_))),
        "{reply:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!sent.load(Ordering::SeqCst), "dropped, not left running");

    let always = Leadership::always();
    let quick = async { Ok(unreachable_reply()) };
    assert!(gated(&always, quick).await.unwrap().is_ok());
}

fn unreachable_reply() -> Reply {
    Reply {
        outcome: crate::store::Outcome::Released,
        lease: None,
        server_time_ms: 0,
        message: String::new(),
    }
}

/// A reconcile's renewal is plain only while this replica leads (a shorter
/// `leaseDuration` takes effect); a pass still running after its replica
/// stepped down renews extend-only, like the keeper, and never cuts short
/// a lease the new leader renewed for longer.
#[tokio::test]
async fn a_renewal_after_stepping_down_never_shortens_the_lease() {
    use crate::store::memory::MemoryStore;
    use crate::store::{AcquireRequest, LeaseStore};
    let store = MemoryStore::default();
    let target = Target::new("ns", "t");
    let long = Duration::from_secs(60);
    let lease = store
        .acquire(&AcquireRequest::new(target.clone(), "job", long))
        .await
        .unwrap()
        .lease
        .unwrap();
    let handle = lease.handle().unwrap();
    // Each a request of its own (one request id would replay the first).
    let short = || RenewRequest::new(target.clone(), handle.clone(), Duration::from_secs(5));
    let expiry = |r: Result<Reply, StoreError>| r.unwrap().lease.unwrap().expires_at_ms;

    let stepped_down = Leadership::elected();
    let after = expiry(renew_as(&stepped_down, &store, short()).await);
    assert!(
        after >= lease.expires_at_ms,
        "shortened from {} to {after} after stepping down",
        lease.expires_at_ms
    );
    let leading = Leadership::elected();
    leading.lead_until(Instant::now() + Duration::from_secs(60));
    let after = expiry(renew_as(&leading, &store, short()).await);
    assert!(after < lease.expires_at_ms, "the leader's renewal is plain");
}
