//! When Valkey refuses writes (a full server with `noeviction`, too few
//! replicas for `min-replicas-to-write`), a lease can still be looked at and,
//! where Valkey allows any write, freed: `get` is read-only, `release` and
//! `revoke` run under OOM. What cannot run is refused definitely.

use crate::support::valkey_server;

use std::time::Duration;

use crate::{assert_refused, fill_memory};
use targetlease::store::valkey::{ValkeyConfig, ValkeyStore};
use targetlease::store::{
    AcquireRequest, LeaseHandle, LeaseStore, Outcome, ReleaseRequest, RevokeRequest, Target,
};
use valkey_server::ValkeyServer;

const TTL: Duration = Duration::from_secs(60);

async fn connect(server: &ValkeyServer) -> ValkeyStore {
    ValkeyStore::connect(&ValkeyConfig {
        url: server.url(),
        timeout: Duration::from_millis(1500),
        ..ValkeyConfig::default()
    })
    .await
    .expect("connect to the test server")
}

fn target(name: &str) -> Target {
    Target::new("failures", name)
}

/// Alice's lease on `name` and a second target Bob holds, for the
/// read-and-free tests below.
async fn two_leases(store: &ValkeyStore, name: &str) -> (Target, LeaseHandle, Target) {
    let t = target(name);
    let alice = store
        .acquire(&AcquireRequest::new(t.clone(), "alice", TTL))
        .await
        .unwrap()
        .lease
        .unwrap()
        .handle()
        .unwrap();
    let other = target(&format!("{name}-other"));
    store
        .acquire(&AcquireRequest::new(other.clone(), "bob", TTL))
        .await
        .unwrap();
    (t, alice, other)
}

#[tokio::test]
async fn a_full_server_still_answers_get_release_and_revoke() {
    let server = ValkeyServer::start();
    let store = connect(&server).await;
    let (t, alice, other) = two_leases(&store, "full").await;
    fill_memory(&server);
    let got = store.get(&t).await.expect("get on a full server");
    assert_eq!(got.outcome, Outcome::Found);
    let read = store.read(&t, "k").await.expect("read on a full server");
    assert_eq!(read.outcome, Outcome::NotFound);
    let released = store
        .release(&ReleaseRequest::new(t.clone(), alice))
        .await
        .expect("release on a full server");
    assert_eq!(released.outcome, Outcome::Released);
    let revoked = store
        .revoke(&RevokeRequest::new(other.clone()))
        .await
        .expect("revoke on a full server");
    assert_eq!(revoked.outcome, Outcome::Revoked);
    assert_eq!(store.get(&other).await.unwrap().outcome, Outcome::NotFound);
    // Taking a lease still needs memory: a definite refusal.
    assert_refused(
        store.acquire(&AcquireRequest::new(t, "carol", TTL)).await,
        "OOM",
    );
}

#[tokio::test]
async fn unmet_min_replicas_still_answers_get_and_refuses_writes_definitely() {
    let server = ValkeyServer::start();
    let store = connect(&server).await;
    let (t, alice, other) = two_leases(&store, "min-replicas").await;
    server
        .conn()
        .cmd(&["CONFIG", "SET", "min-replicas-to-write", "1"]);
    let (ran, rejected) = (
        server.calls("fcall"),
        server.command_stat("fcall", "rejected_calls"),
    );
    let got = store.get(&t).await.expect("get with too few replicas");
    assert_eq!(got.outcome, Outcome::Found);
    let read = store
        .read(&t, "k")
        .await
        .expect("read with too few replicas");
    assert_eq!(read.outcome, Outcome::NotFound);
    // Freeing writes, and Valkey refuses every write before it runs: definite.
    assert_refused(
        store.release(&ReleaseRequest::new(t.clone(), alice)).await,
        "NOREPLICAS",
    );
    assert_refused(
        store.revoke(&RevokeRequest::new(other.clone())).await,
        "NOREPLICAS",
    );
    assert_refused(
        store
            .acquire(&AcquireRequest::new(target("mr-new"), "c", TTL))
            .await,
        "NOREPLICAS",
    );
    assert_eq!(server.calls("fcall"), ran, "none ran");
    assert_eq!(
        server.command_stat("fcall", "rejected_calls"),
        rejected + 3,
        "each sent once, and refused"
    );
    server
        .conn()
        .cmd(&["CONFIG", "SET", "min-replicas-to-write", "0"]);
    assert_eq!(
        store.get(&t).await.unwrap().outcome,
        Outcome::Found,
        "nothing ran"
    );
    assert_eq!(
        store.get(&other).await.unwrap().outcome,
        Outcome::Found,
        "nothing ran"
    );
}
