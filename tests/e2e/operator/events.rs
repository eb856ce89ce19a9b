//! Events tell the truth: each grant of one TargetLease is its own Event,
//! naming its holder and token, even when two grants come seconds apart
//! (`kubectl describe tl` must never show `Acquired (x2) … token 1` while
//! another pod holds token 2).

use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;

use super::*;

async fn acquired_events(env: &OperatorEnv, lease: &str) -> Vec<Event> {
    let mut events = events_about(env, lease).await;
    events.retain(|e| e.reason.as_deref() == Some("Acquired"));
    events
}

#[tokio::test]
async fn two_grants_of_one_targetlease_are_two_events_with_their_tokens() {
    let env = OperatorEnv::start("events").await;
    env.create_pod("web-0", &[("app", "web"), WEB_LEADER_CANDIDATE], true)
        .await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // distinct creation times
    env.create_pod("web-1", &[("app", "web"), WEB_LEADER_CANDIDATE], true)
        .await;
    env.create("web-leader", lease_for("web-leader").elect("web"))
        .await;
    env.wait_for("web-leader", "led by web-0", SOON, |tl| {
        summary(tl) == (Some(Phase::Held), Some("web-0".into()), Some(1))
    })
    .await;
    env.set_ready("web-0", false).await;
    env.wait_for("web-leader", "led by web-1", SOON, |tl| {
        summary(tl) == (Some(Phase::Held), Some("web-1".into()), Some(2))
    })
    .await;

    let events = support::kube_env::eventually("two Acquired events", SOON, || async {
        let e = acquired_events(&env, "web-leader").await;
        (e.len() >= 2).then_some(e)
    })
    .await;
    let mut notes: Vec<String> = events.iter().filter_map(|e| e.note.clone()).collect();
    notes.sort();
    assert_eq!(
        notes,
        [
            "acquired by web-0 with fencing token 1",
            "acquired by web-1 with fencing token 2"
        ],
        "{events:#?}"
    );
    for e in &events {
        assert!(
            e.series.as_ref().is_none_or(|s| s.count <= 1),
            "a grant folded into another: {e:#?}"
        );
    }
}

/// The Events of `env`'s namespace about the object named `name`, by name.
async fn events_about(env: &OperatorEnv, name: &str) -> Vec<Event> {
    let events: kube::Api<Event> = kube::Api::namespaced(env.client.clone(), &env.ns);
    let mut found: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.name.as_deref() == Some(name))
        })
        .collect();
    found.sort_by_key(|e| e.metadata.name.clone());
    found
}

#[tokio::test]
async fn the_same_event_again_folds_into_its_series_and_a_deleted_one_starts_anew() {
    use targetlease::operator::events::{Event as Note, Recorder};
    let env = OperatorEnv::start_without_operator("event-series").await;
    let recorder = Recorder::new(env.client.clone(), "series-test", Some("test-0"));
    let about = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("targetlease.dev/v1alpha1".into()),
        kind: Some("TargetLease".into()),
        namespace: Some(env.ns.clone()),
        name: Some("db".into()),
        uid: Some("uid-of-db".into()),
        ..Default::default()
    };
    let said = |action: &str| Note {
        warning: true,
        reason: "BackendUnavailable",
        action: action.into(),
        note: format!("valkey did not answer ({action})"),
    };
    for _ in 0..3 {
        recorder.publish(said("a"), &about).await.unwrap();
    }
    recorder.publish(said("b"), &about).await.unwrap();
    // The same object under a later resourceVersion: still the same Event.
    let later = k8s_openapi::api::core::v1::ObjectReference {
        resource_version: Some("999".into()),
        ..about.clone()
    };
    recorder.publish(said("b"), &later).await.unwrap();

    let events = events_about(&env, "db").await;
    assert_eq!(events.len(), 2, "{events:#?}");
    let by_action = |a: &str| {
        events
            .iter()
            .find(|e| e.action.as_deref() == Some(a))
            .unwrap_or_else(|| panic!("no Event with action {a}: {events:#?}"))
            .clone()
    };
    let a = by_action("a");
    assert_eq!(a.series.as_ref().map(|s| s.count), Some(3), "{a:#?}");
    assert_eq!(a.note.as_deref(), Some("valkey did not answer (a)"));
    assert_eq!(a.type_.as_deref(), Some("Warning"));
    assert_eq!(a.reason.as_deref(), Some("BackendUnavailable"));
    assert_eq!(a.reporting_controller.as_deref(), Some("series-test"));
    assert_eq!(a.reporting_instance.as_deref(), Some("test-0"));
    assert_eq!(by_action("b").series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(recorder.remembered(), 2);

    // Deleted on the API server (by someone, or its own expiry): the next
    // one is a new Event, not an error.
    let api: kube::Api<Event> = kube::Api::namespaced(env.client.clone(), &env.ns);
    api.delete(a.metadata.name.as_deref().unwrap(), &Default::default())
        .await
        .unwrap();
    recorder.publish(said("a"), &about).await.unwrap();
    let events = events_about(&env, "db").await;
    let again: Vec<&Event> = events
        .iter()
        .filter(|e| e.action.as_deref() == Some("a"))
        .collect();
    assert_eq!(again.len(), 1, "{events:#?}");
    assert_ne!(again[0].metadata.name, a.metadata.name);
    assert!(again[0].series.is_none(), "{again:#?}");
}
