//! expiresAt and Held never later than Valkey's expiry: shorter durations, lost renewal replies, partitions, the pod annotation.

use super::*;

/// Promise: published `expiresAt` (status and pod annotation) is "a lower
/// bound on the lease's expiry in Valkey, never later than it", "a renewal
/// that moves Valkey's expiry earlier republishes it".
///
/// Scenario: Held with leaseDuration 60s. The reply path from Valkey to the
/// operator drops (the request path still works), then the spec is edited to
/// 6s. The renewal carrying 6s reaches Valkey and takes effect; its reply is
/// lost (outcome unknown); then the link is cut. The operator keeps
/// publishing the 60s expiry: once Valkey lets the lease go (6s later) an
/// outside holder takes the target while status still says Held, token 1,
/// valid for another ~50s, and the pod keeps its leader label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_duration_whose_renewal_reply_is_lost_never_leaves_a_later_expiry_published() {
    let env = OperatorEnv::start_without_operator("lostreply").await;
    let proxy = TcpProxy::start(env.valkey.addr());
    let op = Op::start(&env, &proxy.url(), "op");
    held_for_pod_w(&env, "w", "60s", "5s").await;
    wait_w_marked(&env, "w").await;

    proxy.set_mode(Mode::DropReplies);
    let before = proxy.forwarded();
    env.patch_spec("w", json!({ "leaseDuration": "6s", "renewInterval": "2s" }))
        .await;
    eventually("the renewal with the new duration sent", SOON, || async {
        (proxy.forwarded() > before).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.set_mode(Mode::Blackhole);

    let store = env.store().await;
    let target = Target::new(&env.ns, "t");
    let outside = outside_acquire(&store, &target, "intruder", Duration::from_secs(20))
        .await
        .expect("Valkey lets the lease go ~6s after the renewal");
    let tl = env.api().get("w").await.unwrap();
    let label = env.marks("w", "w").await;
    let o = outside.lease.unwrap();
    let st = tl.status.clone().unwrap_or_default();
    let published = ms(&st.expires_at);
    let lie =
        st.phase == Some(Phase::Held) && published.is_some_and(|p| p > o.acquired_at_ms as i64);
    assert!(
        !lie && label.0.is_none(),
        "an outside holder got token {} at {} (Valkey time), but the operator still publishes {} \
         ({} ms later than the moment Valkey gave the target away); pod marks {label:?}\nlog tail:\n{}",
        o.fencing_token,
        o.acquired_at_ms,
        status_line(&tl),
        published.unwrap_or(0) - o.acquired_at_ms as i64,
        tail(&op.log(), 15)
    );
}

/// Promise: "`Held` is withdrawn (phase `Unknown`) as soon as the published
/// expiry passes without a confirmation from Valkey"; DESIGN: "published
/// `Held` never outlives [Valkey's expiry]".
///
/// Scenario: leaseDuration 10s, renewInterval 2s. Right after a renewal that
/// republished expiresAt (so Valkey's expiry == published expiry), the
/// operator is partitioned from Valkey (an outside holder still reaches it).
/// Each renewal attempt now takes the full store timeout (2s) before the
/// operator judges the published expiry, so Held (status and leader label)
/// outlives Valkey's expiry while the outside holder already has the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_is_withdrawn_when_the_published_expiry_passes_during_a_partition() {
    let env = OperatorEnv::start_without_operator("partition").await;
    let proxy = TcpProxy::start(env.valkey.addr());
    let op = Op::start(&env, &proxy.url(), "op");
    let held = held_for_pod_w(&env, "w", "10s", "2s").await;
    let first = ms(&held.status.unwrap().expires_at).unwrap();
    // Wait for a renewal that republishes expiresAt, then cut the link at once.
    let republished = loop {
        let tl = env.api().get("w").await.unwrap();
        let e = ms(&tl.status.unwrap().expires_at);
        if let Some(e) = e
            && e != first
        {
            break e;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    proxy.set_mode(Mode::Blackhole);
    let cut = now_ms();

    let store = env.store().await;
    let target = Target::new(&env.ns, "t");
    sleep_until_ms(republished - 300).await;
    let outside = outside_acquire(&store, &target, "intruder", Duration::from_secs(20))
        .await
        .expect("Valkey lets the lease go");
    let o = outside.lease.unwrap();
    // What is published while someone else holds the target.
    let mut seen = Vec::new();
    for _ in 0..30 {
        let tl = env.api().get("w").await.unwrap();
        let label = env.marks("w", "w").await.0;
        let st = tl.status.clone().unwrap_or_default();
        if st.phase == Some(Phase::Held) || label.is_some() {
            seen.push(format!(
                "+{} ms after the outside acquisition: {} | leader label {label:?}",
                now_ms() - o.acquired_at_ms as i64,
                status_line(&tl)
            ));
        } else {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        seen.is_empty(),
        "partitioned at {cut}, published expiry {republished}; an outside holder got token {} at {} \
         (Valkey time); meanwhile the operator kept publishing Held:\n{}\nlog tail:\n{}",
        o.fencing_token,
        o.acquired_at_ms,
        seen.join("\n"),
        tail(&op.log(), 15)
    );
}

/// Promise: "Published `expiresAt` (status and pod annotation) is never later
/// than Valkey's expiry" and "a renewal that moves Valkey's expiry *earlier*
/// ... republishes it, with the pod annotation, before the pass ends".
///
/// Scenario: an elected pod, leaseDuration 60s → 6s. Replays every revision
/// of pods and TargetLeases: the executor writes status first and the pod
/// annotation after it (unmark → status → mark), so there is an instant at
/// which the pod's expires-at is later than its status's (and than Valkey's,
/// which moved earlier at the renewal, before both writes).
#[tokio::test]
async fn a_shorter_duration_never_leaves_the_pod_annotation_later_than_status() {
    let env = OperatorEnv::start("shrinkorder").await;
    env.create_pod(
        "web-0",
        &[
            ("app", "shrinkorder"),
            ("web.targetlease.dev/candidate", "true"),
        ],
        true,
    )
    .await;
    let timeline = Timeline::record(&env.client, &env.ns);
    env.create(
        "web",
        lease_for("t").elect("shrinkorder").durations("60s", "5s"),
    )
    .await;
    env.wait_phase("web", Phase::Held, SOON).await;
    eventually("web-0 marked", SOON, || async {
        env.marks("web-0", "web").await.0.map(|_| ())
    })
    .await;
    env.patch_spec(
        "web",
        json!({ "leaseDuration": "6s", "renewInterval": "2s" }),
    )
    .await;
    env.wait_for("web", "observedGeneration 2", SOON, |tl| {
        tl.status.as_ref().and_then(|s| s.observed_generation) == Some(2)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v = timeline.violations();
    assert!(v.is_empty(), "{}", v.join("\n"));
}

/// Promise (docs/operator.md "Pod marks" and "Status write budget"): the pod
/// carries `expires-at: "<RFC 3339, same lower bound as status>"`, and a
/// republished expiry costs "one annotation update on a pod-tied holder".
///
/// Scenario: a pod-tied lease renewing every second for ~10s. Status times
/// have one-second resolution; an annotation written from an unrounded value
/// would differ from status and be rewritten by the next pass (two pod writes
/// per republish). Status and annotation are two objects, so between their
/// two writes they differ for one revision: the annotation may then be the
/// older (earlier) of the two, never the later, and it must settle on the
/// exact value of status, with one annotation write per status change.
#[tokio::test]
async fn the_expires_at_annotation_is_the_same_lower_bound_as_status() {
    let env = OperatorEnv::start("precision").await;
    held_for_pod_w(&env, "w", "4s", "1s").await;
    let timeline = Timeline::record(&env.client, &env.ns);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut status_expiry = None;
    let mut status_changes = 0;
    let mut annotation = None;
    let mut annotation_writes = 0;
    let mut differs = Vec::new();
    // Status values the annotation never reached while they were current.
    let mut unmatched = Vec::new();
    let mut matched = false;
    for e in timeline.entries() {
        match e.change {
            support::timeline::Change::Lease(_, Some(tl)) => {
                let x = tl
                    .status
                    .and_then(|s| s.expires_at)
                    .map(|t| t.0.to_string());
                if x != status_expiry && status_expiry.is_some() {
                    status_changes += 1;
                    if !matched {
                        unmatched.push(format!("rv {}: {status_expiry:?}", e.rv));
                    }
                    matched = false;
                }
                status_expiry = x;
            }
            support::timeline::Change::Pod(_, Some(p)) => {
                let a = p.annotations().get("w.targetlease.dev/expires-at").cloned();
                if a != annotation && annotation.is_some() {
                    annotation_writes += 1;
                }
                annotation = a;
            }
            _ => continue,
        }
        matched |= status_expiry.is_some() && status_expiry == annotation;
        if let (Some(s), Some(a)) = (&status_expiry, &annotation)
            && a > s
        {
            differs.push(format!("rv {}: status {s} / annotation {a}", e.rv));
        }
    }
    // The recording ends at an arbitrary instant, possibly between the status
    // write and the annotation write of one republish: every status value but
    // the last must have been reached by the annotation while it was current.
    assert!(
        status_changes > 0 && unmatched.is_empty(),
        "the annotation settles on each value of status ({status_changes} changes); \
         never reached:\n{}",
        unmatched.join("\n")
    );
    assert!(
        differs.is_empty() && annotation_writes <= status_changes + 1,
        "{status_changes} status expiry changes, {annotation_writes} annotation changes; \
         instants where the annotation is later than status:\n{}",
        differs.join("\n")
    );
}
