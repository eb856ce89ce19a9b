//! A member that is down (its port refuses connections) while a quorum
//! answers: no call may fail for it. A call routed to a connection that
//! cannot be made was never sent, so the client sends it again, on another
//! member, within the same deadline; only when no member can be reached
//! does the caller see `backend_unavailable`.

use std::time::{Duration, Instant};

use targetlease::store::etcd::{EtcdConfig, EtcdStore};
use targetlease::store::{AcquireRequest, LeaseStore};

use crate::cases::target;
use crate::etcd_cluster::{EtcdCluster, healthy};

/// Calls made with one member down: with one member in three refusing,
/// a client that does not send again fails about a third of them.
const CALLS: usize = 60;
/// One-shot clients (a CLI command each) made with one member down.
const ONE_SHOT: usize = 15;
/// Long enough to outlive the test.
const LEASE_TTL: Duration = Duration::from_secs(30);

/// The cluster with member 0 killed and the other two healthy again (a
/// leader among them), so that only the dead member's refusals can fail
/// a call.
async fn one_member_down() -> EtcdCluster {
    tokio::task::spawn_blocking(|| {
        let mut cluster = EtcdCluster::start();
        cluster.kill(0);
        let others = &cluster.endpoints()[1..];
        let since = Instant::now();
        while !others.iter().all(|e| healthy(e)) {
            assert!(
                since.elapsed() < Duration::from_secs(30),
                "the two members left did not become healthy"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    })
    .await
    .expect("start the etcd cluster")
}

/// Every write needs both members left: a deadline a loaded machine
/// meets, so that only calls the dead member refused can fail.
fn config(cluster: &EtcdCluster) -> EtcdConfig {
    EtcdConfig {
        url: cluster.url(),
        timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
        ..EtcdConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_is_answered_while_one_member_refuses_connections() {
    let cluster = one_member_down().await;
    let store = EtcdStore::connect(&config(&cluster))
        .await
        .expect("connect with one member down");
    let mut failed = Vec::new();
    for i in 0..CALLS {
        let req = AcquireRequest::new(target(&format!("down-{i}")), "owner", LEASE_TTL);
        if let Err(e) = store.acquire(&req).await {
            failed.push(format!("acquire {i}: {e}"));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {CALLS} acquires failed with one member of three down: {failed:?}",
        failed.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_clients_connect_while_one_member_refuses_connections() {
    let cluster = one_member_down().await;
    let t = target("down-one-shot");
    let mut failed = Vec::new();
    for i in 0..ONE_SHOT {
        match EtcdStore::connect(&config(&cluster)).await {
            Ok(store) => {
                if let Err(e) = store.get(&t).await {
                    failed.push(format!("get {i}: {e}"));
                }
            }
            Err(e) => failed.push(format!("connect {i}: {e}")),
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {ONE_SHOT} one-shot clients failed with one member of three down: {failed:?}",
        failed.len()
    );
}
