//! Token floors, maxLifetime rotation, invalid selectors, and the two writes of a new lease.

use super::*;

/// A namespace's floors live in its own ConfigMap
/// (`targetlease-token-floors.<namespace>`); entries are kept (a write never
/// drops one, live TargetLease or not).
#[tokio::test]
async fn token_floors_are_kept_in_the_namespaces_own_configmap() {
    let env = OperatorEnv::start("floors").await;
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(env.client.clone(), &env.ns);
    env.create("old", lease_for("old").identity("old")).await;
    let tl = env.wait_phase("old", Phase::Held, SOON).await;
    assert_eq!(summary(&tl).2, Some(1));

    // Another target of the namespace: deleting it keeps old's entry,
    // though a live TargetLease's status covers it.
    env.delete("old").await;
    env.wait_gone("old", SOON).await;
    let entry = targetlease::operator::floor::floor_key(&env.ns, "old");
    let floors = || async {
        cms.list(&ListParams::default().labels("targetlease.dev/token-floors"))
            .await
            .unwrap()
            .items
    };
    let floor_of = |cms: &[ConfigMap], key: &str| {
        cms.iter()
            .filter_map(|cm| cm.data.as_ref())
            .find(|d| d.contains_key(key))
            .map(|d| targetlease::operator::floor::ledger::floor_in(d, key))
    };
    assert_eq!(floor_of(&floors().await, &entry), Some(1));
    env.create("old-again", lease_for("old").identity("again"))
        .await;
    let again = env.wait_phase("old-again", Phase::Held, SOON).await;
    assert_eq!(summary(&again).2, Some(2));
    env.create(
        "p",
        json!({ "target": "partner", "holder": { "identity": "p" } }),
    )
    .await;
    env.wait_phase("p", Phase::Held, SOON).await;
    env.delete("p").await;
    env.wait_gone("p", SOON).await;
    let now = floors().await;
    assert_eq!(
        floor_of(&now, &entry),
        Some(1),
        "the entry stays, covered by a live status or not"
    );
    let partner = targetlease::operator::floor::floor_key(&env.ns, "partner");
    assert_eq!(floor_of(&now, &partner), Some(1));
    let names: Vec<_> = now.iter().map(|cm| cm.name_any()).collect();
    assert_eq!(
        names,
        [format!("targetlease-token-floors.{}", env.ns)],
        "one ConfigMap for the namespace"
    );
}

/// MaxLifetime rotates the lease with its own reason, and status
/// never shows Held past Valkey's expiry; an invalid selector is SpecValid=False.
#[tokio::test]
async fn max_lifetime_rotates_and_invalid_selectors_are_reported() {
    let env = OperatorEnv::start("rotate").await;
    let history = History::record(&env);
    env.create(
        "rot",
        lease_for("t")
            .identity("rot")
            .durations("3s", "1s")
            .max_lifetime("5s"),
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

    // An unknown operator is refused at admission (operator::admission); an
    // `In` without values passes the schema and is the operator's to report.
    env.create(
        "bad",
        json!({ "target": "b", "candidates": { "podSelector": {
            "matchExpressions": [{ "key": "app", "operator": "In" }] } } }),
    )
    .await;
    let bad = env.wait_phase("bad", Phase::Error, SOON).await;
    let valid = condition(&bad, "SpecValid").unwrap();
    assert_eq!(
        (valid.status.as_str(), valid.reason.as_str()),
        ("False", "InvalidSpec")
    );
    assert!(
        valid.message.contains("spec.candidates.podSelector"),
        "{}",
        valid.message
    );
}

/// A new lease costs two writes before it is Held (the finalizer and the Held
/// status): its first attempt id derives from the resource's UID, so a crash
/// between the acquire and the status write still replays the same lease.
#[tokio::test]
async fn a_new_lease_is_held_after_two_writes_and_its_first_acquire_replays() {
    let mut env = OperatorEnv::start_without_operator("two-writes").await;
    let history = History::record(&env);
    let created = env.create("job", lease_for("t").identity("job")).await;
    // What a crashed operator left behind: the first acquire went through,
    // its status write did not.
    let attempt = format!("first-{}", created.uid().unwrap());
    let mut req = env.operator_acquire("job", "t", &attempt, Duration::from_secs(90));
    req.request_id = env.lease_id_key().request_id(&attempt);
    let store = env.store().await;
    assert_eq!(
        store.acquire(&req).await.unwrap().outcome,
        Outcome::Acquired
    );

    env.start_operator();
    let held = env.wait_phase("job", Phase::Held, SOON).await;
    assert_eq!(summary(&held).2, Some(1), "the same lease, replayed");
    assert_eq!(held.status.unwrap().acquisition_id, Some(attempt));
    env.create("fresh", lease_for("u").identity("fresh")).await;
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
