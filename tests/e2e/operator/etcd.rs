//! The operator with its leases in etcd (`--store-url etcd://…`, a real
//! 3-member cluster of the test's own, not the API server's): a
//! TargetLease is held with a token from etcd's per-target counter, the
//! next one on the target takes over when the first is deleted, and a
//! deleted lease is released in etcd; a TargetLease waiting behind a
//! holder outside Kubernetes is woken by etcd's watch when that holder
//! lets go.

use super::*;
use crate::support::etcd_cluster::EtcdCluster;
use targetlease::store::etcd::{EtcdConfig, EtcdStore};

/// An operator whose store is a 3-member etcd cluster of the test's own,
/// and a client of that cluster. The URL is passed as `--valkey-url`, the
/// flag's older name (the chart passes `--store-url`); the env's own Valkey
/// must stay empty.
async fn on_etcd(name: &str) -> (OperatorEnv, EtcdCluster, EtcdStore) {
    let mut env = OperatorEnv::start_without_operator(name).await;
    let cluster = tokio::task::spawn_blocking(EtcdCluster::start)
        .await
        .expect("start the etcd cluster");
    env.start_operator_on(&cluster.url(), &[]);
    let store = EtcdStore::connect(&EtcdConfig {
        url: cluster.url(),
        ..EtcdConfig::default()
    })
    .await
    .expect("connect to the etcd cluster");
    (env, cluster, store)
}

#[tokio::test]
async fn the_operator_holds_hands_off_and_releases_leases_in_etcd() {
    let (env, _cluster, store) = on_etcd("etcd-store").await;
    let target = Target::new(&env.ns, "db-migration");

    env.create("first", lease_for("db-migration").identity("first"))
        .await;
    let tl = env.wait_phase("first", Phase::Held, SOON).await;
    let st = tl.status.clone().unwrap();
    assert_eq!(st.holder.as_deref(), Some("first"));
    assert_eq!(st.fencing_token, Some(1));
    let got = store.get(&target).await.unwrap();
    assert_eq!(got.outcome, Outcome::Found, "{got:?}");
    let lease = got.lease.unwrap();
    assert_eq!((lease.owner.as_str(), lease.fencing_token), ("first", 1));
    // The published expiry is no later than the holder's deadline in etcd.
    let published = st.expires_at.unwrap().0.as_millisecond() as u64;
    assert!(
        published <= lease.expires_at_ms,
        "published {published}, etcd {}",
        lease.expires_at_ms
    );
    let in_valkey = env.store().await.get(&target).await.unwrap().outcome;
    assert_eq!(in_valkey, Outcome::NotFound, "nothing went to Valkey");

    env.create("second", lease_for("db-migration").identity("second"))
        .await;
    env.wait_phase("second", Phase::Pending, SOON).await;
    // The default lease lives 90 s: the handover within seconds comes from
    // the release, not from the lease running out in etcd.
    env.delete("first").await;
    env.wait_gone("first", SOON).await;
    let second = env
        .wait_phase("second", Phase::Held, Duration::from_secs(10))
        .await;
    assert_eq!(
        summary(&second),
        (Some(Phase::Held), Some("second".into()), Some(2))
    );
    let lease = store.get(&target).await.unwrap().lease.unwrap();
    assert_eq!((lease.owner.as_str(), lease.fencing_token), ("second", 2));

    env.delete("second").await;
    env.wait_gone("second", SOON).await;
    let got = store.get(&target).await.unwrap();
    assert_eq!(
        got.outcome,
        Outcome::NotFound,
        "the finalizer released the lease in etcd: {got:?}"
    );
}

#[tokio::test]
async fn a_waiter_on_etcd_gets_the_target_when_an_outside_holder_lets_go() {
    let (env, _cluster, store) = on_etcd("etcd-outside").await;
    let target = Target::new(&env.ns, "external");
    let outside = env
        .hold_outside(&store, &target, "cron", Duration::from_secs(60))
        .await;
    let lease = outside.lease.unwrap();
    env.create("waiter", lease_for("external").identity("waiter"))
        .await;
    let pending = env.wait_reason("waiter", "TargetHeld", SOON).await;
    assert_eq!(summary(&pending).0, Some(Phase::Pending));

    // Released long before its 60 s expiry and long before the operator's
    // own re-check (30 s): only the watch's notice wakes the waiter in time.
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
