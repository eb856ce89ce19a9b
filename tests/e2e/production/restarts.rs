//! Restarts, outages and deletes: re-adoption among many pods, a delete during an outage, reclaiming our own unpublished acquisitions, recreated pods, stranded waiters.

use super::*;

/// A restarted operator must not plan from a pod cache that has not
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
    env.create_pod(
        "worker",
        &[
            ("app", "worker"),
            ("tied.targetlease.dev/candidate", "true"),
        ],
        true,
    )
    .await;
    for web in ["web-0", "web-1"] {
        env.create_pod(
            web,
            &[("app", "web"), ("elect.targetlease.dev/candidate", "true")],
            true,
        )
        .await;
    }
    env.create("tied", lease_for("tied").identity("worker").pod("worker"))
        .await;
    env.create("elect", lease_for("elect").elect("web")).await;
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

/// The head of a queue leaves it (its pod goes NotReady); the next
/// waiter takes the target once the outside holder's lease expires.
#[tokio::test]
async fn a_waiter_is_not_stranded_when_the_head_of_the_queue_leaves() {
    let env = OperatorEnv::start("stranded").await;
    let store = env.store().await;
    env.hold_outside(
        &store,
        &Target::new(&env.ns, "q"),
        "cron",
        Duration::from_secs(15),
    )
    .await;
    env.create_pod(
        "q1-pod",
        &[("app", "q1"), ("q1.targetlease.dev/candidate", "true")],
        true,
    )
    .await;
    env.create("q1", lease_for("q").identity("q1").pod("q1-pod"))
        .await;
    env.wait_reason("q1", "TargetHeld", SOON).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    env.create("q2", lease_for("q").identity("q2")).await;
    env.wait_reason("q2", "Queued", SOON).await;
    env.set_ready("q1-pod", false).await;
    env.wait_reason("q1", "PodNotReady", SOON).await;
    // The outside lease ends within 15s of its acquisition; q2 is next.
    let held = env
        .wait_phase("q2", Phase::Held, Duration::from_secs(25))
        .await;
    assert_eq!(summary(&held).2, Some(2));
}

/// Deleting a TargetLease while Valkey is down keeps the finalizer
/// until the release is confirmed, never shows Held past the published
/// expiry, and raises the token floor first: a token is never reused.
#[tokio::test]
async fn a_delete_during_an_outage_keeps_the_finalizer_and_the_floor() {
    let mut env = OperatorEnv::start("outage-delete").await;
    env.create("job", lease_for("t").identity("job").durations("6s", "1s"))
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
    let key = targetlease::operator::floor::floor_key(&env.ns, "t");
    assert!(
        list.items.iter().any(|cm| {
            let data = cm.data.clone().unwrap_or_default();
            data.contains_key(&key)
                && targetlease::operator::floor::ledger::floor_in(&data, &key) == 1
        }),
        "the floor holds token 1 before the release"
    );

    env.valkey.restart(); // empty: no persistence
    env.wait_gone("job", Duration::from_secs(40)).await;
    env.create("next", lease_for("t").identity("next")).await;
    let next = env.wait_phase("next", Phase::Held, SOON).await;
    assert_eq!(summary(&next).2, Some(2), "never token 1 again");
}

/// A lease the operator acquired for this resource but never
/// published (a crash before the status write) does not block the target.
#[tokio::test]
async fn an_unpublished_acquisition_of_our_own_is_reclaimed_at_once() {
    let env = OperatorEnv::start("orphan").await;
    let store = env.store().await;
    let req = env.operator_acquire(
        "job",
        "t",
        "attempt-before-the-crash",
        Duration::from_secs(90),
    );
    assert_eq!(
        store.acquire(&req).await.unwrap().outcome,
        Outcome::Acquired
    );

    env.create("job", lease_for("t").identity("job")).await;
    let tl = env
        .wait_phase("job", Phase::Held, Duration::from_secs(10))
        .await;
    assert_eq!(summary(&tl).2, Some(2));

    // Someone else's lease is left alone.
    env.hold_outside(
        &store,
        &Target::new(&env.ns, "u"),
        "cron",
        Duration::from_secs(90),
    )
    .await;
    env.create("waits", lease_for("u").identity("waits")).await;
    env.wait_reason("waits", "TargetHeld", SOON).await;
    let still = store.get(&Target::new(&env.ns, "u")).await.unwrap();
    assert_eq!(still.lease.unwrap().owner, "cron");
}

/// A pod recreated under the same name is a new holder.
#[tokio::test]
async fn a_recreated_pod_gets_a_new_lease() {
    let mut env = OperatorEnv::start("recreated").await;
    env.create_pod(
        "worker",
        &[
            ("app", "worker"),
            ("tied.targetlease.dev/candidate", "true"),
        ],
        true,
    )
    .await;
    env.create("tied", lease_for("t").identity("worker").pod("worker"))
        .await;
    let held = env.wait_phase("tied", Phase::Held, SOON).await;
    assert_eq!(summary(&held).2, Some(1));
    let uid = held.status.unwrap().holder_pod_uid.expect("holderPodUID");
    // The operator is down while the pod is replaced (a StatefulSet would do this).
    env.kill_operator(0);
    env.delete_pod("worker").await;
    env.create_pod(
        "worker",
        &[
            ("app", "worker"),
            ("tied.targetlease.dev/candidate", "true"),
        ],
        true,
    )
    .await;
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

/// The first wall-clock instant operator `i` wrote in its log (Unix ms): what
/// its clock said when it started.
fn first_logged_ms(env: &OperatorEnv, i: usize) -> Option<i64> {
    let log = env.operator_log(i);
    let line = log.lines().next()?;
    // Without the colour codes the log may carry around its timestamp.
    let mut plain = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| *c == 'm');
        } else {
            plain.push(c);
        }
    }
    let stamp = plain.split_whitespace().next()?;
    stamp
        .parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}

/// Promise (docs/operator.md, "Crash safety"): a restarted operator judges
/// expiry by Valkey's clock from its first pass on, so a node clock ahead of
/// Valkey's withdraws nothing on restart. The operator restarts with its wall
/// clock an hour ahead (libfaketime on its process alone). Judged by that
/// clock, both published expiries have long passed and the lease with a
/// `maxLifetime` has outlived it; judged by Valkey's, neither. Both stay Held
/// with their tokens in every version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_clock_ahead_of_valkeys_withdraws_nothing_on_restart() {
    let mut env = OperatorEnv::start("clock-ahead").await;
    let history = History::record(&env);
    env.create(
        "rotating",
        lease_for("t")
            .identity("rotating")
            .durations("20s", "4s")
            .max_lifetime("10m"),
    )
    .await;
    env.create(
        "plain",
        lease_for("u").identity("plain").durations("20s", "4s"),
    )
    .await;
    let rotating = summary(&env.wait_phase("rotating", Phase::Held, SOON).await).2;
    let plain = summary(&env.wait_phase("plain", Phase::Held, SOON).await).2;

    env.kill_operator(0);
    let lib = support::tools::tool("libfaketimeMT.so.1");
    env.operator_env = vec![
        ("LD_PRELOAD".into(), lib.display().to_string()),
        ("FAKETIME".into(), "+1h".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ];
    let restarted = env.start_operator();
    // Several renewals by the restarted operator.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let ahead = first_logged_ms(&env, restarted).expect("a timestamped log line") - now_ms() as i64;
    assert!(
        ahead > 50 * 60 * 1000,
        "the restarted operator's clock is only {ahead} ms ahead"
    );

    for (name, token) in [("rotating", rotating), ("plain", plain)] {
        let now = env.api().get(name).await.unwrap();
        assert_eq!(summary(&now).0, Some(Phase::Held), "{name}");
        let versions = history.of(name);
        let first_held = versions
            .iter()
            .position(|tl| summary(tl).0 == Some(Phase::Held))
            .unwrap();
        let withdrawn: Vec<_> = versions[first_held..]
            .iter()
            .filter(|tl| summary(tl).0 != Some(Phase::Held) || summary(tl).2 != token)
            .map(|tl| format!("{:?} {:?}", summary(tl), reason(tl)))
            .collect();
        assert!(
            withdrawn.is_empty(),
            "{name} after the restart: {withdrawn:?}"
        );
    }
    let (_, metrics) = support::operator_env::http_get(env.admin_port(restarted), "/metrics")
        .expect("/metrics of the restarted operator");
    let renewed = r#"targetlease_store_calls_total{operation="renew",result="renewed"} "#;
    let count = metrics
        .lines()
        .find_map(|l| l.strip_prefix(renewed)?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(
        count >= 4.0,
        "the restarted operator renewed both leases:\n{metrics}"
    );
}
