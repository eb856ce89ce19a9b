//! What is published stays a lower bound and never goes back: shorter durations, stale writes, rapid handoffs, pod marks, overlapping elections.

use super::*;

/// A shorter leaseDuration moves Valkey's expiry earlier; status
/// and the pod annotation must follow at once, and `observedGeneration` must
/// not claim the edit before the lease carries it.
#[tokio::test]
async fn a_shorter_lease_duration_is_published_before_the_pass_ends() {
    let env = OperatorEnv::start("shrink").await;
    env.create_pod(
        "web-0",
        &[("app", "shrink"), ("web.targetlease.dev/candidate", "true")],
        true,
    )
    .await;
    env.create("web", lease_for("t").elect("shrink").durations("60s", "5s"))
        .await;
    env.wait_phase("web", Phase::Held, SOON).await;
    let store = env.store().await;
    let target = Target::new(&env.ns, "t");
    env.patch_spec(
        "web",
        json!({ "leaseDuration": "6s", "renewInterval": "2s" }),
    )
    .await;
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

/// Stale writes are refused: status writes carry the resourceVersion they were
/// planned from; the real API server refuses an older one.
#[tokio::test]
async fn status_writes_from_an_older_version_are_refused() {
    let env = OperatorEnv::start_without_operator("stale").await;
    let created = env.create("job", lease_for("t").identity("job")).await;
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

/// Under churn: many handoffs with readiness flips, wake-ups and
/// Valkey losing everything: the published token never goes down and at most
/// one pod is ever published as leader.
#[tokio::test]
async fn published_tokens_never_go_down_through_rapid_handoffs() {
    let env = OperatorEnv::start("churn").await;
    for name in ["w-0", "w-1", "w-2"] {
        env.create_pod(
            name,
            &[
                ("app", "churn"),
                ("churn.targetlease.dev/candidate", "true"),
            ],
            true,
        )
        .await;
    }
    let history = History::record(&env);
    env.create("churn", lease_for("t").elect("churn").durations("4s", "1s"))
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

/// The pods of election `el`, opted in to it.
const MARKS: &[(&str, &str)] = &[("app", "marks"), ("el.targetlease.dev/candidate", "true")];

/// Marks follow status — a pod carrying marks status does not name
/// is unmarked, corrupt state unmarks, deletion unmarks.
#[tokio::test]
async fn pod_marks_always_match_status() {
    let env = OperatorEnv::start("marks").await;
    env.create_pod("m-0", MARKS, true).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    env.create_pod("m-1", MARKS, true).await;
    env.create("el", lease_for("t").elect("marks").durations("6s", "1s"))
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
    let key = format!("targetlease:{{{}:t}}", env.ns);
    env.valkey.conn().cmd(&["HSET", &key, "lease", "garbage"]);
    env.wait_phase("el", Phase::Error, SOON).await;
    eventually("unmarked on Error", SOON, || async {
        (env.marks("m-0", "el").await == (None, None, None)).then_some(())
    })
    .await;
    // Repaired the documented way: a revoke wakes the lease through pub/sub.
    let repair = targetlease::store::RevokeRequest::new(Target::new(&env.ns, "t"));
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

/// Two elections over the same pods each mark their own leader
/// under their own keys, and the overlap is flagged.
#[tokio::test]
async fn overlapping_elections_never_share_a_leader_label() {
    let env = OperatorEnv::start("overlap").await;
    let shared = [
        ("app", "shared"),
        ("alpha.targetlease.dev/candidate", "true"),
        ("beta.targetlease.dev/candidate", "true"),
    ];
    env.create_pod("o-0", &shared, true).await;
    env.create_pod("o-1", &shared, true).await;
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
