//! The store part: throughput and latency through our Rust client against a
//! real valkey-server, and `redis-benchmark` against the same server in the
//! same run (PING, SET NX PX, EVALSHA of a minimal acquire script).
//!
//! Both sides are closed-loop: N clients, each with one request in flight
//! (redis-benchmark `-P 1`, one connection per client; ours, N tasks sharing a
//! pool of our own RESP client). Both load generators are single-threaded.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::future::join_all;
use targetlease::store::valkey::{ValkeyConfig, ValkeyStore};
use targetlease::store::{
    AcquireRequest, CommitRequest, LeaseHandle, LeaseStore, Outcome, ReleaseRequest, RenewRequest,
    Target,
};

use crate::stats::Figure;
use crate::store_script::{self, MINIMAL_ACQUIRE, cli, measured, server_time};
use crate::support::valkey_server::ValkeyServer;

const TTL: Duration = Duration::from_millis(store_script::TTL_MS);
const NAMESPACE: &str = "bench";

/// What to run.
pub struct Params {
    pub concurrencies: Vec<usize>,
    /// Operations per cell at concurrency > 1.
    pub ops: usize,
    /// Operations per cell at concurrency 1.
    pub ops_single: usize,
    /// Pool size of the main table.
    pub pool_size: usize,
    /// Pool sizes tried at the highest concurrency.
    pub pool_sweep: Vec<usize>,
    /// Durable pool sizes tried with durable acquires at the highest concurrency.
    pub durable_pools: Vec<usize>,
    /// Durable acquires per durable pool size.
    pub durable_ops: usize,
}

/// The name of the minimal acquire script's row in `baseline`.
pub const MINIMAL: &str = "EVALSHA minimal acquire";
/// Our operations, in report order.
pub const OPS: [&str; 4] = ["acquire", "renew", "release", "commit"];

/// One row: (operation, concurrency, figure).
pub type Row = (String, usize, Figure);

/// Everything the store part measured.
pub struct Results {
    pub server_version: String,
    pub pool_size: usize,
    pub ours: Vec<Row>,
    /// PING, SET NX PX and the minimal acquire script under redis-benchmark.
    pub baseline: Vec<Row>,
    /// Our own scripts under redis-benchmark (operation names as in `ours`).
    pub script: Vec<Row>,
    /// (operation, concurrency, share of redis-benchmark calls that did the work).
    pub script_work: Vec<(String, usize, f64)>,
    /// (pool size, operation, figure) at the highest concurrency.
    pub pool_sweep: Vec<(usize, String, Figure)>,
    /// Durable acquires per durable pool size, with the connections they opened.
    pub durable: Vec<crate::store_durable::Durable>,
    pub failures: usize,
}

impl Results {
    pub fn ours(&self, op: &str, c: usize) -> Option<&Figure> {
        find(&self.ours, op, c)
    }
    pub fn baseline(&self, op: &str, c: usize) -> Option<&Figure> {
        find(&self.baseline, op, c)
    }
    pub fn script(&self, op: &str, c: usize) -> Option<&Figure> {
        find(&self.script, op, c)
    }
    pub fn minimal(&self, c: usize) -> Option<&Figure> {
        self.baseline(MINIMAL, c)
    }
}

fn find<'a>(rows: &'a [Row], op: &str, c: usize) -> Option<&'a Figure> {
    rows.iter()
        .find(|(o, cc, _)| o == op && *cc == c)
        .map(|(_, _, f)| f)
}

/// Runs `ops` operations from `concurrency` closed-loop clients; `op(client, i)`
/// returns whether the outcome was the expected one.
pub(crate) async fn drive<F, Fut>(
    concurrency: usize,
    ops: usize,
    failures: &AtomicUsize,
    op: F,
) -> Figure
where
    F: Fn(usize, usize) -> Fut,
    Fut: Future<Output = bool>,
{
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let clients = (0..concurrency).map(|client| {
        let (next, op) = (&next, &op);
        async move {
            let mut lat = Vec::with_capacity(ops / concurrency + 1);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ops {
                    break;
                }
                let t = Instant::now();
                if !op(client, i).await {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                lat.push(t.elapsed());
            }
            lat
        }
    });
    let samples: Vec<Duration> = join_all(clients).await.into_iter().flatten().collect();
    Figure::from_samples(samples, start.elapsed())
}

pub(crate) async fn connect(server: &ValkeyServer, pool_size: usize) -> ValkeyStore {
    ValkeyStore::connect(&ValkeyConfig {
        url: server.url(),
        pool_size,
        ..ValkeyConfig::default()
    })
    .await
    .expect("connect the store to the bench valkey-server")
}

/// Acquires one lease per target (sequentially), returning the holders.
async fn hold(store: &ValkeyStore, targets: &[Target]) -> Vec<LeaseHandle> {
    let mut holders = Vec::with_capacity(targets.len());
    for t in targets {
        let reply = store
            .acquire(&AcquireRequest::new(t.clone(), "bench-owner", TTL))
            .await
            .expect("setup acquire");
        holders.push(
            reply
                .lease
                .and_then(|l| l.handle())
                .expect("setup acquire granted"),
        );
    }
    holders
}

/// Acquire (fresh targets), renew, release and commit at one concurrency.
async fn ours_at(
    server: &ValkeyServer,
    store: &ValkeyStore,
    tag: &str,
    c: usize,
    ops: usize,
    failures: &AtomicUsize,
    only: &[&str],
) -> Vec<(String, Figure)> {
    let mut out = Vec::new();
    let wants = |op: &str| only.is_empty() || only.contains(&op);

    // acquire: every operation on a target never used before
    let fresh: Vec<Target> = (0..ops)
        .map(|i| Target::new(NAMESPACE, format!("acq-{tag}-{c}-{i}")))
        .collect();
    let holders: Mutex<Vec<Option<LeaseHandle>>> = Mutex::new(vec![None; ops]);
    if wants("acquire") || wants("release") {
        let fig = with_server_time(
            server,
            drive(c, ops, failures, |_, i| {
                let (fresh, holders) = (&fresh, &holders);
                async move {
                    let req = AcquireRequest::new(fresh[i].clone(), "bench-owner", TTL);
                    match store.acquire(&req).await {
                        Ok(r) if r.outcome == Outcome::Acquired => {
                            holders.lock().unwrap()[i] = r.lease.and_then(|l| l.handle());
                            true
                        }
                        _ => false,
                    }
                }
            }),
        )
        .await;
        if wants("acquire") {
            out.push(("acquire".to_string(), fig));
        }
    }

    // renew and commit: each client works its own live lease
    let own: Vec<Target> = (0..c)
        .map(|k| Target::new(NAMESPACE, format!("own-{tag}-{c}-{k}")))
        .collect();
    let own_holders = hold(store, &own).await;
    if wants("renew") {
        let fig =
            with_server_time(
                server,
                drive(c, ops, failures, |k, _| {
                    let req = RenewRequest::new(own[k].clone(), own_holders[k].clone(), TTL);
                    async move {
                        matches!(store.renew(&req).await, Ok(r) if r.outcome == Outcome::Renewed)
                    }
                }),
            )
            .await;
        out.push(("renew".to_string(), fig));
    }

    // release: the leases the acquire cell granted
    if wants("release") {
        let holders = holders.into_inner().unwrap();
        let fig = with_server_time(
            server,
            drive(c, ops, failures, |_, i| {
                let req = holders[i]
                    .clone()
                    .map(|h| ReleaseRequest::new(fresh[i].clone(), h));
                async move {
                    match req {
                        Some(req) => matches!(
                            store.release(&req).await,
                            Ok(r) if r.outcome == Outcome::Released
                        ),
                        None => false,
                    }
                }
            }),
        )
        .await;
        out.push(("release".to_string(), fig));
    }

    if wants("commit") {
        let fig = with_server_time(
            server,
            drive(c, ops, failures, |k, i| {
                let req = CommitRequest::new(
                    own[k].clone(),
                    own_holders[k].token,
                    "offset",
                    format!("v{i}"),
                );
                async move {
                    matches!(store.commit(&req).await, Ok(r) if r.outcome == Outcome::Committed)
                }
            }),
        )
        .await;
        out.push(("commit".to_string(), fig));
    }
    out
}

/// Runs `cell` with fresh server statistics and attaches the server time per call.
async fn with_server_time<F: Future<Output = Figure>>(server: &ValkeyServer, cell: F) -> Figure {
    cli(server, &["CONFIG", "RESETSTAT"]);
    let mut fig = cell.await;
    (fig.server_us, fig.server_cmds) = server_time(server);
    fig
}

/// The store part, start to end, on a fresh server.
pub fn run(p: &Params) -> Results {
    let server = ValkeyServer::start();
    let server_version = cli(&server, &["INFO", "server"])
        .lines()
        .find_map(|l| l.strip_prefix("valkey_version:"))
        .unwrap_or("unknown")
        .trim()
        .to_string();
    let sha = cli(&server, &["SCRIPT", "LOAD", MINIMAL_ACQUIRE]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let failures = AtomicUsize::new(0);
    let mut ours = Vec::new();
    let mut baseline = Vec::new();
    let mut script = Vec::new();
    let mut script_work = Vec::new();
    let mut pool_sweep = Vec::new();
    store_script::prepare(&server);
    rt.block_on(async {
        let store = connect(&server, p.pool_size).await;
        // Warm up both sides (connections, script cache, allocator).
        store_script::redis_benchmark(&server, 16, 5_000, 1, &["PING"]);
        ours_at(&server, &store, "warm", 16, 2_000, &failures, &[]).await;
        for &c in &p.concurrencies {
            let n = if c == 1 { p.ops_single } else { p.ops };
            eprintln!("bench: store at concurrency {c} ({n} ops per cell)");
            let acquire_cmd = [
                "EVALSHA",
                sha.as_str(),
                "2",
                "bl:{__rand_int__}:lease",
                "bl:{__rand_int__}:fence",
                "owner",
                "120000",
            ];
            for (name, cmd) in [
                ("PING", &["PING"][..]),
                (
                    "SET NX PX",
                    &["SET", "sl:__rand_int__", "v", "NX", "PX", "120000"][..],
                ),
                (MINIMAL, &acquire_cmd[..]),
            ] {
                let fig = measured(&server, c, n, 100_000_000, cmd);
                baseline.push((name.to_string(), c, fig));
            }
            for op in OPS {
                // release consumes its leases: half the calls, on 4× as many leases.
                let calls = if op == "release" { n / 2 } else { n };
                let (fig, work) = store_script::ours_by_redis_benchmark(&server, op, c, calls);
                script.push((op.to_string(), c, fig));
                script_work.push((op.to_string(), c, work));
            }
            for (op, fig) in ours_at(&server, &store, "main", c, n, &failures, &[]).await {
                ours.push((op, c, fig));
            }
        }
        let top = p.concurrencies.iter().copied().max().unwrap_or(64);
        for &pool in &p.pool_sweep {
            eprintln!("bench: store pool size {pool} at concurrency {top}");
            let store = connect(&server, pool).await;
            let tag = format!("pool{pool}");
            for (op, fig) in ours_at(
                &server,
                &store,
                &tag,
                top,
                p.ops,
                &failures,
                &["acquire", "renew"],
            )
            .await
            {
                pool_sweep.push((pool, op, fig));
            }
        }
    });
    let top = p.concurrencies.iter().copied().max().unwrap_or(64);
    let durable = crate::store_durable::run(&p.durable_pools, top, p.durable_ops, &failures);
    Results {
        durable,
        server_version,
        pool_size: p.pool_size,
        ours,
        baseline,
        script,
        script_work,
        pool_sweep,
        failures: failures.into_inner(),
    }
}

impl Results {
    /// `target/bench/store.json`: per operation and concurrency, our client,
    /// redis-benchmark on our script, the minimal script and PING.
    pub fn json(&self) -> serde_json::Value {
        let mut ops = serde_json::Map::new();
        for op in OPS {
            let mut per_c = serde_json::Map::new();
            for (o, c, ours) in &self.ours {
                if o != op {
                    continue;
                }
                let script = self.script(op, *c);
                let minimal = self.minimal(*c);
                let work = self
                    .script_work
                    .iter()
                    .find(|(o, cc, _)| o == op && cc == c)
                    .map(|w| w.2);
                per_c.insert(
                    c.to_string(),
                    serde_json::json!({
                        "ours_ops_per_sec": ours.ops_per_sec,
                        "script_ops_per_sec": script.map(|f| f.ops_per_sec),
                        "minimal_ops_per_sec": minimal.map(|f| f.ops_per_sec),
                        "server_us_per_call": script.and_then(|f| f.server_us),
                        "minimal_server_us_per_call": minimal.and_then(|f| f.server_us),
                        "p50_us": ours.p50_us,
                        "ping_p50_us": self.baseline("PING", *c).map(|f| f.p50_us),
                        "ours_server_us_per_call": ours.server_us,
                        "server_commands_per_call": script.and_then(|f| f.server_cmds),
                        "script_p50_us": script.map(|f| f.p50_us),
                        "script_calls_doing_the_work": work,
                    }),
                );
            }
            ops.insert(op.to_string(), serde_json::Value::Object(per_c));
        }
        serde_json::json!({
            "valkey_version": self.server_version,
            "pool_size": self.pool_size,
            "failures": self.failures,
            "ops": ops,
        })
    }
}
