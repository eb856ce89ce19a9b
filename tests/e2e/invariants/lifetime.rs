//! maxLifetime: added to a held lease, and across a restart, it is enforced and never shown as Held past it.

use super::*;

/// Promise (docs/operator.md "maxLifetime", "observedGeneration"): "A lease
/// never outlives `maxLifetime` from its acquisition" and `observedGeneration`
/// is "the generation whose spec the lease carries".
///
/// Scenario: a Held lease without maxLifetime; `maxLifetime: 6s` is added.
/// The edit is reported applied (observedGeneration moves) by a renewal, but
/// a renewal cannot carry a max lifetime (RenewRequest has none), so the lease
/// lives on with no hard end and is never rotated.
#[tokio::test]
async fn max_lifetime_added_to_a_held_lease_is_enforced() {
    let env = OperatorEnv::start("maxedit").await;
    env.create("m", lease_for("t").identity("m").durations("4s", "2s"))
        .await;
    let held = env.wait_phase("m", Phase::Held, SOON).await;
    assert_eq!(summary(&held).2, Some(1));
    let acquired = ms(&held.status.clone().unwrap().acquired_at).unwrap();
    env.patch_spec("m", json!({ "maxLifetime": "6s" })).await;
    let applied = env
        .wait_for("m", "observedGeneration 2", SOON, |tl| {
            tl.status.as_ref().and_then(|s| s.observed_generation) == Some(2)
        })
        .await;
    // Give the operator the whole lifetime plus two renew intervals.
    sleep_until_ms(acquired + 6_000 + 4_000).await;
    let now = env.api().get("m").await.unwrap();
    let store = env.store().await;
    let lease = store
        .get(&Target::new(&env.ns, "t"))
        .await
        .unwrap()
        .lease
        .expect("a lease");
    let age = now_ms() - lease.acquired_at_ms as i64;
    assert!(
        lease.fencing_token > 1 || lease.max_expires_at_ms.is_some(),
        "observedGeneration=2 was reported ({}) but the lease (token {}, acquired at {}) is \
         still live {age} ms after its acquisition with no hard end (max_expires_at_ms={:?}); \
         maxLifetime 6s is not enforced. now: {}\nlog tail:\n{}",
        status_line(&applied),
        lease.fencing_token,
        lease.acquired_at_ms,
        lease.max_expires_at_ms,
        status_line(&now),
        tail(&env.operator_log(0), 8)
    );
}

/// Promise (docs/operator.md "maxLifetime"): "when its hard end is within one
/// `renewInterval`, the operator unpublishes it, releases it and acquires a new
/// one ... (reason `MaxLifetimeReached`, not `LeaseLost`), so status never
/// shows `Held` past the end Valkey enforces".
///
/// Scenario: leaseDuration 12s, renewInterval 5s, maxLifetime 15s. The
/// operator is killed at 6s and restarted at 12s (before the hard end, but
/// within one renewInterval of it). The restarted operator does not remember
/// the hard end before its first renewal (`Memory::confirmed` is empty, so
/// `rotation_due` is false and it plans a plain Renew followed by a
/// full-interval sleep). Holds today only because that renewal always
/// republishes expiresAt and the operator's own status write triggers another
/// pass, which then sees the hard end and rotates.
#[tokio::test]
async fn a_restarted_operator_never_shows_held_past_max_lifetime() {
    let mut env = OperatorEnv::start("maxrestart").await;
    env.create_pod(
        "w",
        &[("app", "w"), ("rot.targetlease.dev/candidate", "true")],
        true,
    )
    .await;
    env.create(
        "rot",
        lease_for("t")
            .identity("w")
            .pod("w")
            .durations("12s", "5s")
            .max_lifetime("15s"),
    )
    .await;
    let held = env.wait_phase("rot", Phase::Held, SOON).await;
    let acquired = ms(&held.status.clone().unwrap().acquired_at).unwrap();
    let hard_end = acquired + 15_000;
    sleep_until_ms(acquired + 6_000).await;
    env.kill_operator(0);
    sleep_until_ms(acquired + 12_000).await;
    env.start_operator();
    let store = env.store().await;
    let target = Target::new(&env.ns, "t");
    let mut renewed_before_end = None;
    let mut violations = Vec::new();
    let mut samples = Vec::new();
    while now_ms() < hard_end + 6_000 {
        let tl = env.api().get("rot").await.unwrap();
        let st = tl.status.clone().unwrap_or_default();
        let t = now_ms();
        samples.push(format!("+{} {}", t - acquired, status_line(&tl)));
        if renewed_before_end.is_none() && ms(&st.expires_at) == Some(hard_end) && t < hard_end {
            renewed_before_end = Some(t - acquired);
        }
        if t > hard_end + 1_000 && st.phase == Some(Phase::Held) && st.fencing_token == Some(1) {
            let in_valkey = store.get(&target).await.map(|r| r.outcome);
            let label = env.marks("w", "rot").await.0;
            violations.push(format!(
                "+{} ms after acquisition ({} ms past the hard end): {} | valkey: {in_valkey:?} | leader label {label:?}",
                t - acquired,
                t - hard_end,
                status_line(&tl)
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(env.client.clone(), &env.ns);
    let lost: Vec<_> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("LeaseLost"))
        .filter_map(|e| e.note)
        .collect();
    assert!(
        violations.is_empty() && lost.is_empty(),
        "restarted operator's first republish at +{renewed_before_end:?} ms (hard end at +15000 ms); \
         status stayed Held past the hard end:\n{}\nLeaseLost events: {lost:?}\nsamples:\n{}\nlog tail:\n{}",
        violations.join("\n"),
        samples.join("\n"),
        tail(&env.operator_log(1), 25)
    );
}
