//! Pauses and admission: a resumed operator publishes nothing stale; admission and the operator agree on names, targets and identities.

use super::*;

/// Promise: published `Held` never outlives Valkey's expiry; a token is never
/// published below one published before.
///
/// Scenario: the operator is frozen (SIGSTOP) for three lease durations while
/// an outside holder takes the target, then resumed. Anything the resumed
/// operator writes must not claim the lease it lost: every TargetLease version
/// written after the resume that says Held must have an expiry in the future
/// at the time it was written, and the old leader's label must be gone soon.
#[tokio::test]
async fn a_resumed_operator_publishes_nothing_stale() {
    let env = OperatorEnv::start("paused").await;
    held_for_pod_w(&env, "w", "3s", "1s").await;
    let timeline = Timeline::record(&env.client, &env.ns);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    env.pause_operator(0, true);
    let paused_at = now_ms();
    let store = env.store().await;
    let target = Target::new(&env.ns, "t");
    let outside = outside_acquire(&store, &target, "intruder", Duration::from_secs(10))
        .await
        .expect("the frozen operator's lease runs out");
    sleep_until_ms(paused_at + 9_000).await;
    let resume_rv: u64 = env
        .api()
        .get("w")
        .await
        .unwrap()
        .resource_version()
        .unwrap()
        .parse()
        .unwrap();
    env.pause_operator(0, false);
    eventually("the old leader unmarked", SOON, || async {
        env.marks("w", "w").await.0.is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut stale = Vec::new();
    for (rv, seen, tl) in timeline.lease_versions("w") {
        let Some(tl) = tl else { continue };
        let st = tl.status.clone().unwrap_or_default();
        let seen_ms = seen.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        if rv > resume_rv
            && st.phase == Some(Phase::Held)
            && ms(&st.expires_at).is_some_and(|e| e < seen_ms)
        {
            stale.push(format!("rv {rv}: {}", status_line(&tl)));
        }
    }
    let v = timeline.violations();
    assert!(
        stale.is_empty() && v.is_empty(),
        "outside holder got token {:?}; written after the resume: {stale:?}; \
         revision violations: {v:?}",
        outside.lease.map(|l| l.fencing_token)
    );
}

/// Promise: admission and the operator agree: a spec the API server accepts
/// is acted on (never a loop of "backend unavailable"), one it refuses is
/// refused with the documented message. Byte/char limits, C0/C1 controls,
/// non-control Unicode separators, the 237-char name limit.
#[tokio::test]
async fn admission_and_the_operator_agree_on_names_targets_and_identities() {
    let env = OperatorEnv::start("limits").await;
    let two_byte = "é".repeat(128); // 128 chars, 256 bytes
    let accepted = [
        (
            "bytes-256",
            json!({ "target": two_byte, "holder": { "identity": two_byte } }),
        ),
        (
            "separators",
            json!({ "target": "a\u{2028}b\u{200b}c", "holder": { "identity": "x\u{feff}y" } }),
        ),
        (
            "colon",
            json!({ "target": "}:{a%3A}", "holder": { "identity": "i" } }),
        ),
    ];
    for (name, spec) in &accepted {
        env.create(name, spec.clone()).await;
    }
    let long_name = "n".repeat(237);
    env.create(&long_name, lease_for("long").identity("l"))
        .await;
    for (name, _) in &accepted {
        env.wait_phase(name, Phase::Held, SOON).await;
    }
    env.wait_phase(&long_name, Phase::Held, SOON).await;
    let refused = [
        json!({ "target": format!("{two_byte}x"), "holder": { "identity": "i" } }),
        json!({ "target": "a\u{85}b", "holder": { "identity": "i" } }),
        json!({ "target": "a\u{7f}b", "holder": { "identity": "i" } }),
        json!({ "target": "t", "holder": { "identity": "a\tb" } }),
        json!({ "target": "t", "candidates": { "podSelector": {} } }),
        json!({ "target": "t", "holder": { "identity": "i" }, "leaseDuration": "10s", "renewInterval": "6s" }),
    ];
    for (i, spec) in refused.iter().enumerate() {
        let obj: TargetLease = serde_json::from_value(json!({
            "apiVersion": "targetlease.dev/v1alpha1", "kind": "TargetLease",
            "metadata": { "name": format!("refused-{i}") }, "spec": spec,
        }))
        .unwrap();
        let r = env.api().create(&Default::default(), &obj).await;
        assert!(r.is_err(), "admitted: {spec}");
    }
    let name_238: TargetLease = serde_json::from_value(json!({
        "apiVersion": "targetlease.dev/v1alpha1", "kind": "TargetLease",
        "metadata": { "name": "n".repeat(238) }, "spec": { "target": "t", "holder": { "identity": "i" } },
    }))
    .unwrap();
    assert!(
        env.api()
            .create(&Default::default(), &name_238)
            .await
            .is_err()
    );
}
