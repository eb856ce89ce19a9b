//! What the store tells its caller when the connection breaks, through a
//! fault-injecting proxy in front of a real server: every call is sent at
//! most once, a call whose reply was lost is `outcome_unknown` (never a
//! refusal, never `backend_unavailable`), durability is only confirmed on the
//! connection that wrote, and every call ends within its deadline.

use crate::support::fault_proxy;
use crate::support::valkey_server;

use std::future::Future;
use std::time::{Duration, Instant};

use fault_proxy::{Fault, FaultProxy};
use targetlease::store::valkey::{Durability, ValkeyConfig, ValkeyStore};
use targetlease::store::{
    AcquireRequest, LeaseStore, Outcome, Reply, RevokeRequest, StoreError, Target,
};
use valkey_server::ValkeyServer;

const TTL: Duration = Duration::from_secs(60);
const TIMEOUT: Duration = Duration::from_millis(1000);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);
/// Scheduling slack on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(1500);

fn config(url: String) -> ValkeyConfig {
    ValkeyConfig {
        url,
        timeout: TIMEOUT,
        connect_timeout: CONNECT_TIMEOUT,
        ..ValkeyConfig::default()
    }
}

async fn through(proxy: &FaultProxy) -> ValkeyStore {
    ValkeyStore::connect(&config(proxy.url()))
        .await
        .expect("connect through the proxy")
}

async fn direct(server: &ValkeyServer) -> ValkeyStore {
    ValkeyStore::connect(&config(server.url()))
        .await
        .expect("connect to the server")
}

fn target(name: &str) -> Target {
    Target::new("broken", name)
}

/// A fresh server, a fault proxy in front of it, and a store connected
/// through the proxy.
async fn behind_proxy() -> (ValkeyServer, FaultProxy, ValkeyStore) {
    let server = ValkeyServer::start();
    let proxy = FaultProxy::start(&server.addr());
    let store = through(&proxy).await;
    (server, proxy, store)
}

/// Runs `f`, failing the test (instead of hanging it) if it takes longer than `limit`.
async fn within<T>(limit: Duration, what: &str, f: impl Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    match tokio::time::timeout(limit + Duration::from_secs(10), f).await {
        Ok(v) => {
            let took = started.elapsed();
            assert!(took <= limit, "{what} took {took:?}, more than {limit:?}");
            (v, took)
        }
        Err(_) => panic!("{what} hung (over {limit:?} + 10s)"),
    }
}

fn assert_unknown(result: &Result<Reply, StoreError>, what: &str) {
    assert!(
        matches!(result, Err(StoreError::OutcomeUnknown(_))),
        "{what}: a call whose reply was lost must be outcome_unknown, got {result:?}"
    );
}

#[tokio::test]
async fn a_lost_revoke_reply_is_unknown_and_the_revoke_ran_once() {
    let (server, proxy, store) = behind_proxy().await;
    let admin = direct(&server).await;
    let t = target("revoke");
    let a = admin
        .acquire(&AcquireRequest::new(t.clone(), "alice", TTL))
        .await
        .unwrap();
    assert_eq!(a.outcome, Outcome::Acquired);

    proxy.cut_before_reply("FCALL");
    let revoked = store
        .revoke(&RevokeRequest {
            ..RevokeRequest::new(t.clone())
        })
        .await;
    assert_unknown(&revoked, "revoke");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(proxy.forwarded("FCALL"), 1, "sent at most once");
    assert_eq!(admin.get(&t).await.unwrap().outcome, Outcome::NotFound);
}

#[tokio::test]
async fn a_refusal_of_a_resent_copy_is_never_reported_when_the_first_copy_ran() {
    let (server, proxy, store) = behind_proxy().await;
    let admin = direct(&server).await;
    let t = target("readonly-after-cut");
    let req = AcquireRequest::new(t.clone(), "alice", TTL);

    // The first copy runs and its reply is lost; any later copy is refused as
    // a replica would refuse it after a failover.
    proxy.cut_before_reply("FCALL");
    proxy.refuse(
        "FCALL",
        "READONLY You can't write against a read only replica.",
        10,
    );
    let got = store.acquire(&req).await;
    assert_unknown(&got, "acquire");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(proxy.forwarded("FCALL"), 1, "sent at most once");
    let seen = admin.get(&t).await.unwrap();
    assert_eq!(seen.outcome, Outcome::Found, "the first copy did acquire");
    // The caller resolves it with the same request id: the same lease, one token.
    let replay = admin.acquire(&req).await.unwrap();
    assert_eq!(replay.outcome, Outcome::Acquired);
    assert_eq!(replay.lease.unwrap().fencing_token, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durability_is_never_confirmed_on_a_connection_that_did_not_write() {
    let primary = ValkeyServer::start();
    let replica =
        ValkeyServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !primary
        .conn()
        .cmd(&["INFO", "replication"])
        .text()
        .contains("state=online")
    {
        assert!(Instant::now() < deadline, "replica never connected");
        std::thread::sleep(Duration::from_millis(50));
    }
    let proxy = FaultProxy::start(&primary.addr());
    let store = ValkeyStore::connect(&ValkeyConfig {
        durability: Durability::Replicas(1),
        ..config(proxy.url())
    })
    .await
    .unwrap();
    // The replica stays connected but acknowledges nothing: a WAIT on the
    // connection that wrote cannot be satisfied, a WAIT on a fresh one is at once.
    replica.freeze(true);
    proxy.cut_after_reply("FCALL");
    let got = store
        .acquire(&AcquireRequest::new(target("durable"), "alice", TTL))
        .await;
    replica.freeze(false);
    assert_unknown(&got, "acquire with durability replicas:1");
    if let Err(StoreError::OutcomeUnknown(msg)) = &got {
        assert!(msg.contains("durability"), "{msg}");
    }
}

#[tokio::test]
async fn connecting_to_a_silent_server_ends_within_the_connect_timeout() {
    let silent = FaultProxy::silent();
    let (got, _) = within(CONNECT_TIMEOUT + SLACK, "connect", async {
        ValkeyStore::connect(&config(silent.url())).await
    })
    .await;
    match got {
        Err(StoreError::BackendUnavailable(msg)) => {
            assert!(!msg.contains("Os {"), "plain message: {msg}")
        }
        other => panic!("expected backend_unavailable, got {:?}", other.err()),
    }
    assert!(silent.accepted() >= 1, "it did reach the listener");
}

#[tokio::test]
async fn a_server_that_goes_silent_is_bounded_per_call_and_recovers() {
    let (_server, proxy, store) = behind_proxy().await;
    let t = target("silent-later");
    proxy.set(Fault::Silent);
    let (got, _) = within(TIMEOUT + SLACK, "get", store.get(&t)).await;
    assert!(
        matches!(got, Err(StoreError::BackendUnavailable(_))),
        "a read with no reply: {got:?}"
    );
    let req = AcquireRequest::new(t.clone(), "alice", TTL);
    let (got, _) = within(
        TIMEOUT + CONNECT_TIMEOUT + SLACK,
        "acquire",
        store.acquire(&req),
    )
    .await;
    assert!(
        matches!(
            got,
            Err(StoreError::OutcomeUnknown(_) | StoreError::BackendUnavailable(_))
        ),
        "a write with no reply: {got:?}"
    );
    proxy.set(Fault::Pass);
    let deadline = Instant::now() + Duration::from_secs(10);
    let r = loop {
        match store.acquire(&req).await {
            Ok(r) => break r,
            Err(e) if Instant::now() < deadline => {
                eprintln!("waiting: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("never recovered: {e}"),
        }
    };
    assert_eq!(r.outcome, Outcome::Acquired);
}

#[tokio::test]
async fn dropped_replies_never_shift_later_replies_onto_other_calls() {
    let (_server, proxy, store) = behind_proxy().await;
    let t = target("dropped");
    let req = AcquireRequest::new(t.clone(), "alice", TTL);
    proxy.set(Fault::DropReplies(Duration::from_millis(1500)));
    let (got, _) = within(TIMEOUT + SLACK, "acquire", store.acquire(&req)).await;
    assert_unknown(&got, "acquire with its reply dropped");
    tokio::time::sleep(Duration::from_millis(700)).await;
    // Every later call gets its own reply.
    for _ in 0..3 {
        let (got, _) = within(TIMEOUT + CONNECT_TIMEOUT + SLACK, "get", store.get(&t)).await;
        let got = got.expect("get after the drop");
        assert_eq!(got.outcome, Outcome::Found, "{got:?}");
        assert_eq!(got.lease.unwrap().owner, "alice");
    }
    let replay = store.acquire(&req).await.unwrap();
    assert_eq!(replay.outcome, Outcome::Acquired);
    assert_eq!(replay.lease.unwrap().fencing_token, 1);
}

#[tokio::test]
async fn late_replies_are_unknown_within_the_deadline_and_the_retry_resolves_them() {
    let (_server, proxy, store) = behind_proxy().await;
    let t = target("late");
    let req = AcquireRequest::new(t.clone(), "alice", TTL);
    proxy.set(Fault::Delay(TIMEOUT + Duration::from_millis(500)));
    let (got, _) = within(TIMEOUT + SLACK, "acquire", store.acquire(&req)).await;
    assert_unknown(&got, "a late reply");
    proxy.set(Fault::Pass);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let replay = store.acquire(&req).await.unwrap();
    assert_eq!(replay.outcome, Outcome::Acquired);
    assert_eq!(replay.lease.unwrap().fencing_token, 1, "one token");
}

#[tokio::test]
async fn reset_connections_fail_definitely_until_the_network_heals() {
    let (server, proxy, store) = behind_proxy().await;
    let t = target("reset");
    proxy.set(Fault::Reset);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (got, _) = within(TIMEOUT + CONNECT_TIMEOUT + SLACK, "get", store.get(&t)).await;
    assert!(
        matches!(got, Err(StoreError::BackendUnavailable(_))),
        "{got:?}"
    );
    let before = server.calls("fcall");
    let (got, _) = within(
        TIMEOUT + CONNECT_TIMEOUT + SLACK,
        "acquire",
        store.acquire(&AcquireRequest::new(t.clone(), "alice", TTL)),
    )
    .await;
    assert!(
        matches!(got, Err(StoreError::BackendUnavailable(_))),
        "nothing could be sent: {got:?}"
    );
    assert_eq!(server.calls("fcall"), before, "nothing ran");
    proxy.set(Fault::Pass);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.get(&t).await {
            Ok(r) => {
                assert_eq!(r.outcome, Outcome::NotFound);
                break;
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("waiting: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("never recovered: {e}"),
        }
    }
}

#[tokio::test]
async fn release_events_survive_a_broken_subscription() {
    use futures::StreamExt;
    let server = ValkeyServer::start();
    let proxy = FaultProxy::start(&server.addr());
    let store = direct(&server).await;
    let mut events = targetlease::store::valkey::notices::release_notices(&config(proxy.url()))
        .await
        .expect("subscribe");
    let free = |name: &'static str| {
        let store = &store;
        async move {
            let t = target(name);
            let l = store
                .acquire(&AcquireRequest::new(t.clone(), "a", TTL))
                .await
                .unwrap()
                .lease
                .unwrap();
            store
                .release(&targetlease::store::ReleaseRequest::new(
                    t,
                    l.handle().unwrap(),
                ))
                .await
                .unwrap();
        }
    };
    free("ev-1").await;
    let got = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("an event in time");
    assert_eq!(got, Some(target("ev-1")));

    // The subscription is cut; it comes back by itself.
    proxy.set(Fault::Reset);
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set(Fault::Pass);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        free("ev-2").await;
        match tokio::time::timeout(Duration::from_millis(500), events.next()).await {
            Ok(Some(t)) if t == target("ev-2") => break,
            Ok(other) => panic!("unexpected {other:?}"),
            Err(_) => assert!(Instant::now() < deadline, "never resubscribed"),
        }
    }
}

#[tokio::test]
async fn a_lost_reply_to_the_library_load_is_definite_to_the_call_after_it_or_the_wait_unknown() {
    // With an append-only file, so the wait itself would succeed.
    let server = ValkeyServer::start_with(&["--appendonly", "yes"]);
    let proxy = FaultProxy::start(&server.addr());
    let store = through(&proxy).await;
    let admin = direct(&server).await;

    // The library is lost; the call that finds it missing loads it, and the
    // load's reply is lost: the acquire itself never ran.
    server.conn().cmd(&["FUNCTION", "FLUSH"]);
    let loads = proxy.forwarded("FUNCTION LOAD"); // the connect's
    proxy.cut_before_reply("FUNCTION LOAD");
    let req = AcquireRequest::new(target("load-cut"), "alice", TTL);
    let got = store.acquire(&req).await;
    assert!(
        matches!(&got, Err(StoreError::BackendUnavailable(why)) if why.contains("loading them")),
        "the acquire never ran: a definite failure, got {got:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        proxy.forwarded("FCALL"),
        1,
        "the call that found it missing"
    );
    assert_eq!(
        proxy.forwarded("FUNCTION LOAD"),
        loads + 1,
        "the library went once"
    );
    let key = store.keys().target(&target("load-cut"));
    assert_eq!(
        server.conn().cmd(&["EXISTS", &key]).int(),
        0,
        "nothing written"
    );

    // The call sent again after the load loses its reply: it ran, unknown.
    proxy.refuse("FCALL", "ERR Function not found", 1);
    proxy.cut_before_reply("FCALL");
    let req = AcquireRequest::new(target("call-cut"), "alice", TTL);
    let got = store.acquire(&req).await;
    assert_unknown(&got, "acquire whose call after the load lost its reply");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(proxy.forwarded("FUNCTION LOAD"), loads + 2);
    assert_eq!(proxy.forwarded("FCALL"), 2, "sent once after the load");
    let key = store.keys().target(&target("call-cut"));
    assert_eq!(server.conn().cmd(&["EXISTS", &key]).int(), 1, "it ran");
    let again = admin.acquire(&req).await.unwrap();
    assert_eq!(again.outcome, Outcome::Acquired);
    assert_eq!(
        again.lease.unwrap().fencing_token,
        1,
        "the same grant, replayed"
    );

    // The durability wait's own reply is lost.
    let durable = ValkeyStore::connect(&ValkeyConfig {
        durability: Durability::Aof,
        ..config(proxy.url())
    })
    .await
    .unwrap();
    proxy.cut_before_reply("WAITAOF");
    let got = durable
        .acquire(&AcquireRequest::new(target("wait-cut"), "alice", TTL))
        .await;
    assert_unknown(&got, "acquire whose WAITAOF reply was lost");
    if let Err(StoreError::OutcomeUnknown(msg)) = &got {
        assert!(msg.contains("durability"), "{msg}");
    }
    assert_eq!(proxy.forwarded("WAITAOF"), 1, "the wait went once");
    // Without the cut, the same wait confirms.
    let ok = durable
        .acquire(&AcquireRequest::new(target("wait-ok"), "alice", TTL))
        .await
        .expect("aof durability confirmed");
    assert_eq!(ok.outcome, Outcome::Acquired);
}
