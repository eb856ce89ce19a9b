//! Leases end to end: held with a token, released on delete, handoffs in creation order, waiters, restarts and a Valkey that forgets or goes down.

use super::*;

#[tokio::test]
async fn applied_lease_is_held_with_a_token_from_valkey() {
    let env = OperatorEnv::start("held").await;
    env.create("job-a", lease_for("db-migration").identity("job-a"))
        .await;
    let tl = env.wait_phase("job-a", Phase::Held, SOON).await;
    let st = tl.status.clone().unwrap();
    assert_eq!(st.holder.as_deref(), Some("job-a"));
    assert_eq!(st.fencing_token, Some(1));
    assert!(st.acquired_at.is_some() && st.expires_at.is_some());
    assert_eq!(st.observed_generation, tl.metadata.generation);
    assert!(
        tl.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"targetlease.dev/release".to_string())
    );
    let held = st.conditions.iter().find(|c| c.type_ == "Held").unwrap();
    assert_eq!(held.status, "True");

    // Valkey agrees, and the published expiry is no later than Valkey's.
    let store = env.store().await;
    let got = store
        .get(&Target::new(&env.ns, "db-migration"))
        .await
        .unwrap();
    assert_eq!(got.outcome, Outcome::Found);
    let lease = got.lease.unwrap();
    assert_eq!(lease.owner, "job-a");
    assert_eq!(lease.fencing_token, 1);
    let published = st.expires_at.unwrap().0.as_millisecond() as u64;
    assert!(published <= lease.expires_at_ms);
}

/// What the operator publishes (status, the lease's metadata, what `get`
/// shows) is not enough to replay its acquire and be handed the lease id: its
/// request id is not the published acquisition id.
#[tokio::test]
async fn an_operator_lease_cannot_be_replayed_from_what_it_publishes() {
    let env = OperatorEnv::start("no-replay").await;
    let tl = env
        .create("job-a", lease_for("guarded").identity("job-a"))
        .await;
    let held = env.wait_phase("job-a", Phase::Held, SOON).await;
    let st = held.status.unwrap();
    // The first attempt's id is implicit (derived from the UID); later ones are recorded.
    let acquisition = st
        .acquisition_id
        .clone()
        .unwrap_or_else(|| format!("first-{}", tl.metadata.uid.clone().unwrap()));
    let store = env.store().await;
    let target = Target::new(&env.ns, "guarded");
    let shown = store.get(&target).await.unwrap().lease.unwrap();
    assert_eq!(
        shown.metadata.as_ref().and_then(|m| m.get("acquisition")),
        Some(&json!(acquisition)),
        "the acquisition id is public"
    );

    // Everything an outsider can see, replayed under the acquisition id.
    let mut req = targetlease::store::AcquireRequest::new(
        target.clone(),
        st.holder.clone().unwrap(),
        Duration::from_secs(90),
    );
    req.request_id = acquisition.clone();
    req.metadata = shown.metadata.clone();
    req.max_lifetime = shown
        .max_expires_at_ms
        .map(|m| Duration::from_millis(m - shown.acquired_at_ms));
    let replay = store.acquire(&req).await.unwrap();
    assert_eq!(replay.lease.as_ref().and_then(|l| l.lease_id.clone()), None);
    assert_eq!(
        replay.outcome,
        Outcome::Held,
        "a new request (the acquisition id is not the request id): {replay:?}"
    );
    let l = replay.lease.unwrap();
    assert_eq!((l.owner.as_str(), l.fencing_token), ("job-a", 1));
}

#[tokio::test]
async fn deleting_the_resource_releases_the_lease() {
    let env = OperatorEnv::start("release").await;
    env.create("job-a", lease_for("t").identity("job-a")).await;
    env.wait_phase("job-a", Phase::Held, SOON).await;
    env.delete("job-a").await;
    env.wait_gone("job-a", SOON).await;
    let store = env.store().await;
    let got = store.get(&Target::new(&env.ns, "t")).await.unwrap();
    assert_eq!(
        got.outcome,
        Outcome::NotFound,
        "finalizer released the lease in Valkey"
    );
}

#[tokio::test]
async fn two_leases_on_one_target_hand_off_in_creation_order() {
    let env = OperatorEnv::start("handoff").await;
    env.create("first", lease_for("shared").identity("first"))
        .await;
    env.wait_phase("first", Phase::Held, SOON).await;
    env.create("second", lease_for("shared").identity("second"))
        .await;
    env.create("third", lease_for("shared").identity("third"))
        .await;
    let second = env.wait_phase("second", Phase::Pending, SOON).await;
    env.wait_phase("third", Phase::Pending, SOON).await;
    assert_eq!(
        summary(&env.api().get("first").await.unwrap()).0,
        Some(Phase::Held)
    );
    assert_eq!(second.status.unwrap().holder, None);

    // The default lease lives 90s: getting it within seconds proves the waiter
    // was woken by the release, not by expiry or polling.
    env.delete("first").await;
    let second = env
        .wait_phase("second", Phase::Held, Duration::from_secs(10))
        .await;
    assert_eq!(
        summary(&second),
        (Some(Phase::Held), Some("second".into()), Some(2))
    );
    let third = env.api().get("third").await.unwrap();
    assert_eq!(
        summary(&third).0,
        Some(Phase::Pending),
        "third waits behind second"
    );

    env.delete("second").await;
    let third = env
        .wait_phase("third", Phase::Held, Duration::from_secs(10))
        .await;
    assert_eq!(summary(&third).2, Some(3));
}

#[tokio::test]
async fn a_waiter_gets_the_target_when_an_outside_holder_lets_go() {
    let env = OperatorEnv::start("outside").await;
    let store = env.store().await;
    let target = Target::new(&env.ns, "external");
    let outside = env
        .hold_outside(&store, &target, "cron", Duration::from_secs(60))
        .await;
    let lease = outside.lease.unwrap();
    env.create("waiter", lease_for("external").identity("waiter"))
        .await;
    let pending = env.wait_reason("waiter", "TargetHeld", SOON).await;
    assert_eq!(summary(&pending).0, Some(Phase::Pending));
    let held = condition(&pending, "Held").unwrap();
    assert_eq!(held.reason, "TargetHeld");
    assert!(held.message.contains("cron"), "{}", held.message);

    // The outside holder releases long before its 60s expiry: the waiter is woken.
    let released = store
        .release(&ReleaseRequest::new(
            target.clone(),
            lease.handle().unwrap(),
        ))
        .await
        .unwrap();
    assert_eq!(released.outcome, Outcome::Released);
    let tl = env
        .wait_phase("waiter", Phase::Held, Duration::from_secs(10))
        .await;
    assert_eq!(summary(&tl).2, Some(2));
}

#[tokio::test]
async fn a_waiter_retries_when_an_outside_lease_expires() {
    let env = OperatorEnv::start("outside-expiry").await;
    let store = env.store().await;
    let target = Target::new(&env.ns, "external");
    env.hold_outside(&store, &target, "cron", Duration::from_secs(4))
        .await;
    env.create("next", lease_for("external").identity("next"))
        .await;
    env.wait_phase("next", Phase::Pending, SOON).await;
    // Expiry publishes nothing; the waiter retries right after the holder's expiry.
    let tl = env
        .wait_phase("next", Phase::Held, Duration::from_secs(10))
        .await;
    assert_eq!(summary(&tl).2, Some(2));
}

#[tokio::test]
async fn a_restarted_operator_re_adopts_leases_without_new_tokens_or_status_writes() {
    let mut env = OperatorEnv::start("restart").await;
    env.create(
        "job",
        lease_for("t").identity("job").durations("30s", "10s"),
    )
    .await;
    let before = env.wait_phase("job", Phase::Held, SOON).await;
    let store = env.store().await;
    let target = Target::new(&env.ns, "t");
    let valkey_before = store.get(&target).await.unwrap().lease.unwrap();

    env.kill_operator(0);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    env.start_operator();
    // The new process renews at once (it has no memory of the last renewal).
    let renewed = support::kube_env::eventually("the new operator to renew", SOON, || {
        let store = &store;
        let target = &target;
        let floor = valkey_before.expires_at_ms;
        async move {
            let l = store.get(target).await.ok()?.lease?;
            (l.expires_at_ms > floor).then_some(l)
        }
    })
    .await;
    assert_eq!(
        renewed.fencing_token, valkey_before.fencing_token,
        "no new token"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = env.api().get("job").await.unwrap();
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "re-adoption wrote no status"
    );
    assert_eq!(summary(&after), summary(&before));
}

#[tokio::test]
async fn tokens_keep_increasing_after_valkey_forgets_everything() {
    let env = OperatorEnv::start("flush").await;
    env.create("job", lease_for("t").identity("job").durations("6s", "1s"))
        .await;
    let held = env.wait_phase("job", Phase::Held, SOON).await;
    assert_eq!(summary(&held).2, Some(1));

    env.valkey.conn().cmd(&["FLUSHALL"]);
    // The next renewal finds nothing; the operator reacquires above the published token.
    let again = env
        .wait_for("job", "Held with token 2", SOON, |tl| {
            summary(tl) == (Some(Phase::Held), Some("job".into()), Some(2))
        })
        .await;
    assert_eq!(summary(&again).2, Some(2));

    // A deleted lease leaves its token behind in the floor ConfigMap.
    env.delete("job").await;
    env.wait_gone("job", SOON).await;
    env.valkey.conn().cmd(&["FLUSHALL"]);
    env.create("next", lease_for("t").identity("next")).await;
    let next = env.wait_phase("next", Phase::Held, SOON).await;
    assert_eq!(
        summary(&next).2,
        Some(3),
        "token above every token published before"
    );
}

#[tokio::test]
async fn valkey_down_sets_a_condition_and_recovers() {
    let mut env = OperatorEnv::start("down").await;
    env.create("job", lease_for("t").identity("job").durations("6s", "1s"))
        .await;
    env.wait_phase("job", Phase::Held, SOON).await;
    env.valkey.kill();
    let down = env
        .wait_for("job", "BackendAvailable=False", SOON, |tl| {
            tl.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "BackendAvailable" && c.status == "False")
            })
        })
        .await;
    assert_ne!(summary(&down).0, Some(Phase::Error));
    env.valkey.restart();
    // The restarted server lost everything (no persistence): a new lease, a larger token.
    let back = env
        .wait_for(
            "job",
            "Held again with BackendAvailable=True",
            Duration::from_secs(40),
            |tl| {
                tl.status.as_ref().is_some_and(|s| {
                    s.phase == Some(Phase::Held)
                        && s.fencing_token == Some(2)
                        && s.conditions
                            .iter()
                            .any(|c| c.type_ == "BackendAvailable" && c.status == "True")
                })
            },
        )
        .await;
    assert_eq!(summary(&back).1.as_deref(), Some("job"));
}
