//! Valkey Cluster specifics: one slot per target, and leases keep working
//! while the target's slot migrates (ASK during, MOVED after).

use crate::support::cluster;
use crate::support::resp;

use std::time::Duration;

use cluster::Cluster;
use resp::Resp;
use targetlease::store::valkey::{ValkeyConfig, ValkeyStore};
use targetlease::store::{
    AcquireRequest, CommitRequest, LeaseStore, Outcome, ReleaseRequest, RenewRequest, StoreError,
    Target,
};

const TTL: Duration = Duration::from_secs(60);

async fn start() -> (Cluster, ValkeyStore) {
    let cluster = tokio::task::spawn_blocking(Cluster::start).await.unwrap();
    let store = ValkeyStore::connect(&ValkeyConfig {
        url: cluster.url(),
        ..ValkeyConfig::default()
    })
    .await
    .expect("connect to the cluster");
    (cluster, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_of_a_target_is_in_one_slot() {
    let (cluster, store) = start().await;
    let keys = store.keys();
    let mut slots_seen = std::collections::HashSet::new();
    for name in ["a", "b:c", "{x}", "with space", "ünï"] {
        let t = Target::new("ns:1", name);
        let all = [
            keys.lease(&t),
            keys.fence(&t),
            keys.request(&t, "acquire", "owner}", "req{1"),
            keys.commit(&t, "k:}"),
        ];
        let slot = cluster.keyslot(&all[0]);
        for k in &all {
            assert_eq!(cluster.keyslot(k), slot, "{k} left the slot of {}", all[0]);
        }
        slots_seen.insert(slot);
        // And the scripts run there without CROSSSLOT.
        let r = store
            .acquire(&AcquireRequest::new(t.clone(), "o", TTL))
            .await
            .unwrap();
        assert_eq!(r.outcome, Outcome::Acquired);
        let h = r.lease.unwrap().handle().unwrap();
        let c = store
            .commit(&CommitRequest::new(t.clone(), h.token, "k:}", "v"))
            .await
            .unwrap();
        assert_eq!(c.outcome, Outcome::Committed);
    }
    assert!(slots_seen.len() > 1, "targets spread over slots");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_keep_working_while_their_slot_migrates() {
    let (cluster, store) = start().await;
    let t = Target::new("migrate", "t");
    let lease_key = store.keys().lease(&t);
    let slot = cluster.keyslot(&lease_key);
    let src = cluster.owner_of_slot(slot);
    let dst = (src + 1) % 3;
    let (src_id, dst_id) = (cluster.id(src), cluster.id(dst));

    let first = store
        .acquire(&AcquireRequest::new(t.clone(), "alice", TTL))
        .await
        .unwrap();
    assert_eq!(first.outcome, Outcome::Acquired);
    let alice = first.lease.unwrap().handle().unwrap();

    // Start the migration and move every key of the slot: the source now answers ASK.
    let s = slot.to_string();
    let mut dst_conn = cluster.nodes[dst].conn();
    let mut src_conn = cluster.nodes[src].conn();
    assert_eq!(
        dst_conn
            .cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &src_id])
            .text(),
        "OK"
    );
    assert_eq!(
        src_conn
            .cmd(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst_id])
            .text(),
        "OK"
    );
    let keys = match src_conn.cmd(&["CLUSTER", "GETKEYSINSLOT", &s, "1000"]) {
        Resp::Array(Some(keys)) => keys.iter().map(Resp::text).collect::<Vec<_>>(),
        other => panic!("GETKEYSINSLOT: {other:?}"),
    };
    assert!(keys.len() >= 2, "lease, fence and request keys: {keys:?}");
    let port = cluster.nodes[dst].port.to_string();
    let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
    migrate.extend(keys.iter().map(String::as_str));
    assert_eq!(src_conn.cmd(&migrate).text(), "OK");

    // Mid-migration, no answer may be wrong or unknown. The keys have moved,
    // so the source answers ASK and the store asks the destination (ASKING);
    // a script whose keys are split between the nodes gets TRYAGAIN, which
    // the store turns into a bounded, definite refusal (nothing ran). Either
    // way the client must stay usable for the retries after the migration.
    let renew = RenewRequest::new(t.clone(), alice.clone(), TTL);
    let bob = AcquireRequest::new(t.clone(), "bob", TTL);
    let during = [
        store.get(&t).await,
        store.renew(&renew).await,
        store.acquire(&bob).await,
    ];
    for result in during {
        match result {
            Ok(r) => assert!(
                matches!(r.outcome, Outcome::Found | Outcome::Renewed | Outcome::Held),
                "{r:?}"
            ),
            Err(StoreError::BackendUnavailable(_)) => {}
            Err(e) => panic!("a refusal during migration must be definite: {e:?}"),
        }
    }

    // Finish the migration: the source now answers MOVED.
    for i in 0..3 {
        let reply = cluster.nodes[i]
            .conn()
            .cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &dst_id]);
        assert_eq!(reply.text(), "OK");
    }
    assert_eq!(cluster.owner_of_slot(slot), dst);
    // After the migration (MOVED): the same requests, retried, resolve to what is true.
    let r = store
        .renew(&renew)
        .await
        .expect("renew after migration (MOVED)");
    assert_eq!(r.outcome, Outcome::Renewed);
    let r = store.acquire(&bob).await.expect("bob's retry");
    assert_eq!(r.outcome, Outcome::Held, "alice still holds it");
    let r = store
        .release(&ReleaseRequest::new(t.clone(), alice.clone()))
        .await
        .expect("release after migration");
    assert_eq!(r.outcome, Outcome::Released);
    let r = store
        .acquire(&AcquireRequest::new(t.clone(), "bob", TTL))
        .await
        .expect("acquire after migration");
    assert_eq!(r.outcome, Outcome::Acquired);
    assert_eq!(
        r.lease.unwrap().fencing_token,
        alice.token + 1,
        "the counter moved with the slot"
    );
}
