//! Events tell the truth: each grant of one TargetLease is its own Event,
//! naming its holder and token, even when two grants come seconds apart
//! (`kubectl describe tl` must never show `Acquired (x2) … token 1` while
//! another pod holds token 2).

use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;

use super::*;

async fn acquired_events(env: &OperatorEnv, lease: &str) -> Vec<Event> {
    let events: kube::Api<Event> = kube::Api::namespaced(env.client.clone(), &env.ns);
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Acquired"))
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.name.as_deref() == Some(lease))
        })
        .collect()
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
