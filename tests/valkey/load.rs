//! The client under load, against a real server behind the fault proxy: a
//! missed deadline costs one request, never the connection; a full
//! connection refuses at once; shared calls spread over `--pool-size`
//! connections; durable writes reuse warm connections.

use crate::support::fault_proxy;
use crate::support::valkey_server;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::resp::Resp;
use fault_proxy::FaultProxy;
use targetlease::store::valkey::{Durability, ValkeyConfig, ValkeyStore};
use targetlease::store::{AcquireRequest, LeaseStore, Outcome, StoreError, Target};
use valkey_server::ValkeyServer;

const TTL: Duration = Duration::from_secs(60);

fn target(name: &str) -> Target {
    Target::new("load", name)
}

/// An acquire of target `name` by `owner`, in a task of its own: (name,
/// owner, its result).
type Spawned = tokio::task::JoinHandle<(
    String,
    String,
    Result<targetlease::store::Reply, StoreError>,
)>;

fn spawn_acquire(store: &Arc<ValkeyStore>, name: String, owner: String) -> Spawned {
    let store = store.clone();
    tokio::spawn(async move {
        let got = store
            .acquire(&AcquireRequest::new(target(&name), &owner, TTL))
            .await;
        (name, owner, got)
    })
}

/// A server, a fault proxy in front of it, and a store through the proxy
/// whose first connection is open.
async fn warm_behind_a_proxy(timeout: Duration) -> (ValkeyServer, FaultProxy, ValkeyStore) {
    let server = ValkeyServer::start();
    let proxy = FaultProxy::start(&server.addr());
    let store = ValkeyStore::connect(&config(proxy.url(), timeout))
        .await
        .unwrap();
    store.get(&target("warm")).await.unwrap();
    (server, proxy, store)
}

fn config(url: String, timeout: Duration) -> ValkeyConfig {
    ValkeyConfig {
        url,
        timeout,
        connect_timeout: Duration::from_secs(2),
        ..ValkeyConfig::default()
    }
}

/// Runs `f`, failing the test (instead of hanging it) past `limit`.
async fn within<T>(limit: Duration, what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or_else(|_| panic!("{what} took longer than {limit:?}"))
}

/// Waits until the proxy has caught the command its `hold_reply` names.
async fn until_caught(proxy: &FaultProxy) {
    within(Duration::from_secs(5), "the held command", async {
        while !proxy.hold_caught() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// An acquire that must come back `Acquired` with its own lease, token 1.
fn assert_own_lease(name: &str, owner: &str, got: Result<targetlease::store::Reply, StoreError>) {
    let reply = got.unwrap_or_else(|e| panic!("{name}: {e:?}"));
    assert_eq!(reply.outcome, Outcome::Acquired, "{name}: {reply:?}");
    let lease = reply.lease.expect("an acquired lease");
    assert_eq!(lease.target, name, "{name} got another call's reply");
    assert_eq!(lease.owner, owner, "{name} got another call's reply");
    assert_eq!(lease.fencing_token, 1, "{name}");
}

/// The promise: "one slow reply costs one request, never a shared
/// connection". One acquire's reply is held past its deadline while 999 more
/// are pipelined behind it on the same connection: the held one is
/// `outcome_unknown`, the 999 get their own answers once the reply is let
/// go (it is read and dropped in its place), and nothing reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_reply_held_past_its_deadline_costs_one_request_not_the_connection() {
    const TIMEOUT: Duration = Duration::from_secs(3);
    let server = ValkeyServer::start();
    let proxy = FaultProxy::start(&server.addr());
    let store = Arc::new(
        ValkeyStore::connect(&config(proxy.url(), TIMEOUT))
            .await
            .unwrap(),
    );
    store.get(&target("warm")).await.unwrap();
    let opened = store.connections_opened();
    let accepted = proxy.accepted();
    assert_eq!(opened, 1, "one shared connection (pool size 1)");

    proxy.hold_reply("FCALL");
    let held = AcquireRequest::new(target("held"), "held-owner", TTL);
    let first = {
        let (store, req) = (store.clone(), held.clone());
        tokio::spawn(async move { store.acquire(&req).await })
    };
    until_caught(&proxy).await;
    let started = Instant::now();
    // Sent a second after the held one: 1,000 calls in flight at once, the
    // 999 with time left when the held reply is let go.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rest: Vec<_> = (1..1000)
        .map(|i| spawn_acquire(&store, format!("w{i}"), format!("owner-{i}")))
        .collect();
    let got = within(TIMEOUT + Duration::from_secs(2), "the held call", first)
        .await
        .unwrap();
    assert!(
        matches!(got, Err(StoreError::OutcomeUnknown(_))),
        "the held call: {got:?}"
    );
    assert!(
        started.elapsed() < TIMEOUT + Duration::from_millis(500),
        "answered at its deadline, took {:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.release();
    for task in rest {
        let (name, owner, got) = within(Duration::from_secs(10), "the 999", task)
            .await
            .unwrap();
        assert_own_lease(&name, &owner, got);
    }
    assert_eq!(store.connections_opened(), opened, "nothing reconnected");
    assert_eq!(proxy.accepted(), accepted, "nothing reconnected");
    // The held acquire ran once: its retry is the same lease, token 1.
    let retry = store.acquire(&held).await;
    assert_own_lease("held", "held-owner", retry);
    assert_eq!(server.calls("fcall"), 1000 + 1, "every call ran once");
    assert_eq!(store.connections_opened(), opened);
}

/// `--max-in-flight`: with the connection full (its oldest reply held),
/// one more call is refused at once, `backend_unavailable` "never sent",
/// and does not run; the calls let in all get their answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_connection_refuses_at_once_and_sends_nothing() {
    const TIMEOUT: Duration = Duration::from_secs(5);
    let server = ValkeyServer::start();
    let proxy = FaultProxy::start(&server.addr());
    let store = Arc::new(
        ValkeyStore::connect(&ValkeyConfig {
            max_in_flight: 8,
            ..config(proxy.url(), TIMEOUT)
        })
        .await
        .unwrap(),
    );
    store.get(&target("warm")).await.unwrap();
    let before = server.calls("fcall");
    proxy.hold_reply("FCALL");
    let call = |i: usize| {
        let store = store.clone();
        tokio::spawn(async move {
            let (name, owner) = (format!("f{i}"), format!("owner-{i}"));
            let started = Instant::now();
            let got = store
                .acquire(&AcquireRequest::new(target(&name), &owner, TTL))
                .await;
            (name, owner, got, started.elapsed())
        })
    };
    let first = call(0);
    until_caught(&proxy).await;
    let rest: Vec<_> = (1..20).map(call).collect();
    let mut waiting = vec![first];
    let mut refused = 0;
    for task in rest {
        // A refusal comes at once; an admitted call waits for the release.
        tokio::time::sleep(Duration::from_millis(20)).await;
        if task.is_finished() {
            let (name, _, got, took) = task.await.unwrap();
            match got {
                Err(StoreError::BackendUnavailable(m)) => {
                    assert!(m.contains("in flight") && m.contains("never sent"), "{m}");
                    assert!(
                        took < Duration::from_secs(1),
                        "{name}: refused after {took:?}"
                    );
                    let key = store.keys().target(&target(&name));
                    assert!(
                        matches!(
                            server.conn().cmd(&["HGET", &key, "fence"]),
                            Resp::Bulk(None)
                        ),
                        "{name} was refused but ran"
                    );
                    refused += 1;
                }
                other => panic!("{name}: {other:?}"),
            }
        } else {
            waiting.push(task);
        }
    }
    assert_eq!(waiting.len(), 8, "admitted: the bound");
    assert_eq!(refused, 12);
    proxy.release();
    for task in waiting {
        let (name, owner, got, _) = within(TIMEOUT, "admitted calls", task).await.unwrap();
        assert_own_lease(&name, &owner, got);
    }
    assert_eq!(server.calls("fcall") - before, 8, "only the admitted ran");
    assert_eq!(store.connections_opened(), 1);
}

/// `--pool-size 4` at 64 concurrent calls: the calls spread over four
/// connections (each one carries a share), never more than four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_spread_over_pool_size_connections() {
    let server = ValkeyServer::start();
    let proxy = FaultProxy::start(&server.addr());
    let store = Arc::new(
        ValkeyStore::connect(&ValkeyConfig {
            pool_size: 4,
            ..config(proxy.url(), Duration::from_secs(5))
        })
        .await
        .unwrap(),
    );
    // Replies take a while: every connection stays busy.
    proxy.set(fault_proxy::Fault::Delay(Duration::from_millis(20)));
    for round in 0..5 {
        let calls: Vec<_> = (0..64)
            .map(|i| spawn_acquire(&store, format!("p{round}-{i}"), format!("o{i}")))
            .collect();
        for c in calls {
            let (name, owner, got) = within(Duration::from_secs(10), "a round", c).await.unwrap();
            assert_own_lease(&name, &owner, got);
        }
    }
    assert_eq!(store.connections_opened(), 4, "pool-size connections");
    assert_eq!(proxy.accepted(), 4);
    let shares = proxy.forwarded_per_connection("FCALL");
    assert_eq!(shares.len(), 4, "{shares:?}");
    for n in &shares {
        assert!(
            *n >= 20,
            "every connection carries a share of 320 calls: {shares:?}"
        );
    }
}

/// Durable writes (script + `WAITAOF` on the connection that wrote) take a
/// connection each, and give it back warm: after the first round, a steady
/// durable workload opens no connection at all — also when more callers
/// than `--durable-pool-size` want one at once (they wait their turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_writes_reuse_warm_connections() {
    let server = ValkeyServer::start_with(&["--appendonly", "yes"]);
    let store = Arc::new(
        ValkeyStore::connect(&ValkeyConfig {
            durability: Durability::Aof,
            durable_pool_size: 4,
            ..config(server.url(), Duration::from_secs(5))
        })
        .await
        .unwrap(),
    );
    let round = |r: usize, concurrency: usize| {
        let calls: Vec<_> = (0..concurrency)
            .map(|i| spawn_acquire(&store, format!("d{r}-{i}"), format!("o{i}")))
            .collect::<Vec<_>>();
        async move {
            for c in calls {
                let (name, owner, got) =
                    within(Duration::from_secs(10), "a round", c).await.unwrap();
                assert_own_lease(&name, &owner, got);
            }
        }
    };
    // Warm-up: twelve callers at once, three times, fill the durable pool
    // (four callers at once may not: on a loaded machine one can be done
    // before the last one starts, and a later round would open the fourth).
    for r in 0..3 {
        round(r, 12).await;
    }
    let warm = store.connections_opened();
    assert_eq!(warm, 1 + 4, "one shared and four durable connections");
    for r in 3..=27 {
        round(r, 4).await;
    }
    assert_eq!(
        store.connections_opened(),
        warm,
        "100 durable acquires after warm-up opened connections"
    );
    // Twelve callers at once for four connections: they queue, nothing opens.
    for r in 28..=32 {
        round(r, 12).await;
    }
    assert!(
        store.connections_opened() <= 1 + 4,
        "more than the durable pool size open: {}",
        store.connections_opened()
    );
}

/// A reply that goes missing (no TCP connection loses bytes, a broken
/// middlebox might) is caught at the next missed deadline: the marker
/// written behind the late call comes back in that call's place, so the
/// connection is out of step and closed at once, not reused; the call that
/// waited behind the marker was never written, and goes on a new connection
/// with its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_reply_is_caught_and_never_shifts_answers() {
    const TIMEOUT: Duration = Duration::from_secs(1);
    let (_server, proxy, store) = warm_behind_a_proxy(TIMEOUT).await;
    proxy.drop_reply("FCALL");
    let lost = AcquireRequest::new(target("lost"), "lost-owner", TTL);
    let got = within(
        TIMEOUT * 3,
        "the call whose reply vanished",
        store.acquire(&lost),
    )
    .await;
    assert!(matches!(got, Err(StoreError::OutcomeUnknown(_))), "{got:?}");
    let started = Instant::now();
    let next = within(
        TIMEOUT * 3,
        "the next call",
        store.acquire(&AcquireRequest::new(target("next"), "next-owner", TTL)),
    )
    .await;
    assert_own_lease("next", "next-owner", next);
    assert!(
        started.elapsed() < Duration::from_millis(600),
        "the stream out of step was noticed at the marker, not after the grace: {:?}",
        started.elapsed()
    );
    assert_eq!(
        proxy.accepted(),
        2,
        "the connection out of step was replaced"
    );
    // The vanished call ran once: its retry is the same lease.
    assert_own_lease("lost", "lost-owner", store.acquire(&lost).await);
}

/// A call still waiting for its turn when its deadline passes is a definite
/// refusal (`backend_unavailable`, "never sent") and never runs: behind a
/// call that went late, new calls wait (not written) until the marker shows
/// the stream in step, and one whose deadline comes first is taken back.
/// The marker's echo then comes back in place: the connection stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_deadline_before_its_turn_is_never_sent() {
    // The grace past a missed deadline is at least 1s: longer than a call.
    const TIMEOUT: Duration = Duration::from_millis(500);
    let (server, proxy, store) = warm_behind_a_proxy(TIMEOUT).await;
    let before = server.calls("fcall");
    proxy.hold_reply("FCALL");
    let late = AcquireRequest::new(target("late"), "late-owner", TTL);
    let got = within(TIMEOUT * 4, "the held call", store.acquire(&late)).await;
    assert!(matches!(got, Err(StoreError::OutcomeUnknown(_))), "{got:?}");
    let waiting = within(
        TIMEOUT * 4,
        "the call behind the marker",
        store.acquire(&AcquireRequest::new(target("waiting"), "w", TTL)),
    )
    .await;
    match waiting {
        Err(StoreError::BackendUnavailable(m)) => assert!(m.contains("never sent"), "{m}"),
        other => panic!("expected a definite refusal, got {other:?}"),
    }
    // Let the held reply (and the marker's echo behind it) go, within the grace.
    proxy.release();
    let next = within(
        TIMEOUT * 4,
        "a call after the marker",
        store.acquire(&AcquireRequest::new(target("next"), "next-owner", TTL)),
    )
    .await;
    assert_own_lease("next", "next-owner", next);
    let key = store.keys().target(&target("waiting"));
    assert!(
        matches!(
            server.conn().cmd(&["HGET", &key, "fence"]),
            Resp::Bulk(None)
        ),
        "the refused call ran"
    );
    assert_eq!(
        server.calls("fcall") - before,
        2,
        "the late call and the next"
    );
    assert_eq!(store.connections_opened(), 1, "the connection stayed");
    assert_eq!(proxy.accepted(), 1);
}

/// docs/valkey.md: the grace past a missed deadline is the call's own
/// `--timeout` (at least 1s). A server that is slow but healthy, answering
/// after the deadline and within that grace, keeps its connection: the
/// marker comes back in step and nothing reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_late_by_less_than_the_grace_keeps_the_connection() {
    const TIMEOUT: Duration = Duration::from_secs(2);
    let (_server, proxy, store) = warm_behind_a_proxy(TIMEOUT).await;
    let (opened, accepted) = (store.connections_opened(), proxy.accepted());
    proxy.hold_reply("FCALL");
    let slow = AcquireRequest::new(target("slow"), "slow-owner", TTL);
    let started = Instant::now();
    let got = within(TIMEOUT * 2, "the held call", store.acquire(&slow)).await;
    assert!(matches!(got, Err(StoreError::OutcomeUnknown(_))), "{got:?}");
    // Past the deadline by 1.5s: beyond the 1s floor, within the call's 2s.
    tokio::time::sleep((TIMEOUT + Duration::from_millis(1500)).saturating_sub(started.elapsed()))
        .await;
    proxy.release();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_own_lease("slow", "slow-owner", store.acquire(&slow).await);
    assert_eq!(store.connections_opened(), opened, "nothing reconnected");
    assert_eq!(proxy.accepted(), accepted, "nothing reconnected");
}
