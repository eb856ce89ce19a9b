//! Wake-ups: release notifications after a failed subscription, the next waiter, a revoked lease next to its successor.

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
    let proxy = TcpProxy::start(env.valkey.addr()).await;
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
    env.create_pod("b-pod", &[("app", "b")], true).await;
    env.create_pod("d-pod", &[("app", "d")], true).await;
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
    env.create_pod("y-pod", &[("app", "y")], false).await;
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
            reason: Some("repair".into()),
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
    // Replay: instants at which both are published Held.
    let mut current: std::collections::BTreeMap<String, (Option<Phase>, Option<u64>)> =
        Default::default();
    let mut both = Vec::new();
    for e in timeline.entries() {
        if let support::timeline::Change::Lease(n, Some(tl)) = e.change {
            let st = tl.status.unwrap_or_default();
            current.insert(n, (st.phase, st.fencing_token));
            let held: Vec<_> = current
                .iter()
                .filter(|(_, (p, _))| *p == Some(Phase::Held))
                .map(|(n, (_, t))| format!("{n}(token {t:?})"))
                .collect();
            if held.len() > 1 {
                let seen = e.seen.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
                both.push(format!(
                    "rv {} (+{} ms after the revoke): Held: {held:?}",
                    e.rv,
                    seen - at
                ));
            }
        }
    }
    let x_now = env.api().get("x").await.unwrap();
    assert!(
        both.is_empty(),
        "y took the target {y_after} ms after the revoke ({}), while x still published Held:\n{}\nx now: {}",
        status_line(&y_held),
        both.iter().take(3).cloned().collect::<Vec<_>>().join("\n"),
        status_line(&x_now)
    );
}
