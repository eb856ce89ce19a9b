//! Pods opt in to marks: a TargetLease can elect or name only pods that
//! carry its label `<name>.targetlease.dev/candidate: "true"`.

use super::*;
use support::timeline::Timeline;

/// Every label and annotation of the targetlease.dev family on pod `name`.
async fn our_keys(env: &OperatorEnv, name: &str) -> Vec<String> {
    use kube::ResourceExt;
    let pod = env.pods().get(name).await.expect("read pod");
    pod.labels()
        .keys()
        .chain(pod.annotations().keys())
        .filter(|k| k.contains(".targetlease.dev/") && !k.ends_with("/candidate"))
        .cloned()
        .collect()
}

/// The reasons of the Warning Events about TargetLease `lease`, one per
/// time it was published (an Event repeated by its series counts again).
async fn warning_reasons(env: &OperatorEnv, lease: &str) -> Vec<String> {
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(env.client.clone(), &env.ns);
    let list = events.list(&Default::default()).await.expect("list events");
    list.items
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.name.as_deref() == Some(lease))
        })
        .flat_map(|e| {
            let times = e.series.as_ref().map_or(1, |s| s.count.max(1)) as usize;
            std::iter::repeat_n(e.reason.unwrap_or_default(), times)
        })
        .collect()
}

/// A pod that did not opt in is never marked: not when a TargetLease names it
/// in `holder.podName`, not when it is the oldest Ready pod an election's
/// selector matches, not when it is the only one. Each such lease waits as
/// Pending with the reason PodNotOptedIn and one Warning Event, while an
/// opted-in pod next to it is elected. Once the pod opts in it is marked (so
/// the watch would have seen marks), and marks never arrive on a pod version
/// without the opt-in label (every revision is replayed).
#[tokio::test]
async fn a_pod_that_did_not_opt_in_is_never_marked() {
    let env = OperatorEnv::start("opt-in").await;
    let timeline = Timeline::record(&env.client, &env.ns);
    // The oldest pod of the app has not opted in to anything.
    env.create_pod("bystander", &[("app", "web"), ("role", "db")], true)
        .await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // distinct creation times
    env.create_pod("web-1", &[("app", "web"), WEB_LEADER_CANDIDATE], true)
        .await;
    let short = |spec: support::spec::Spec| spec.durations("3s", "1s");
    env.create("web-leader", short(lease_for("web-leader").elect("web")))
        .await;
    env.create(
        "grab",
        short(lease_for("t").identity("bystander").pod("bystander")),
    )
    .await;
    // An election whose selector matches the bystander alone.
    let role_db = json!({ "podSelector": { "matchLabels": { "role": "db" } } });
    env.create(
        "only-db",
        short(lease_for("only-db").set("candidates", role_db)),
    )
    .await;

    env.wait_led_by("web-leader", "web-1", 1, SOON).await;
    for lease in ["grab", "only-db"] {
        let waiting = env.wait_reason(lease, "PodNotOptedIn", SOON).await;
        assert_eq!(summary(&waiting).0, Some(Phase::Pending), "{lease}");
        let held = condition(&waiting, "Held").unwrap();
        assert!(
            held.message
                .contains(&format!("{lease}.targetlease.dev/candidate: \"true\"")),
            "the condition names the label to add: {}",
            held.message
        );
        support::kube_env::eventually(
            &format!("a PodNotOptedIn Warning on {lease}"),
            SOON,
            || async {
                warning_reasons(&env, lease)
                    .await
                    .contains(&"PodNotOptedIn".to_string())
                    .then_some(())
            },
        )
        .await;
    }
    // A few renewals of the leases around it: still nothing on the bystander.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(our_keys(&env, "bystander").await, Vec::<String>::new());
    assert_eq!(
        warning_reasons(&env, "grab")
            .await
            .iter()
            .filter(|r| *r == "PodNotOptedIn")
            .count(),
        1,
        "one Warning, not one per pass"
    );

    // The bystander opts in to "grab" only: it is marked for grab, and still
    // never for only-db, whose selector matches it too.
    env.pods()
        .patch(
            "bystander",
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "metadata": { "labels": { "grab.targetlease.dev/candidate": "true" } } }),
            ),
        )
        .await
        .unwrap();
    env.wait_led_by("grab", "bystander", 1, SOON).await;
    env.wait_reason("only-db", "PodNotOptedIn", SOON).await;
    let mut keys = our_keys(&env, "bystander").await;
    keys.sort();
    assert_eq!(
        keys,
        [
            "grab.targetlease.dev/expires-at",
            "grab.targetlease.dev/fencing-token",
            "grab.targetlease.dev/leader"
        ]
    );

    // It withdraws its opt-in: the lease lets go, its marks go.
    env.pods()
        .patch(
            "bystander",
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "metadata": { "labels": { "grab.targetlease.dev/candidate": null } } }),
            ),
        )
        .await
        .unwrap();
    env.wait_reason("grab", "PodNotOptedIn", SOON).await;
    support::kube_env::eventually("the bystander unmarked", SOON, || async {
        our_keys(&env, "bystander").await.is_empty().then_some(())
    })
    .await;
    let v = timeline.violations();
    assert!(v.is_empty(), "{v:#?}");
}

/// The opt-in is checked again when the marks are written, not only when
/// the pod is chosen: a pod whose opt-in label was removed between the
/// choice and the write gets no marks, even while the operator's cache still
/// shows the label (the write carries the pod version it decided from, and
/// the API server refuses it for a newer one). A pod that still opted in, at
/// the version the cache shows, is marked.
#[tokio::test]
async fn a_pod_that_opted_out_before_the_write_gets_no_marks() {
    use targetlease::operator::reconcile::marks::{self, Mark};
    use targetlease::operator::reconcile::pods::CachedPod;
    let env = OperatorEnv::start_without_operator("opt-out").await;
    env.create_pod("web-0", &[("app", "web"), WEB_LEADER_CANDIDATE], true)
        .await;
    let cached_api: kube::Api<CachedPod> = kube::Api::namespaced(env.client.clone(), &env.ns);
    let read = || async { cached_api.get("web-0").await.expect("read pod") };
    let chosen = read().await;
    let mark = Mark {
        pod: "web-0".into(),
        uid: chosen.metadata.uid.clone(),
        token: 7,
        expires_at: "2030-01-01T00:00:00Z".into(),
    };
    // The pod opts out after it was chosen; the cache has not seen it yet.
    env.pods()
        .patch(
            "web-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {WEB_LEADER_CANDIDATE.0: null}}})),
        )
        .await
        .expect("remove the opt-in label");
    let marked = marks::mark(&env.client, &env.ns, "web-leader", &mark, &chosen)
        .await
        .expect("mark");
    assert!(!marked, "a stale opted-in version was written to");
    assert_eq!(our_keys(&env, "web-0").await, Vec::<String>::new());
    // The cache catches up: the pod no longer opted in, nothing is sent.
    let now = read().await;
    let marked = marks::mark(&env.client, &env.ns, "web-leader", &mark, &now)
        .await
        .expect("mark");
    assert!(!marked);
    assert_eq!(our_keys(&env, "web-0").await, Vec::<String>::new());

    // Opted in again, at the version the cache shows: marked.
    env.pods()
        .patch(
            "web-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {WEB_LEADER_CANDIDATE.0: "true"}}})),
        )
        .await
        .expect("add the opt-in label");
    let again = read().await;
    let marked = marks::mark(&env.client, &env.ns, "web-leader", &mark, &again)
        .await
        .expect("mark");
    assert!(marked);
    let mut keys = our_keys(&env, "web-0").await;
    keys.sort();
    assert_eq!(
        keys,
        [
            "web-leader.targetlease.dev/expires-at",
            "web-leader.targetlease.dev/fencing-token",
            "web-leader.targetlease.dev/leader"
        ]
    );
}
