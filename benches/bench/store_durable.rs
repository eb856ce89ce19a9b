//! Durable writes and their connections: `--durability replicas:1` against
//! a real primary + replica pair, 10,000 acquires at concurrency 64 per
//! durable pool size, counting the connections the client opens (each
//! durable write runs its script and its `WAIT` on a connection of its own,
//! taken from a pool of warm ones).

use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use targetlease::store::valkey::{Durability, ValkeyConfig, ValkeyStore};
use targetlease::store::{AcquireRequest, LeaseStore, Outcome, Target};

use crate::stats::Figure;
use crate::store::drive;
use crate::store_script::cli;
use crate::support::valkey_server::ValkeyServer;

const TTL: Duration = Duration::from_secs(120);

/// One durable pool size's cell.
pub struct Durable {
    /// `--durable-pool-size`.
    pub pool: usize,
    pub concurrency: usize,
    pub ops: usize,
    pub fig: Figure,
    /// Connections opened by the warm-up (1,000 acquires).
    pub warm_opened: u64,
    /// Connections opened by the measured acquires.
    pub opened: u64,
}

/// Starts a replica of `primary` and waits until it is in sync.
fn replica_of(primary: &ValkeyServer) -> ValkeyServer {
    let replica =
        ValkeyServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = cli(primary, &["INFO", "replication"]);
        if info.lines().any(|l| l.trim() == "connected_slaves:1")
            && cli(&replica, &["INFO", "replication"])
                .lines()
                .any(|l| l.trim() == "master_link_status:up")
        {
            return replica;
        }
        assert!(Instant::now() < deadline, "bench replica never synced");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every durable pool size in `pools`, `ops` acquires each at `concurrency`.
pub fn run(
    pools: &[usize],
    concurrency: usize,
    ops: usize,
    failures: &AtomicUsize,
) -> Vec<Durable> {
    let primary = ValkeyServer::start();
    let _replica = replica_of(&primary);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut out = Vec::new();
    for &pool in pools {
        eprintln!("bench: durable acquires, durable pool size {pool} at concurrency {concurrency}");
        rt.block_on(async {
            let store = ValkeyStore::connect(&ValkeyConfig {
                url: primary.url(),
                durability: Durability::Replicas(1),
                durable_pool_size: pool,
                timeout: Duration::from_secs(5),
                ..ValkeyConfig::default()
            })
            .await
            .expect("connect the store to the bench primary");
            let cell = |tag: &'static str, n: usize| {
                let store = &store;
                drive(concurrency, n, failures, move |_, i| async move {
                    let t = Target::new("bench-durable", format!("{tag}-{pool}-{i}"));
                    matches!(
                        store.acquire(&AcquireRequest::new(t, "bench-owner", TTL)).await,
                        Ok(r) if r.outcome == Outcome::Acquired
                    )
                })
            };
            let before = store.connections_opened();
            cell("warm", 1_000).await;
            let warm = store.connections_opened();
            let fig = cell("main", ops).await;
            out.push(Durable {
                pool,
                concurrency,
                ops,
                fig,
                warm_opened: warm - before,
                opened: store.connections_opened() - warm,
            });
            store.close().await;
        });
    }
    out
}
