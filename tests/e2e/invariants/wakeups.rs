//! Wake-ups: release notifications after a failed subscription, the next waiter, a revoked lease next to its successor, a deleted lease still published as Held next to its successor.

use super::*;

/// Promise (docs/operator.md "Queues and wake-ups"): "a release wakes the
/// others on the target (also releases from outside Kubernetes, through Valkey
/// pub/sub on `<prefix>:events`, resubscribed with backoff when Valkey was
/// down)".
///
/// Scenario: Valkey cannot be reached for a moment right after the operator's
/// store connected (the proxy refuses the next connection: the subscriber's).
/// An outside holder with a 60s lease then releases; the waiting TargetLease
/// should take the target within seconds, not at the holder's expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_notifications_resume_after_the_subscriber_could_not_connect() {
    let env = OperatorEnv::start_without_operator("resub").await;
    let proxy = TcpProxy::start(env.valkey.addr());
    proxy.refuse_after(1);
    let op = Op::start(&env, &proxy.url(), "op");
    eventually(
        "the subscriber gave up",
        Duration::from_secs(30),
        || async { op.log().contains("no release notifications").then_some(()) },
    )
    .await;
    proxy.refuse_new(false);
    // Valkey is reachable again for everyone from here on.
    let store = env.store().await;
    let target = Target::new(&env.ns, "q");
    let outside = env
        .hold_outside(&store, &target, "cron", Duration::from_secs(60))
        .await;
    env.create("q", lease_for("q").identity("q")).await;
    env.wait_reason("q", "TargetHeld", SOON).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let holder = outside.lease.unwrap().handle().unwrap();
    let released = store
        .release(&ReleaseRequest::new(target.clone(), holder))
        .await
        .unwrap();
    assert_eq!(released.outcome, Outcome::Released);
    let start = now_ms();
    let mut held = None;
    while now_ms() - start < 15_000 {
        let tl = env.api().get("q").await.unwrap();
        if summary(&tl).0 == Some(Phase::Held) {
            held = Some(now_ms() - start);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let now = env.api().get("q").await.unwrap();
    assert!(
        held.is_some(),
        "the outside holder released 15s ago, the waiter is still {} (it will retry only at the \
         outside lease's expiry, ~60s); log:\n{}",
        status_line(&now),
        op.log()
            .lines()
            .filter(|l| l.contains("notification") || l.contains("subscri"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Promise: "one whose pod goes NotReady leaves the queue at once and the next
/// one is woken"; a release wakes the others; no preemption; creation order.
///
/// Scenario: four TargetLeases on one target, created a second apart: a (named
/// identity), b (pod-tied), c (named identity), d (pod-tied). Heads leave the
/// queue for each reason in turn — deleted while Held, pod NotReady while Held,
/// pod deleted while Pending at the head — and the next in line must be Held
/// within a few seconds every time (no waiting for the 30s recheck).
#[tokio::test]
async fn the_next_waiter_is_woken_whenever_the_head_leaves_the_queue() {
    let env = OperatorEnv::start("heads").await;
    env.create_pod(
        "b-pod",
        &[("app", "b"), ("b.targetlease.dev/candidate", "true")],
        true,
    )
    .await;
    env.create_pod(
        "d-pod",
        &[("app", "d"), ("d.targetlease.dev/candidate", "true")],
        true,
    )
    .await;
    let specs = [
        ("a", lease_for("q").identity("a")),
        ("b", lease_for("q").identity("b").pod("b-pod")),
        ("c", lease_for("q").identity("c")),
        ("d", lease_for("q").identity("d").pod("d-pod")),
    ];
    for (name, spec) in specs {
        env.create(name, spec).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    env.wait_phase("a", Phase::Held, SOON).await;
    for n in ["b", "c", "d"] {
        env.wait_reason(n, "Queued", SOON).await;
    }
    let quick = Duration::from_secs(6);
    // a is deleted while Held: b is next.
    env.delete("a").await;
    let b = env.wait_phase("b", Phase::Held, quick).await;
    // b's pod goes NotReady while Held: c is next.
    env.set_ready("b-pod", false).await;
    let c = env.wait_phase("c", Phase::Held, quick).await;
    assert!(summary(&c).2 > summary(&b).2);
    // b's pod is Ready again: no preemption, c keeps the target.
    env.set_ready("b-pod", true).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        summary(&env.api().get("c").await.unwrap()).0,
        Some(Phase::Held)
    );
    assert_ne!(
        summary(&env.api().get("b").await.unwrap()).0,
        Some(Phase::Held)
    );
    // c is deleted: b (older, Ready again) is next, d stays queued.
    env.delete("c").await;
    env.wait_phase("b", Phase::Held, quick).await;
    env.wait_reason("d", "Queued", quick).await;
    // b's pod is deleted: d is next.
    env.delete_pod("b-pod").await;
    let d = env.wait_phase("d", Phase::Held, quick).await;
    let tokens: Vec<_> = [&b, &c, &d].iter().map(|t| summary(t).2).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

/// Promises: "Several TargetLeases on one target: exactly one is `Held`";
/// `Lost`: "Valkey ended a lease the operator did not give back"; published
/// Held never outlives the lease in Valkey.
///
/// Scenario: x holds the target (leaseDuration 60s, renewInterval 20s); y, older,
/// waits (TargetHeld) because its pod became Ready after x won. An
/// administrator revokes the target (`targetlease lease revoke`, e.g. to repair
/// it). The revoke publishes a release event: y is woken and acquires at once,
/// but x's pass on the same event plans `Idle` (its renewal is not due), so x
/// keeps publishing Held, token 1, until its next renewal, up to 20s later.
#[tokio::test]
async fn a_revoked_lease_is_not_published_as_held_next_to_its_successor() {
    let env = OperatorEnv::start("revoke").await;
    env.create_pod(
        "y-pod",
        &[("app", "y"), ("y.targetlease.dev/candidate", "true")],
        false,
    )
    .await;
    let y = lease_for("t").identity("y").pod("y-pod");
    env.create("y", y.durations("60s", "20s")).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let x = lease_for("t").identity("x");
    env.create("x", x.durations("60s", "20s")).await;
    env.wait_phase("x", Phase::Held, SOON).await;
    env.set_ready("y-pod", true).await;
    env.wait_reason("y", "TargetHeld", SOON).await;
    let timeline = Timeline::record(&env.client, &env.ns);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let store = env.store().await;
    let revoked = store
        .revoke(&targetlease::store::RevokeRequest {
            ..targetlease::store::RevokeRequest::new(Target::new(&env.ns, "t"))
        })
        .await
        .unwrap();
    let at = now_ms();
    eprintln!("revoke: {:?}", revoked.outcome);
    let y_held = env
        .wait_phase("y", Phase::Held, Duration::from_secs(25))
        .await;
    let y_after = now_ms() - at;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let both = both_held(&timeline, at);
    let x_now = env.api().get("x").await.unwrap();
    assert!(
        both.is_empty(),
        "y took the target {y_after} ms after the revoke ({}), while x still published Held:\n{}\nx now: {}",
        status_line(&y_held),
        both.iter().take(3).cloned().collect::<Vec<_>>().join("\n"),
        status_line(&x_now)
    );
}

/// The revisions (with their time after `at`) at which two TargetLeases were
/// published Held at once, replayed in the API server's order.
fn both_held(timeline: &Timeline, at: i64) -> Vec<String> {
    let mut current: std::collections::BTreeMap<String, (Option<Phase>, Option<u64>)> =
        Default::default();
    let mut both = Vec::new();
    for e in timeline.entries() {
        if let support::timeline::Change::Lease(n, tl) = e.change {
            match tl {
                Some(tl) => {
                    let st = tl.status.unwrap_or_default();
                    current.insert(n, (st.phase, st.fencing_token));
                }
                None => {
                    current.remove(&n);
                }
            }
            let held: Vec<_> = current
                .iter()
                .filter(|(_, (p, _))| *p == Some(Phase::Held))
                .map(|(n, (_, t))| format!("{n}(token {t:?})"))
                .collect();
            if held.len() > 1 {
                let seen = e.seen.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
                both.push(format!("rv {} (+{} ms): Held: {held:?}", e.rv, seen - at));
            }
        }
    }
    both
}

/// Refuses every status write of TargetLease `name` in `ns` at admission (a
/// ValidatingAdmissionPolicy), until the returned names are deleted.
async fn refuse_status_writes(env: &OperatorEnv, name: &str) -> String {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let policy_name = format!("refuse-status-{}", env.ns);
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": { "name": policy_name },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": { "resourceRules": [{
                "apiGroups": ["targetlease.dev"], "apiVersions": ["*"],
                "operations": ["UPDATE"], "resources": ["targetleases/status"],
            }]},
            "validations": [{
                "expression": format!(
                    "object.metadata.namespace != '{}' || object.metadata.name != '{name}'",
                    env.ns
                ),
                "message": "status writes refused by the test",
            }],
        },
    }))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": { "name": policy_name },
        "spec": { "policyName": policy_name, "validationActions": ["Deny"] },
    }))
    .unwrap();
    kube::Api::<ValidatingAdmissionPolicy>::all(env.client.clone())
        .create(&Default::default(), &policy)
        .await
        .unwrap();
    kube::Api::<ValidatingAdmissionPolicyBinding>::all(env.client.clone())
        .create(&Default::default(), &binding)
        .await
        .unwrap();
    // In force once a dry-run status write of `name` is refused.
    let api = env.api();
    eventually("the status writes are refused", SOON, || async {
        let patch = json!({ "status": { "conditions": [] } });
        let pp = PatchParams {
            dry_run: true,
            ..Default::default()
        };
        api.patch_status(name, &pp, &Patch::Merge(&patch))
            .await
            .is_err()
            .then_some(())
    })
    .await;
    policy_name
}

/// a holds target t (`duration`, renewed every `renew`), b waits behind it
/// (Queued), and every status write of a is refused from here on (the
/// returned policy name lifts it).
async fn a_holds_b_waits_and_a_cannot_write_status(
    env: &OperatorEnv,
    duration: &str,
    renew: &str,
) -> String {
    env.create("a", lease_for("t").identity("a").durations(duration, renew))
        .await;
    env.wait_phase("a", Phase::Held, SOON).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    env.create("b", lease_for("t").identity("b")).await;
    env.wait_reason("b", "Queued", SOON).await;
    refuse_status_writes(env, "a").await
}

async fn allow_status_writes(env: &OperatorEnv, policy_name: &str) {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    kube::Api::<ValidatingAdmissionPolicyBinding>::all(env.client.clone())
        .delete(policy_name, &Default::default())
        .await
        .unwrap();
    kube::Api::<ValidatingAdmissionPolicy>::all(env.client.clone())
        .delete(policy_name, &Default::default())
        .await
        .unwrap();
}

/// Promises: "Several TargetLeases on one target: exactly one is `Held`",
/// also when Valkey has lost the lease: `TargetHeld` "another TargetLease on
/// the target is still published as `Held`, e.g. one being deleted: nobody is
/// granted the target until that status is withdrawn or its `expiresAt` has
/// passed".
///
/// Scenario: a holds the target (leaseDuration 60s), b waits behind it.
/// Valkey loses everything, a is deleted, and a's status writes are refused
/// for a while (an API server that refuses them, a webhook down): its cleanup
/// cannot withdraw Held. b is reconciled meanwhile; Valkey would grant it the
/// target, since it no longer has a's lease.
#[tokio::test]
async fn a_deleted_lease_still_published_as_held_keeps_its_successor_waiting() {
    let env = OperatorEnv::start("held-elsewhere").await;
    let policy = a_holds_b_waits_and_a_cannot_write_status(&env, "60s", "20s").await;
    let timeline = Timeline::record(&env.client, &env.ns);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let at = now_ms();
    env.valkey.conn().cmd(&["FLUSHALL"]);
    env.delete("a").await;
    // b is reconciled (a metadata change) while a is still published Held.
    for i in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let touch = json!({ "metadata": { "annotations": { "test/touch": i.to_string() } } });
        env.api()
            .patch("b", &PatchParams::default(), &Patch::Merge(&touch))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let a_now = env.api().get("a").await.unwrap();
    assert_eq!(
        summary(&a_now).0,
        Some(Phase::Held),
        "the test's premise: a cannot withdraw Held"
    );
    let b_now = env.api().get("b").await.unwrap();
    let held_reason = support::operator_env::condition(&b_now, "Held");
    assert_ne!(summary(&b_now).0, Some(Phase::Held), "{held_reason:?}");
    allow_status_writes(&env, &policy).await;
    env.wait_gone("a", Duration::from_secs(40)).await;
    let b_held = env.wait_phase("b", Phase::Held, SOON).await;
    assert_eq!(
        summary(&b_held).2,
        Some(2),
        "above a's token, kept by the floor"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let both = both_held(&timeline, at);
    assert!(
        both.is_empty(),
        "b was published Held next to a:\n{}\nb before a let go: {held_reason:?}",
        both.iter().take(3).cloned().collect::<Vec<_>>().join("\n"),
    );
}

/// Promise (docs/operator.md, `TargetHeld`): a sibling still published as
/// Held blocks the target "until that status is withdrawn or its
/// `expiresAt` has passed" — also when it can never be withdrawn (its status
/// writes refused): the successor is granted the target within seconds of
/// that expiry, not at its next recheck.
#[tokio::test]
async fn a_stale_held_sibling_stops_blocking_its_successor_at_its_expiry() {
    let env = OperatorEnv::start("stale-held").await;
    let policy = a_holds_b_waits_and_a_cannot_write_status(&env, "4s", "1s").await;
    env.valkey.conn().cmd(&["FLUSHALL"]);
    env.delete("a").await;
    let b = env
        .wait_phase("b", Phase::Held, Duration::from_secs(90))
        .await;
    let a_now = env.api().get("a").await.unwrap();
    let a_expiry = ms(&a_now.status.clone().unwrap().expires_at).unwrap();
    let b_acquired = ms(&b.status.clone().unwrap().acquired_at).unwrap();
    println!(
        "a still {:?}, expiresAt {a_expiry}; b Held (token {:?}) {} ms after it",
        summary(&a_now).0,
        summary(&b).2,
        b_acquired - a_expiry
    );
    assert!(
        b_acquired >= a_expiry,
        "b granted before a's published expiry"
    );
    allow_status_writes(&env, &policy).await;
    assert!(
        b_acquired - a_expiry < 5_000,
        "b waited {} ms past a's published expiry",
        b_acquired - a_expiry
    );
}
