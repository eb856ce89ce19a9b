//! The operator's published promises under the conditions production brings:
//! spec edits, restarts with many pods, stale marks, overlapping elections,
//! stranded waiters, outages during deletes, crashes between a store call and
//! a status write, recreated pods and max lifetimes. Each test reproduces a
//! defect found in review (issue 10) on a real kube-apiserver and a real Valkey.

mod support {
    pub mod kube_env;
    pub mod operator_env;
    pub mod resp;
    pub mod valkey_server;
}

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use support::kube_env::eventually;
use support::operator_env::{History, OperatorEnv, summary};
use targetlease::crd::{Phase, TargetLease};
use targetlease::store::{AcquireRequest, LeaseStore, Outcome, Target};

const SOON: Duration = Duration::from_secs(20);

fn ms(t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Option<u64> {
    t.as_ref().map(|t| t.0.as_millisecond() as u64)
}

fn reason(tl: &TargetLease) -> Option<String> {
    tl.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Held")
        .map(|c| c.reason.clone())
}

/// Defect 1: a shorter leaseDuration moves Valkey's expiry earlier; status
/// and the pod annotation must follow at once, and `observedGeneration` must
/// not claim the edit before the lease carries it.
#[tokio::test]
async fn a_shorter_lease_duration_is_published_before_the_pass_ends() {
    let env = OperatorEnv::start("shrink").await;
    env.create_pod("web-0", &[("app", "shrink")], true).await;
    env.create(
        "web",
        json!({ "target": "t", "candidates": { "podSelector": { "matchLabels": { "app": "shrink" } } },
                "leaseDuration": "60s", "renewInterval": "5s" }),
    )
    .await;
    env.wait_phase("web", Phase::Held, SOON).await;
    let store = env.store().await;
    let target = Target::new(&env.ns, "t");
    env.api()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "leaseDuration": "6s", "renewInterval": "2s" } })),
        )
        .await
        .unwrap();
    let applied = env
        .wait_for("web", "observedGeneration 2", SOON, |tl| {
            tl.status.as_ref().and_then(|s| s.observed_generation) == Some(2)
        })
        .await;
    // From the moment the edit is reported applied, and across several renewals,
    // nothing published is later than Valkey's expiry.
    for _ in 0..20 {
        let tl = env.api().get("web").await.unwrap();
        let published = ms(&tl.status.unwrap().expires_at).expect("expiresAt while Held");
        let annotated = env
            .marks("web-0", "web")
            .await
            .2
            .expect("expires-at annotation");
        let annotated = annotated
            .parse::<k8s_openapi::jiff::Timestamp>()
            .unwrap()
            .as_millisecond() as u64;
        let valkey = store
            .get(&target)
            .await
            .unwrap()
            .lease
            .unwrap()
            .expires_at_ms;
        assert!(published <= valkey, "status {published} > valkey {valkey}");
        assert!(
            annotated <= valkey,
            "annotation {annotated} > valkey {valkey}"
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert!(ms(&applied.status.unwrap().expires_at).unwrap() < now_ms() + 7_000);
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Defect 2: a restarted operator must not plan from a pod cache that has not
/// synced: with many unrelated pods, pod-tied leases and elections are
/// re-adopted with no new token and no mark flap.
#[tokio::test]
async fn a_restart_among_many_pods_keeps_every_lease_and_leader() {
    let mut env = OperatorEnv::start("many-pods").await;
    let pods = env.pods();
    futures::stream::iter(0..1500)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
                    "metadata": { "name": format!("noise-{i}"), "labels": { "app": "noise" } },
                    "spec": { "containers": [{ "name": "c", "image": "registry.example/noise:1" }] },
                }))
                .unwrap();
                pods.create(&Default::default(), &pod).await.expect("noise pod");
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    env.create_pod("worker", &[("app", "worker")], true).await;
    env.create_pod("web-0", &[("app", "web")], true).await;
    env.create_pod("web-1", &[("app", "web")], true).await;
    env.create(
        "tied",
        json!({ "target": "tied", "holder": { "identity": "worker", "podName": "worker" } }),
    )
    .await;
    env.create(
        "elect",
        json!({ "target": "elect", "candidates": { "podSelector": { "matchLabels": { "app": "web" } } } }),
    )
    .await;
    let tied = env.wait_phase("tied", Phase::Held, SOON).await;
    let elect = env.wait_phase("elect", Phase::Held, SOON).await;
    let leader = summary(&elect).1.unwrap();
    eventually("leader marked", SOON, || async {
        env.marks(&leader, "elect").await.0.map(|_| ())
    })
    .await;

    let history = History::record(&env);
    let mut flaps = Vec::new();
    env.kill_operator(0);
    env.start_operator();
    // Watch the leader's label for a while: it must never go away.
    for _ in 0..40 {
        if env.marks(&leader, "elect").await.0.is_none() {
            flaps.push("leader label removed");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(flaps.is_empty(), "{flaps:?}\n{}", env.operator_log(1));
    for (name, before) in [("tied", &tied), ("elect", &elect)] {
        let after = env.api().get(name).await.unwrap();
        assert_eq!(summary(&after), summary(before), "{name} re-adopted as is");
        for version in history.of(name) {
            assert_eq!(
                summary(&version),
                summary(before),
                "{name} never left Held:\n{}",
                env.operator_log(1)
            );
        }
    }
}

/// Defect 3 (mechanism): status writes carry the resourceVersion they were
/// planned from; the real API server refuses an older one.
#[tokio::test]
async fn status_writes_from_an_older_version_are_refused() {
    let env = OperatorEnv::start_without_operator("stale").await;
    let created = env
        .create(
            "job",
            json!({ "target": "t", "holder": { "identity": "job" } }),
        )
        .await;
    let old = created.resource_version();
    env.api()
        .patch(
            "job",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "touched": "yes" } } })),
        )
        .await
        .unwrap();
    let patch = json!({
        "apiVersion": "targetlease.dev/v1alpha1", "kind": "TargetLease",
        "metadata": { "resourceVersion": old },
        "status": { "phase": "Pending", "fencingToken": 5 },
    });
    let err = env
        .api()
        .patch_status(
            "job",
            &PatchParams::apply("targetlease-operator").force(),
            &Patch::Apply(&patch),
        )
        .await
        .expect_err("an apply from an older version must conflict");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409),
        "{err}"
    );
}

/// Defect 3 (behaviour): many handoffs with readiness flips, wake-ups and
/// Valkey losing everything: the published token never goes down and at most
/// one pod is ever published as leader.
#[tokio::test]
async fn published_tokens_never_go_down_through_rapid_handoffs() {
    let env = OperatorEnv::start("churn").await;
    for name in ["w-0", "w-1", "w-2"] {
        env.create_pod(name, &[("app", "churn")], true).await;
    }
    let history = History::record(&env);
    env.create(
        "churn",
        json!({ "target": "t", "candidates": { "podSelector": { "matchLabels": { "app": "churn" } } },
                "leaseDuration": "4s", "renewInterval": "1s" }),
    )
    .await;
    env.wait_phase("churn", Phase::Held, SOON).await;
    for round in 0..12 {
        let tl = env.api().get("churn").await.unwrap();
        if let Some(leader) = summary(&tl).1 {
            env.set_ready(&leader, false).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            env.set_ready(&leader, true).await;
        }
        if round % 4 == 3 {
            env.valkey.conn().cmd(&["FLUSHALL"]);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    env.wait_phase("churn", Phase::Held, SOON).await;
    let versions = history.of("churn");
    assert!(versions.len() > 10, "the watch saw the handoffs");
    let mut highest = 0;
    for v in &versions {
        let token = summary(v).2.unwrap_or(0);
        assert!(token >= highest, "token went from {highest} to {token}");
        highest = token;
    }
    let mut marked = Vec::new();
    for p in ["w-0", "w-1", "w-2"] {
        marked.push(env.marks(p, "churn").await.0.is_some());
    }
    assert!(marked.iter().filter(|m| **m).count() <= 1, "{marked:?}");
}

/// Defect 4: marks follow status — a pod carrying marks status does not name
/// is unmarked, corrupt state unmarks, deletion unmarks.
#[tokio::test]
async fn pod_marks_always_match_status() {
    let env = OperatorEnv::start("marks").await;
    env.create_pod("m-0", &[("app", "marks")], true).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    env.create_pod("m-1", &[("app", "marks")], true).await;
    env.create(
        "el",
        json!({ "target": "t", "candidates": { "podSelector": { "matchLabels": { "app": "marks" } } },
                "leaseDuration": "6s", "renewInterval": "1s" }),
    )
    .await;
    env.wait_for("el", "led by m-0", SOON, |tl| {
        summary(tl).0 == Some(Phase::Held) && summary(tl).1.as_deref() == Some("m-0")
    })
    .await;
    eventually("m-0 marked", SOON, || async {
        env.marks("m-0", "el").await.0.map(|_| ())
    })
    .await;

    // Marks left on another pod (a crash between writes, an old operator) go away.
    env.pods()
        .patch(
            "m-1",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": {
                "labels": { "el.targetlease.dev/leader": "true" },
                "annotations": { "el.targetlease.dev/fencing-token": "1" } } })),
        )
        .await
        .unwrap();
    eventually("stray marks removed", SOON, || async {
        (env.marks("m-1", "el").await == (None, None, None)).then_some(())
    })
    .await;
    assert_eq!(env.marks("m-0", "el").await.0.as_deref(), Some("true"));

    // Corrupt state in Valkey: Error, and the leader is unmarked.
    let key = format!("targetlease:{{{}:t}}:lease", env.ns);
    env.valkey.conn().cmd(&["SET", &key, "garbage"]);
    env.wait_phase("el", Phase::Error, SOON).await;
    eventually("unmarked on Error", SOON, || async {
        (env.marks("m-0", "el").await == (None, None, None)).then_some(())
    })
    .await;
    // Repaired the documented way: a revoke wakes the lease through pub/sub.
    let mut repair = targetlease::store::RevokeRequest::new(Target::new(&env.ns, "t"));
    repair.reason = Some("repair".into());
    let revoked = env.store().await.revoke(&repair).await.unwrap();
    assert_eq!(revoked.outcome, Outcome::Revoked);
    env.wait_phase("el", Phase::Held, SOON).await;
    let tl = env.api().get("el").await.unwrap();
    let leader = summary(&tl).1.unwrap();
    eventually("re-marked", SOON, || async {
        env.marks(&leader, "el").await.0.map(|_| ())
    })
    .await;

    env.delete("el").await;
    env.wait_gone("el", SOON).await;
    for pod in ["m-0", "m-1"] {
        assert_eq!(env.marks(pod, "el").await, (None, None, None), "{pod}");
    }
}

/// Defect 5: two elections over the same pods each mark their own leader
/// under their own keys, and the overlap is flagged.
#[tokio::test]
async fn overlapping_elections_never_share_a_leader_label() {
    let env = OperatorEnv::start("overlap").await;
    env.create_pod("o-0", &[("app", "shared")], true).await;
    env.create_pod("o-1", &[("app", "shared")], true).await;
    for name in ["alpha", "beta"] {
        env.create(
            name,
            json!({ "target": name, "candidates": { "podSelector": { "matchLabels": { "app": "shared" } } } }),
        )
        .await;
    }
    env.wait_phase("alpha", Phase::Held, SOON).await;
    env.wait_phase("beta", Phase::Held, SOON).await;
    for name in ["alpha", "beta"] {
        let selector = format!("app=shared,{name}.targetlease.dev/leader=true");
        let leaders = eventually(&format!("{name}'s leader marked"), SOON, || async {
            let list = env
                .pods()
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?;
            (!list.items.is_empty()).then_some(list.items)
        })
        .await;
        assert_eq!(leaders.len(), 1, "the Service of {name} routes to one pod");
        let holder = summary(&env.api().get(name).await.unwrap()).1;
        assert_eq!(Some(leaders[0].name_any()), holder);
    }
    let events = eventually("an OverlappingCandidates event", SOON, || async {
        let events: kube::Api<k8s_openapi::api::events::v1::Event> =
            kube::Api::namespaced(env.client.clone(), &env.ns);
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("OverlappingCandidates"))
    })
    .await;
    assert!(events.note.unwrap_or_default().contains("also a candidate"));
}

/// Defect 6: the head of a queue leaves it (its pod goes NotReady); the next
/// waiter takes the target once the outside holder's lease expires.
#[tokio::test]
async fn a_waiter_is_not_stranded_when_the_head_of_the_queue_leaves() {
    let env = OperatorEnv::start("stranded").await;
    let store = env.store().await;
    let outside = store
        .acquire(&AcquireRequest::new(
            Target::new(&env.ns, "q"),
            "cron",
            Duration::from_secs(15),
        ))
        .await
        .unwrap();
    assert_eq!(outside.outcome, Outcome::Acquired);
    env.create_pod("q1-pod", &[("app", "q1")], true).await;
    env.create(
        "q1",
        json!({ "target": "q", "holder": { "identity": "q1", "podName": "q1-pod" } }),
    )
    .await;
    env.wait_reason("q1", "TargetHeld", SOON).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    env.create(
        "q2",
        json!({ "target": "q", "holder": { "identity": "q2" } }),
    )
    .await;
    env.wait_reason("q2", "Queued", SOON).await;
    env.set_ready("q1-pod", false).await;
    env.wait_reason("q1", "PodNotReady", SOON).await;
    // The outside lease ends within 15s of its acquisition; q2 is next.
    let held = env
        .wait_phase("q2", Phase::Held, Duration::from_secs(25))
        .await;
    assert_eq!(summary(&held).2, Some(2));
}

/// Defect 7: deleting a TargetLease while Valkey is down keeps the finalizer
/// until the release is confirmed, never shows Held past the published
/// expiry, and raises the token floor first: a token is never reused.
#[tokio::test]
async fn a_delete_during_an_outage_keeps_the_finalizer_and_the_floor() {
    let mut env = OperatorEnv::start("outage-delete").await;
    env.create(
        "job",
        json!({ "target": "t", "holder": { "identity": "job" }, "leaseDuration": "6s", "renewInterval": "1s" }),
    )
    .await;
    let held = env.wait_phase("job", Phase::Held, SOON).await;
    assert_eq!(summary(&held).2, Some(1));
    env.valkey.kill();
    env.delete("job").await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let stuck = env
        .api()
        .get_opt("job")
        .await
        .unwrap()
        .expect("kept by its finalizer");
    let st = stuck.status.clone().unwrap();
    assert_ne!(st.phase, Some(Phase::Held), "{st:?}");
    let held_cond = st.conditions.iter().find(|c| c.type_ == "Held").unwrap();
    assert_ne!(held_cond.status, "True");
    let floors = env.client.clone();
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(floors, &env.ns);
    let list = cms
        .list(&ListParams::default().labels("targetlease.dev/token-floors"))
        .await
        .unwrap();
    assert!(
        list.items.iter().any(|cm| cm
            .data
            .clone()
            .unwrap_or_default()
            .values()
            .any(|v| v == "1")),
        "the floor holds token 1 before the release"
    );

    env.valkey.restart(); // empty: no persistence
    env.wait_gone("job", Duration::from_secs(40)).await;
    env.create(
        "next",
        json!({ "target": "t", "holder": { "identity": "next" } }),
    )
    .await;
    let next = env.wait_phase("next", Phase::Held, SOON).await;
    assert_eq!(summary(&next).2, Some(2), "never token 1 again");
}

/// Defect 8: a lease the operator acquired for this resource but never
/// published (a crash before the status write) does not block the target.
#[tokio::test]
async fn an_unpublished_acquisition_of_our_own_is_reclaimed_at_once() {
    let env = OperatorEnv::start("orphan").await;
    let store = env.store().await;
    let key = env.lease_id_key();
    let mut req = AcquireRequest::new(Target::new(&env.ns, "t"), "job", Duration::from_secs(90));
    req.lease_id = Some(key.derive("attempt-before-the-crash"));
    let mut meta = serde_json::Map::new();
    meta.insert("targetlease".into(), format!("{}/job", env.ns).into());
    meta.insert("acquisition".into(), "attempt-before-the-crash".into());
    req.metadata = Some(meta);
    assert_eq!(
        store.acquire(&req).await.unwrap().outcome,
        Outcome::Acquired
    );

    env.create(
        "job",
        json!({ "target": "t", "holder": { "identity": "job" } }),
    )
    .await;
    let tl = env
        .wait_phase("job", Phase::Held, Duration::from_secs(10))
        .await;
    assert_eq!(summary(&tl).2, Some(2));

    // Someone else's lease is left alone.
    let other = store
        .acquire(&AcquireRequest::new(
            Target::new(&env.ns, "u"),
            "cron",
            Duration::from_secs(90),
        ))
        .await
        .unwrap();
    assert_eq!(other.outcome, Outcome::Acquired);
    env.create(
        "waits",
        json!({ "target": "u", "holder": { "identity": "waits" } }),
    )
    .await;
    env.wait_reason("waits", "TargetHeld", SOON).await;
    let still = store.get(&Target::new(&env.ns, "u")).await.unwrap();
    assert_eq!(still.lease.unwrap().owner, "cron");
}

/// Defect 10: a pod recreated under the same name is a new holder.
#[tokio::test]
async fn a_recreated_pod_gets_a_new_lease() {
    let mut env = OperatorEnv::start("recreated").await;
    env.create_pod("worker", &[("app", "worker")], true).await;
    env.create(
        "tied",
        json!({ "target": "t", "holder": { "identity": "worker", "podName": "worker" } }),
    )
    .await;
    let held = env.wait_phase("tied", Phase::Held, SOON).await;
    assert_eq!(summary(&held).2, Some(1));
    let uid = held.status.unwrap().holder_pod_uid.expect("holderPodUID");
    // The operator is down while the pod is replaced (a StatefulSet would do this).
    env.kill_operator(0);
    env.delete_pod("worker").await;
    env.create_pod("worker", &[("app", "worker")], true).await;
    env.start_operator();
    let again = env
        .wait_for("tied", "held for the new pod", SOON, |tl| {
            tl.status.as_ref().is_some_and(|s| {
                s.phase == Some(Phase::Held) && s.holder_pod_uid.as_deref() != Some(uid.as_str())
            })
        })
        .await;
    assert_eq!(summary(&again).2, Some(2), "a larger token for the new pod");
}

/// Defect 11: floors are sharded, legacy floors migrate, covered entries are pruned.
#[tokio::test]
async fn token_floors_are_sharded_migrated_and_pruned() {
    let mut env = OperatorEnv::start_without_operator("floors").await;
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(env.client.clone(), &env.ns);
    // Floors an earlier version kept in one ConfigMap.
    let mut data = serde_json::Map::new();
    data.insert(targetlease::floor::floor_key(&env.ns, "old"), "41".into());
    let legacy: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "targetlease-token-floors" },
        "data": data,
    }))
    .unwrap();
    cms.create(&Default::default(), &legacy).await.unwrap();
    env.start_operator();
    env.create(
        "old",
        json!({ "target": "old", "holder": { "identity": "old" } }),
    )
    .await;
    let tl = env.wait_phase("old", Phase::Held, SOON).await;
    assert_eq!(summary(&tl).2, Some(42), "above the migrated floor");
    eventually("the legacy ConfigMap migrated away", SOON, || async {
        cms.get_opt("targetlease-token-floors")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;

    // Two targets in the same bucket: deleting one prunes the other's entry
    // once a live TargetLease's status covers it.
    let bucket = |t: &str| targetlease::floor::floor_key(&env.ns, t)[2..4].to_string();
    let mut i = 0;
    let partner = loop {
        let t = format!("p-{i}");
        if u8::from_str_radix(&bucket(&t), 16).unwrap() % 64
            == u8::from_str_radix(&bucket("old"), 16).unwrap() % 64
        {
            break t;
        }
        i += 1;
    };
    env.delete("old").await;
    env.wait_gone("old", SOON).await;
    let entry = targetlease::floor::floor_key(&env.ns, "old");
    let floors = || async {
        cms.list(&ListParams::default().labels("targetlease.dev/token-floors"))
            .await
            .unwrap()
            .items
    };
    assert!(
        floors()
            .await
            .iter()
            .any(|cm| cm.data.as_ref().unwrap().get(&entry).map(String::as_str) == Some("42"))
    );
    env.create(
        "old-again",
        json!({ "target": "old", "holder": { "identity": "again" } }),
    )
    .await;
    let again = env.wait_phase("old-again", Phase::Held, SOON).await;
    assert_eq!(summary(&again).2, Some(43));
    env.create(
        "p",
        json!({ "target": partner, "holder": { "identity": "p" } }),
    )
    .await;
    env.wait_phase("p", Phase::Held, SOON).await;
    env.delete("p").await;
    env.wait_gone("p", SOON).await;
    let now = floors().await;
    assert!(
        now.iter()
            .all(|cm| !cm.data.as_ref().unwrap().contains_key(&entry)),
        "covered by old-again's status, the entry was pruned"
    );
    assert!(
        now.iter()
            .all(|cm| cm.name_any().starts_with("targetlease-token-floors-"))
    );
}

/// Defect 12: maxLifetime rotates the lease with its own reason, and status
/// never shows Held past Valkey's expiry; an invalid selector is SpecValid=False.
#[tokio::test]
async fn max_lifetime_rotates_and_invalid_selectors_are_reported() {
    let env = OperatorEnv::start("rotate").await;
    let history = History::record(&env);
    env.create(
        "rot",
        json!({ "target": "t", "holder": { "identity": "rot" },
                "leaseDuration": "3s", "renewInterval": "1s", "maxLifetime": "5s" }),
    )
    .await;
    env.wait_for("rot", "rotated twice", Duration::from_secs(30), |tl| {
        summary(tl).2 >= Some(3) && summary(tl).0 == Some(Phase::Held)
    })
    .await;
    let reasons: Vec<_> = history.of("rot").iter().filter_map(reason).collect();
    assert!(
        reasons.iter().any(|r| r == "MaxLifetimeReached"),
        "{reasons:?}"
    );
    assert!(!reasons.iter().any(|r| r == "LeaseLost"), "{reasons:?}");

    env.create(
        "bad",
        json!({ "target": "b", "candidates": { "podSelector": {
            "matchExpressions": [{ "key": "app", "operator": "Bogus" }] } } }),
    )
    .await;
    let bad = env.wait_phase("bad", Phase::Error, SOON).await;
    let valid = bad
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "SpecValid")
        .unwrap();
    assert_eq!(
        (valid.status.as_str(), valid.reason.as_str()),
        ("False", "InvalidSpec")
    );
}

/// A new lease costs two writes before it is Held (the finalizer and the Held
/// status): its first attempt id derives from the resource's UID, so a crash
/// between the acquire and the status write still replays the same lease.
#[tokio::test]
async fn a_new_lease_is_held_after_two_writes_and_its_first_acquire_replays() {
    let mut env = OperatorEnv::start_without_operator("two-writes").await;
    let history = History::record(&env);
    let created = env
        .create(
            "job",
            json!({ "target": "t", "holder": { "identity": "job" } }),
        )
        .await;
    // What a crashed operator left behind: the first acquire went through,
    // its status write did not.
    let attempt = format!("first-{}", created.uid().unwrap());
    let mut req = AcquireRequest::new(Target::new(&env.ns, "t"), "job", Duration::from_secs(90));
    req.request_id = attempt.clone();
    req.lease_id = Some(env.lease_id_key().derive(&attempt));
    let mut meta = serde_json::Map::new();
    meta.insert("targetlease".into(), format!("{}/job", env.ns).into());
    meta.insert("acquisition".into(), attempt.clone().into());
    req.metadata = Some(meta);
    let store = env.store().await;
    assert_eq!(
        store.acquire(&req).await.unwrap().outcome,
        Outcome::Acquired
    );

    env.start_operator();
    let held = env.wait_phase("job", Phase::Held, SOON).await;
    assert_eq!(summary(&held).2, Some(1), "the same lease, replayed");
    assert_eq!(held.status.unwrap().acquisition_id, Some(attempt));
    env.create(
        "fresh",
        json!({ "target": "u", "holder": { "identity": "fresh" } }),
    )
    .await;
    env.wait_phase("fresh", Phase::Held, SOON).await;
    let versions: Vec<_> = history
        .of("fresh")
        .iter()
        .map(|tl| tl.resource_version())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    // Created, finalizer, Held.
    assert_eq!(versions.len(), 3, "{versions:?}");
}
