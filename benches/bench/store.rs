//! Item 1: store throughput and latency through our Rust client against a
//! real valkey-server, and `redis-benchmark` against the same server in the
//! same run (PING, SET NX PX, EVALSHA of a minimal acquire script).
//!
//! Both sides are closed-loop: N clients, each with one request in flight
//! (redis-benchmark `-P 1`, one connection per client; ours, N tasks sharing a
//! fred pool). Both load generators are single-threaded.

use std::future::Future;
use std::process::Command;
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
use crate::support::valkey_server::ValkeyServer;

/// The minimal acquire script redis-benchmark runs: EXISTS, INCR, SET PX.
pub const MINIMAL_ACQUIRE: &str = "if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end \
local t = redis.call('INCR', KEYS[2]) \
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) \
return t";

const TTL: Duration = Duration::from_secs(120);
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
}

/// One row: (operation, concurrency, figure).
pub type Row = (String, usize, Figure);

/// Everything item 1 measured.
pub struct Results {
    pub server_version: String,
    pub pool_size: usize,
    pub ours: Vec<Row>,
    pub baseline: Vec<Row>,
    /// (pool size, operation, figure) at the highest concurrency.
    pub pool_sweep: Vec<(usize, String, Figure)>,
    pub failures: usize,
}

impl Results {
    pub fn ours(&self, op: &str, c: usize) -> Option<&Figure> {
        find(&self.ours, op, c)
    }
    pub fn baseline(&self, op: &str, c: usize) -> Option<&Figure> {
        find(&self.baseline, op, c)
    }
}

fn find<'a>(rows: &'a [Row], op: &str, c: usize) -> Option<&'a Figure> {
    rows.iter()
        .find(|(o, cc, _)| o == op && *cc == c)
        .map(|(_, _, f)| f)
}

/// Runs `ops` operations from `concurrency` closed-loop clients; `op(client, i)`
/// returns whether the outcome was the expected one.
async fn drive<F, Fut>(concurrency: usize, ops: usize, failures: &AtomicUsize, op: F) -> Figure
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

async fn connect(server: &ValkeyServer, pool_size: usize) -> ValkeyStore {
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

/// Runs redis-benchmark against the server; parses its CSV line.
fn redis_benchmark(server: &ValkeyServer, c: usize, n: usize, command: &[&str]) -> Figure {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &server.port.to_string()])
        .args(["-c", &c.to_string(), "-n", &n.to_string()])
        .args(["-P", "1", "-r", "100000000", "--csv"])
        .args(command)
        .output()
        .expect("run redis-benchmark (apt redis-tools)");
    assert!(
        out.status.success(),
        "redis-benchmark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let line = text
        .lines()
        .rfind(|l| !l.starts_with("\"test\"") && !l.trim().is_empty())
        .unwrap_or_else(|| panic!("no CSV line from redis-benchmark: {text}"));
    let cols: Vec<f64> = line
        .split("\",\"")
        .skip(1)
        .map(|s| s.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    Figure {
        ops: n,
        ops_per_sec: cols[0],
        p50_us: cols[3] * 1e3,
        p99_us: cols[5] * 1e3,
        server_us: None,
        server_cmds: None,
    }
}

fn cli(server: &ValkeyServer, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &server.port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli (apt redis-tools)");
    assert!(out.status.success(), "redis-cli {args:?} failed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Server time per top-level call since the last `CONFIG RESETSTAT`: EVALSHA
/// when scripts ran (commands inside a script are counted inside it), else the
/// most called command.
fn server_time(server: &ValkeyServer) -> (Option<f64>, Option<f64>) {
    let stats = cli(server, &["INFO", "commandstats"]);
    let mut rows: Vec<(String, f64, f64)> = stats
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |k: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(k))
                    .and_then(|v| v.parse::<f64>().ok())
            };
            Some((name.to_string(), field("calls=")?, field("usec_per_call=")?))
        })
        .filter(|(name, _, _)| name != "config" && name != "info")
        .collect();
    if let Some(script) = rows.iter().find(|(n, _, _)| n == "evalsha") {
        let inner: f64 = rows
            .iter()
            .filter(|(n, _, _)| n != "evalsha")
            .map(|r| r.1)
            .sum();
        return (Some(script.2), Some(inner / script.1.max(1.0)));
    }
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    (rows.first().map(|r| r.2), Some(1.0))
}

/// Runs `cell` with fresh server statistics and attaches the server time per call.
async fn with_server_time<F: Future<Output = Figure>>(server: &ValkeyServer, cell: F) -> Figure {
    cli(server, &["CONFIG", "RESETSTAT"]);
    let mut fig = cell.await;
    (fig.server_us, fig.server_cmds) = server_time(server);
    fig
}

/// Item 1, start to end, on a fresh server.
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
    let mut pool_sweep = Vec::new();
    rt.block_on(async {
        let store = connect(&server, p.pool_size).await;
        // Warm up both sides (connections, script cache, allocator).
        redis_benchmark(&server, 16, 5_000, &["PING"]);
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
                ("EVALSHA minimal acquire", &acquire_cmd[..]),
            ] {
                cli(&server, &["CONFIG", "RESETSTAT"]);
                let mut fig = redis_benchmark(&server, c, n, cmd);
                (fig.server_us, fig.server_cmds) = server_time(&server);
                baseline.push((name.to_string(), c, fig));
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
    Results {
        server_version,
        pool_size: p.pool_size,
        ours,
        baseline,
        pool_sweep,
        failures: failures.into_inner(),
    }
}
