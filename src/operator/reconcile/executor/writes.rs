//! The executor's write sequence, asserted against a mocked API server (the
//! controller-rs pattern: a `kube::Client` over an in-process service that
//! records every request and answers it). The store is the in-memory
//! reference store, the contract's reference; its writes join the sequence.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};

use crate::operator::crd::TargetLease;
use crate::operator::leadership::Leadership;
use crate::operator::reconcile::{Error, reconcile};

mod harness;
use harness::Harness;

fn open() -> Leadership {
    Leadership::always()
}

/// Acquire: the finalizer, then the store, then status, then the mark.
async fn acquired() -> Harness {
    let h = Harness::new(open());
    let (result, writes) = h.reconcile().await;
    result.unwrap();
    assert_eq!(
        writes,
        [
            "PATCH tl finalizer add",
            "STORE acquire",
            "PATCH tl/status phase=Held token=1 pod=web-0",
            "PATCH pods/web-0 mark token=1",
            "POST events event Acquired",
        ],
        "acquire"
    );
    assert_eq!(h.token_in_store().await, Some(1));
    h
}

#[tokio::test]
async fn acquire_publishes_status_before_the_mark() {
    acquired().await;
}

/// A status write is conditional on the version the pass planned from: an
/// edit in between refuses it, no pod is marked after it, and the next pass
/// publishes the same lease (the acquire replays; no token is spent).
#[tokio::test]
async fn a_status_write_refused_as_stale_marks_no_pod_and_spends_no_token() {
    let h = Harness::new(open());
    h.store.edit_during_acquire.store(true, Ordering::SeqCst);
    let (result, writes) = h.reconcile().await;
    assert!(
        matches!(&result, Err(Error::Kube(kube::Error::Api(s))) if s.code == 409),
        "{result:?}"
    );
    assert_eq!(
        writes,
        [
            "PATCH tl finalizer add",
            "STORE acquire",
            "PATCH tl/status phase=Held token=1 pod=web-0",
        ],
        "refused"
    );
    assert_eq!(h.status("phase"), Value::Null);
    let (result, writes) = h.reconcile().await;
    result.unwrap();
    assert_eq!(
        writes,
        [
            "STORE acquire",
            "PATCH tl/status phase=Held token=1 pod=web-0",
            "PATCH pods/web-0 mark token=1",
            "POST events event Acquired",
        ],
        "planned again"
    );
    assert_eq!(h.token_in_store().await, Some(1));
}

/// The store is never called before the finalizer is in place: a finalizer
/// patch planned from a list someone else changed meanwhile is refused (its
/// `test` fails), nothing else is written, and the next pass adds it beside
/// theirs.
#[tokio::test]
async fn nothing_reaches_the_store_before_the_finalizer_is_in_place() {
    let h = Harness::new(open());
    let stale: TargetLease = serde_json::from_value(h.api.lock().unwrap().object.clone()).unwrap();
    h.edit(|o| o["metadata"]["finalizers"] = json!(["example.com/keep"]));
    let result = reconcile(Arc::new(stale), h.ctx.clone()).await;
    assert!(
        matches!(&result, Err(Error::Kube(kube::Error::Api(s))) if s.code == 422),
        "{:?}",
        result.map(|_| ())
    );
    let writes = std::mem::take(&mut h.api.lock().unwrap().writes);
    assert_eq!(writes, ["PATCH tl finalizer add"], "refused");
    assert_eq!(h.token_in_store().await, None);
    let (result, writes) = h.reconcile().await;
    result.unwrap();
    assert_eq!(writes[..2], ["PATCH tl finalizer add", "STORE acquire"]);
    assert_eq!(
        h.api.lock().unwrap().object["metadata"]["finalizers"],
        json!(["example.com/keep", "targetlease.dev/release"])
    );
}

#[tokio::test]
async fn a_spec_fixed_while_the_finalizer_is_added_is_the_one_planned_from() {
    let h = Harness::new(open());
    // The cache still shows generation 1, whose spec is invalid; the server
    // already has generation 2, which fixed it.
    let mut stale = h.api.lock().unwrap().object.clone();
    stale["spec"]["leaseDuration"] = "soon".into();
    h.edit(|o| o["metadata"]["generation"] = 2.into());
    let stale: TargetLease = serde_json::from_value(stale).unwrap();
    reconcile(Arc::new(stale), h.ctx.clone()).await.unwrap();
    let writes = std::mem::take(&mut h.api.lock().unwrap().writes);
    assert_eq!(writes[..2], ["PATCH tl finalizer add", "STORE acquire"]);
    assert_eq!(h.status("observedGeneration"), 2);
}

#[tokio::test]
async fn a_handoff_unmarks_and_withdraws_before_the_store_lets_go() {
    let h = acquired().await;
    h.edit(|o| o["spec"]["holder"] = json!({"identity": "web-1", "podName": "web-1"}));
    let (result, writes) = h.reconcile().await;
    result.unwrap();
    assert_eq!(
        writes,
        [
            // Withdrawn first (marks, then status), then released in the store.
            "PATCH pods/web-0 unmark",
            "PATCH tl/status phase=Pending token=1 pod=web-0 releasing",
            "STORE release",
            // The next attempt is recorded before the store sees it.
            "PATCH tl/status phase=Pending token=1 pod=null",
            "POST events event Released",
            "STORE acquire",
            "PATCH tl/status phase=Held token=2 pod=web-1",
            "PATCH pods/web-1 mark token=2",
            "POST events event Acquired",
        ],
        "handoff"
    );
    assert_eq!(h.token_in_store().await, Some(2));
}

#[tokio::test]
async fn a_release_withdraws_held_before_the_store_lets_go() {
    let h = acquired().await;
    h.edit(|o| o["spec"]["holder"] = json!({"identity": "web-0", "podName": "gone"}));
    let (result, writes) = h.reconcile().await;
    result.unwrap();
    assert_eq!(
        writes,
        [
            "PATCH pods/web-0 unmark",
            "PATCH tl/status phase=Pending token=1 pod=web-0 releasing",
            "STORE release",
            "PATCH tl/status phase=Pending token=1 pod=null",
            "POST events event Released",
        ],
        "release"
    );
    assert_eq!(h.token_in_store().await, None);
}

/// A held lease's pass asks for its next pass in `renewals`; any later
/// pass, whatever triggered it, takes that back when it starts, and asks
/// again only if it still has a lease to renew.
#[tokio::test]
async fn a_held_lease_asks_for_its_next_renewal_and_its_release_takes_that_back() {
    let h = acquired().await;
    assert_eq!(h.ctx.renewals.len(), 1, "the acquiring pass asks to renew");
    h.edit(|o| o["spec"]["holder"] = json!({"identity": "web-0", "podName": "gone"}));
    let (result, _) = h.reconcile().await;
    result.unwrap();
    assert!(h.ctx.renewals.is_empty(), "nothing is left to renew");
}

#[tokio::test]
async fn a_deletion_withdraws_held_then_raises_the_floor_then_releases_then_lets_go() {
    let h = acquired().await;
    h.edit(|o| o["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into());
    let (result, writes) = h.reconcile().await;
    result.unwrap();
    assert_eq!(
        writes,
        [
            "PATCH pods/web-0 unmark",
            "PATCH tl/status phase=Released token=1 pod=web-0 releasing",
            // The last published token is covered before anything is given back.
            "POST floors floor token=1",
            "STORE release",
            "POST events event Released",
            "PATCH tl finalizer remove",
        ],
        "delete"
    );
    assert_eq!(h.token_in_store().await, None);
}

/// Once the gate closes, nothing is written: not to the API server, not to
/// the store, and the pass ends as NotLeader (not as an API failure).
#[tokio::test]
async fn nothing_is_written_after_leadership_is_lost() {
    let gate = Leadership::elected();
    gate.lead_until(Instant::now() + std::time::Duration::from_secs(60));
    let h = Harness::new(gate.clone());
    let (result, _) = h.reconcile().await;
    result.unwrap();
    assert_eq!(h.status("fencingToken"), json!(1));
    h.edit(|o| o["spec"]["holder"] = json!({"identity": "web-1", "podName": "web-1"}));
    gate.step_down();
    // The pass starts before the gate closes in production; here it closed
    // in between: step into the pass past the entry check.
    let key = ObjectRef::new("tl").within("ns");
    h.ctx.remember(&key, |m| m.reread = true);
    let object = h.api.lock().unwrap().object.clone();
    let tl: TargetLease = serde_json::from_value(object).unwrap();
    let pass = super::super::pass::Pass::start(&h.ctx, &tl)
        .await
        .unwrap()
        .unwrap();
    let result = pass.converge().await;
    assert!(
        matches!(result, Err(Error::NotLeader(_))),
        "{:?}",
        result.map(|_| ())
    );
    assert_eq!(h.api.lock().unwrap().writes, Vec::<String>::new());
    assert_eq!(
        h.token_in_store().await,
        Some(1),
        "the store still holds it"
    );
    assert_eq!(h.status("fencingToken"), json!(1));
    assert_eq!(h.status("holderPod"), json!("web-0"));
}

/// Every due reconcile exists at once while it waits for a slot (thousands
/// after a mass creation or a restart), so the future waiting must be small:
/// the pass itself, which holds every write it may make, is boxed and only
/// allocated once a slot is taken. Unboxed it was about 10 KB: 20 MB of heap
/// with 2,000 new TargetLeases queued.
#[tokio::test]
async fn a_reconcile_waiting_for_its_slot_holds_little_memory() {
    let h = Harness::new(open());
    let object = h.api.lock().unwrap().object.clone();
    let tl: TargetLease = serde_json::from_value(object).unwrap();
    let waiting = reconcile(Arc::new(tl), h.ctx.clone());
    let size = std::mem::size_of_val(&waiting);
    assert!(
        size <= 1024,
        "a reconcile future is {size} bytes before it runs: box what runs after the slot"
    );
}
