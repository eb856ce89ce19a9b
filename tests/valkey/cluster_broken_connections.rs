//! Valkey Cluster through a fault-injecting proxy: the node serving a
//! target announces the proxy's port, so every call to it crosses the proxy.
//! A copy that may have run is never reported as a definite refusal, and
//! redirections that never ran are.

use crate::support::cluster;
use crate::support::fault_proxy;

use std::time::{Duration, Instant};

use fault_proxy::FaultProxy;
use targetlease::store::valkey::{KeySpace, ValkeyConfig, ValkeyStore};
use targetlease::store::{AcquireRequest, LeaseStore, RenewRequest, Reply, StoreError, Target};

const TTL: Duration = Duration::from_secs(60);
const TIMEOUT: Duration = Duration::from_millis(1000);

fn config(url: String) -> ValkeyConfig {
    ValkeyConfig {
        url,
        timeout: TIMEOUT,
        connect_timeout: Duration::from_millis(1000),
        ..ValkeyConfig::default()
    }
}

fn target(name: &str) -> Target {
    Target::new("broken", name)
}

/// A 3-primary cluster whose node serving `key` is reached only through a proxy
/// (it announces the proxy's port), plus that proxy and the node's index.
fn cluster_with_proxied_owner(
    key_of: impl Fn(&cluster::Cluster) -> String,
) -> (cluster::Cluster, FaultProxy, usize) {
    let c = cluster::Cluster::start();
    let key = key_of(&c);
    let owner = c.owner_of_slot(c.keyslot(&key));
    let proxy = FaultProxy::start(&c.nodes[owner].addr());
    let port = proxy.port().to_string();
    c.nodes[owner]
        .conn()
        .cmd(&["CONFIG", "SET", "cluster-announce-port", &port]);
    let deadline = Instant::now() + Duration::from_secs(20);
    for n in &c.nodes {
        loop {
            let slots = format!("{:?}", n.conn().cmd(&["CLUSTER", "SLOTS"]));
            if slots.contains(&format!("Int({port})")) {
                break;
            }
            assert!(Instant::now() < deadline, "the announced port never spread");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    (c, proxy, owner)
}

/// A cluster whose node owning `t`'s slot is reached through a fault proxy,
/// and a store connected through it.
struct Proxied {
    c: cluster::Cluster,
    proxy: FaultProxy,
    owner: usize,
    slot: u16,
    store: ValkeyStore,
}

async fn proxied(t: &Target) -> Proxied {
    let lease_key = KeySpace::new("targetlease").unwrap().target(t);
    let lk = lease_key.clone();
    let (c, proxy, owner) =
        tokio::task::spawn_blocking(move || cluster_with_proxied_owner(|_| lk.clone()))
            .await
            .unwrap();
    let slot = c.keyslot(&lease_key);
    let store = ValkeyStore::connect(&config(format!("redis-cluster://{}", proxy.addr())))
        .await
        .expect("connect to the cluster through the proxy");
    Proxied {
        c,
        proxy,
        owner,
        slot,
        store,
    }
}

impl Proxied {
    /// FCALL calls the node owning the target's slot has run.
    fn fcall_calls(&self) -> u64 {
        self.c.nodes[self.owner].calls("fcall")
    }

    /// The next 10,000 FCALL through the proxy (more than a call makes
    /// in its timeout, restarting after pauses) are answered with a MOVED
    /// back to the proxy itself, without reaching the node.
    fn redirect_fcall_to_itself(&self) {
        let moved = format!("MOVED {} 127.0.0.1:{}", self.slot, self.proxy.port());
        self.proxy.refuse("FCALL", &moved, 10_000);
    }

    async fn acquire(&self, t: &Target) -> Result<Reply, StoreError> {
        self.store
            .acquire(&AcquireRequest::new(t.clone(), "alice", TTL))
            .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_redirected_resend_after_a_lost_reply_is_unknown() {
    let t = target("cluster-cut");
    let p = proxied(&t).await;
    let before = p.fcall_calls();

    // The first copy runs; any later copy is redirected until the client gives up.
    p.proxy.cut_before_reply("FCALL");
    p.redirect_fcall_to_itself();
    let got = p.acquire(&t).await;
    assert!(
        matches!(got, Err(StoreError::OutcomeUnknown(_))),
        "a copy may have run: outcome_unknown, got {got:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(p.fcall_calls(), before + 1, "ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_redirections_that_never_ran_are_a_definite_refusal() {
    let t = target("cluster-moved-loop");
    let p = proxied(&t).await;
    let before = p.fcall_calls();
    p.redirect_fcall_to_itself();
    let started = Instant::now();
    let got = p.acquire(&t).await;
    assert!(started.elapsed() < TIMEOUT * 2, "{:?}", started.elapsed());
    assert!(
        matches!(&got, Err(StoreError::BackendUnavailable(why))
            if why.contains("too many redirections")),
        "nothing ran: a definite refusal, got {got:?}"
    );
    assert_eq!(p.fcall_calls(), before, "never ran");
}

/// A 3-primary cluster that keeps serving the slots it still covers when a
/// primary is gone (`cluster-require-full-coverage no`), and one target on
/// each primary.
fn partial_cluster() -> (cluster::Cluster, Vec<Target>) {
    let c = cluster::Cluster::start();
    for n in &c.nodes {
        let reply = n
            .conn()
            .cmd(&["CONFIG", "SET", "cluster-require-full-coverage", "no"]);
        assert_eq!(reply.text(), "OK");
    }
    let ks = KeySpace::new("targetlease").unwrap();
    let targets = (0..3)
        .map(|i| {
            (0..)
                .map(|k| target(&format!("shard-{i}-{k}")))
                .find(|t| {
                    let slot = c.keyslot(&ks.target(t));
                    let (from, to) = cluster::RANGES[i];
                    (from..=to).contains(&slot)
                })
                .unwrap()
        })
        .collect();
    (c, targets)
}

/// Targets served by the healthy primaries acquire, renew and read.
async fn healthy_shards_work(store: &ValkeyStore, targets: &[Target]) {
    for t in targets {
        let got = store
            .acquire(&AcquireRequest::new(t.clone(), "alice", TTL))
            .await
            .unwrap_or_else(|e| panic!("acquire {t:?}: {e:?}"));
        assert_eq!(
            got.outcome,
            targetlease::store::Outcome::Acquired,
            "{got:?}"
        );
        let lease = got.lease.unwrap();
        let renewed = store
            .renew(&RenewRequest::new(t.clone(), lease.handle().unwrap(), TTL))
            .await
            .unwrap_or_else(|e| panic!("renew {t:?}: {e:?}"));
        assert_eq!(renewed.outcome, targetlease::store::Outcome::Renewed);
        let read = store
            .get(t)
            .await
            .unwrap_or_else(|e| panic!("get {t:?}: {e:?}"));
        assert_eq!(read.outcome, targetlease::store::Outcome::Found);
        assert_eq!(read.lease.unwrap().fencing_token, lease.fencing_token);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_one_stopped_primary_leaves_the_other_shards_working() {
    let (mut c, targets) = tokio::task::spawn_blocking(partial_cluster).await.unwrap();
    // The first seed of the URL, and the primary of targets[0].
    c.nodes[0].kill();
    let store = ValkeyStore::connect(&config(c.url()))
        .await
        .expect("connecting does not need every primary");
    healthy_shards_work(&store, &targets[1..]).await;
    // The dead shard's target: a definite refusal, nothing ran.
    match store
        .acquire(&AcquireRequest::new(targets[0].clone(), "alice", TTL))
        .await
    {
        Err(StoreError::BackendUnavailable(_)) => {}
        other => panic!("the dead shard: {other:?}"),
    }
    // `targetlease check` keeps the strict form.
    let strict = store.load_scripts().await;
    assert!(
        matches!(&strict, Err(StoreError::BackendUnavailable(m)) if m.contains(&c.nodes[0].addr())),
        "{strict:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_silent_primary_costs_a_share_of_the_deadline() {
    let (c, targets) = tokio::task::spawn_blocking(partial_cluster).await.unwrap();
    // Accepts connections (the kernel does) and answers nothing.
    c.nodes[0].freeze(true);
    let started = Instant::now();
    let connected = ValkeyStore::connect(&config(c.url())).await;
    let took = started.elapsed();
    let store = connected.expect("the first seed's silence is not the whole connect timeout");
    // Its share of the refresh and the preload's timeout, not more.
    assert!(took < Duration::from_millis(2500), "connect took {took:?}");
    healthy_shards_work(&store, &targets[1..]).await;
    c.nodes[0].freeze(false);
}

/// Connections the server has open, the asking one included.
fn connected_clients(node: &crate::support::valkey_server::ValkeyServer) -> usize {
    let info = node.conn().cmd(&["INFO", "clients"]).text();
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_node_that_leaves_the_slot_map_loses_its_connections() {
    let (c, targets) = tokio::task::spawn_blocking(partial_cluster).await.unwrap();
    let store = ValkeyStore::connect(&config(c.url())).await.unwrap();
    healthy_shards_work(&store, &targets[2..]).await;
    assert!(
        connected_clients(&c.nodes[2]) >= 2,
        "the store is connected"
    );

    // Node 2's slots go to node 1: node 2 stays in the cluster, serving nothing.
    let (from, to) = cluster::RANGES[2];
    let (from, to) = (from.to_string(), to.to_string());
    for n in &c.nodes {
        let reply = n.conn().cmd(&["CLUSTER", "DELSLOTSRANGE", &from, &to]);
        assert_eq!(reply.text(), "OK");
    }
    let reply = c.nodes[1]
        .conn()
        .cmd(&["CLUSTER", "ADDSLOTSRANGE", &from, &to]);
    assert_eq!(reply.text(), "OK");
    let moved = Instant::now() + Duration::from_secs(20);
    let slot = c.keyslot(&KeySpace::new("targetlease").unwrap().target(&targets[2]));
    while !c.all_say_owner(slot, 1) {
        assert!(Instant::now() < moved, "the slots did not move");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The store follows (MOVED, then a refresh) and lets node 2's pool go.
    let gone = Instant::now() + Duration::from_secs(15);
    loop {
        let _ = store.get(&targets[2]).await;
        let _ = store.get(&targets[1]).await;
        if connected_clients(&c.nodes[2]) == 1 {
            break;
        }
        assert!(
            Instant::now() < gone,
            "node 2 still has {} connections",
            connected_clients(&c.nodes[2])
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Node 1 answers for the slot now (the record stayed behind on node 2).
    let read = store.get(&targets[2]).await.unwrap();
    assert_eq!(read.outcome, targetlease::store::Outcome::NotFound);
}

/// Promise (docs/valkey.md, Cluster): one stopped primary leaves the rest
/// working — also the health probe (`/readyz`, the operator's server-clock
/// anchor), which asks any primary: with the first of the slot map (the
/// owner of slot 0) gone, the next one answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_health_answers_with_the_slot_0_primary_stopped() {
    let (mut c, targets) = tokio::task::spawn_blocking(partial_cluster).await.unwrap();
    c.nodes[0].kill();
    let store = ValkeyStore::connect(&config(c.url())).await.unwrap();
    healthy_shards_work(&store, &targets[1..]).await;
    let health = store.health().await;
    assert!(health.is_ok(), "two primaries answer, health: {health:?}");
}

/// Promise (docs/valkey.md, Cluster): a primary that goes silent costs the
/// calls to its own shard only: the next call to a healthy shard does not
/// first ask the silent node for the slot map (a share of its deadline: a
/// third of the 3 s timeout here, which a loaded machine's scheduling delays
/// stay well below). Two guards give that, and the test fails only without
/// both: a call that is merely late does not mark the map stale, and a node
/// whose last call failed (a dead-shard call that found its connection
/// closed, say) is asked for the map last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_primary_costs_the_healthy_shards_nothing() {
    let (c, targets) = tokio::task::spawn_blocking(partial_cluster).await.unwrap();
    let store = ValkeyStore::connect(&ValkeyConfig {
        timeout: Duration::from_secs(3),
        ..config(c.url())
    })
    .await
    .unwrap();
    healthy_shards_work(&store, &targets).await;
    c.nodes[0].freeze(true);
    let mut worst = Duration::ZERO;
    let mut failed = 0;
    for _ in 0..5 {
        let dead = store.get(&targets[0]).await;
        assert!(dead.is_err(), "{dead:?}");
        let started = Instant::now();
        if store.get(&targets[1]).await.is_err() {
            failed += 1;
        }
        worst = worst.max(started.elapsed());
    }
    c.nodes[0].freeze(false);
    eprintln!("healthy-shard get after a dead-shard call: worst {worst:?}, {failed} of 5 failed");
    assert!(
        worst < Duration::from_millis(500) && failed == 0,
        "healthy-shard get after a dead-shard call: worst {worst:?}, {failed} of 5 failed"
    );
}

/// One primary answering a transient refusal (`BUSY`: a long script) at
/// connect time is skipped like an unreachable one: its refusal comes at the
/// connection's `PING`, before the preload, so the other shards still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_survives_one_primary_that_is_busy() {
    use std::io::Write;
    let (c, targets) = tokio::task::spawn_blocking(partial_cluster).await.unwrap();
    let busy = &c.nodes[2];
    assert_eq!(
        busy.conn()
            .cmd(&["CONFIG", "SET", "busy-reply-threshold", "100"])
            .text(),
        "OK"
    );
    let mut spin = std::net::TcpStream::connect(busy.addr()).unwrap();
    let body = "local i = 0 while true do i = i + 1 end";
    let eval = format!(
        "*3\r\n$4\r\nEVAL\r\n${}\r\n{body}\r\n$1\r\n0\r\n",
        body.len()
    );
    spin.write_all(eval.as_bytes()).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut probe = busy.conn();
    let answer = probe.cmd(&["PING"]);
    assert!(
        matches!(&answer, crate::support::resp::Resp::Error(e) if e.starts_with("BUSY")),
        "the node is busy: {answer:?}"
    );
    let connected = ValkeyStore::connect(&config(c.url())).await;
    let _ = probe.cmd(&["SCRIPT", "KILL"]);
    let store = connected.expect("one busy primary does not stop the others");
    healthy_shards_work(&store, &targets[..2]).await;
}
