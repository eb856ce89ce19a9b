//! `--durability` against a real primary + replica pair and a real AOF:
//! a lease is only reported held once the configured durability holds.

use crate::support::valkey_server;

use std::time::{Duration, Instant};

use targetlease::store::valkey::{Durability, ValkeyConfig, ValkeyStore};
use targetlease::store::{AcquireRequest, LeaseStore, Outcome, RenewRequest, StoreError, Target};
use valkey_server::ValkeyServer;

const TTL: Duration = Duration::from_secs(60);

async fn store(server: &ValkeyServer, durability: Durability) -> ValkeyStore {
    ValkeyStore::connect(&ValkeyConfig {
        url: server.url(),
        durability,
        timeout: Duration::from_millis(1000),
        ..ValkeyConfig::default()
    })
    .await
    .expect("connect")
}

fn info(server: &ValkeyServer, field: &str) -> String {
    let text = server.conn().cmd(&["INFO", "replication"]).text();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default()
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn pair() -> (ValkeyServer, ValkeyServer) {
    let primary = ValkeyServer::start();
    let replica =
        ValkeyServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    wait_for("the replica to sync", || {
        info(&replica, "master_link_status") == "up" && info(&primary, "connected_slaves") == "1"
    });
    (primary, replica)
}

fn not_safe(result: Result<targetlease::store::Reply, StoreError>) -> String {
    match result {
        Err(StoreError::OutcomeUnknown(msg)) => {
            assert!(msg.contains("durability"), "{msg}");
            msg
        }
        other => panic!("must not be reported as held safely: {other:?}"),
    }
}

#[tokio::test]
async fn replicas_mode_reports_a_lease_only_once_a_replica_has_it() {
    let (primary, mut replica) = pair();
    let s = store(&primary, Durability::Replicas(1)).await;

    // Replica up: acquire and renew are acknowledged.
    let t = Target::new("durable", "a");
    let r = s
        .acquire(&AcquireRequest::new(t.clone(), "alice", TTL))
        .await
        .expect("acquire with a live replica");
    assert_eq!(r.outcome, Outcome::Acquired);
    let holder = r.lease.unwrap().handle().unwrap();
    let r = s
        .renew(&RenewRequest::new(t.clone(), holder.clone(), TTL))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Renewed);

    // Replica gone: the primary grants, but the store does not call it held.
    replica.kill();
    let t2 = Target::new("durable", "b");
    let req = AcquireRequest::new(t2.clone(), "bob", TTL);
    not_safe(s.acquire(&req).await);
    not_safe(s.acquire(&req).await);
    not_safe(s.renew(&RenewRequest::new(t, holder, TTL)).await);
    // It may well exist on the primary: that is why it is unknown, not refused.
    assert_eq!(s.get(&t2).await.unwrap().outcome, Outcome::Found);
    // Refusals and reads never wait.
    let held = s
        .acquire(&AcquireRequest::new(t2.clone(), "carol", TTL))
        .await
        .unwrap();
    assert_eq!(held.outcome, Outcome::Held);

    // Replica back: the same request id now reports the one lease it created.
    replica.restart();
    wait_for("the replica to resync", || {
        info(&primary, "connected_slaves") == "1"
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    let r = loop {
        match s.acquire(&req).await {
            Ok(r) => break r,
            Err(e) if Instant::now() < deadline => {
                eprintln!("waiting: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("never became durable: {e}"),
        }
    };
    assert_eq!(r.outcome, Outcome::Acquired);
    assert_eq!(
        r.lease.unwrap().fencing_token,
        1,
        "one token for one request"
    );
}

#[tokio::test]
async fn more_replicas_than_exist_is_never_safe() {
    let (primary, _replica) = pair();
    let s = store(&primary, Durability::Replicas(2)).await;
    not_safe(
        s.acquire(&AcquireRequest::new(Target::new("durable", "c"), "a", TTL))
            .await,
    );
}

#[tokio::test]
async fn aof_mode_needs_the_append_only_file() {
    let with_aof = ValkeyServer::start_with(&["--appendonly", "yes"]);
    let s = store(&with_aof, Durability::Aof).await;
    let r = s
        .acquire(&AcquireRequest::new(Target::new("durable", "d"), "a", TTL))
        .await
        .expect("acquire with aof");
    assert_eq!(r.outcome, Outcome::Acquired);

    let without = ValkeyServer::start();
    let s = store(&without, Durability::Aof).await;
    not_safe(
        s.acquire(&AcquireRequest::new(Target::new("durable", "d"), "a", TTL))
            .await,
    );
}

/// A replay that returns its cached success must itself be a write, or a WAIT
/// on a fresh connection would not cover the original write.
#[tokio::test]
async fn a_successful_replay_is_a_write_so_its_wait_covers_the_original() {
    // The offset only moves once a replica has made the primary keep a backlog.
    let (server, _replica) = pair();
    let s = store(&server, Durability::Replicas(1)).await;
    let offset = || info(&server, "master_repl_offset").parse::<u64>().unwrap();
    let t = Target::new("durable", "replay");
    let req = AcquireRequest::new(t.clone(), "alice", TTL);
    let lease = s.acquire(&req).await.unwrap().lease.unwrap();
    let renew = RenewRequest::new(t.clone(), lease.handle().unwrap(), TTL);
    s.renew(&renew).await.unwrap();

    let before = offset();
    let again = s.acquire(&req).await.unwrap();
    assert_eq!(again.lease.unwrap().fencing_token, lease.fencing_token);
    let after_acquire = offset();
    assert!(after_acquire > before, "an acquire replay writes");
    assert_eq!(s.renew(&renew).await.unwrap().outcome, Outcome::Renewed);
    assert!(offset() > after_acquire, "a renew replay writes");
}
