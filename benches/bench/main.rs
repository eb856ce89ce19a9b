//! `cargo bench --bench targetlease`: store throughput against the raw
//! server, reconciler scale, handoff and failover latency, API write cost,
//! CLI waiter wake-up.
//! Starts its own valkey-server and control plane and writes
//! `docs/benchmarks.md`. Run it through `scripts/bench.sh`.
//!
//! A benchmark, not a test: under `cargo test --all-targets` (no `--bench`
//! argument, no `TARGETLEASE_BENCH`) it exits at once without measuring.

mod operator;
mod report;
mod report_analysis;
mod report_memory;
mod report_peer;
mod report_scale;
mod report_store;
mod report_waiters;
mod stats;
mod store;
mod store_durable;
mod store_script;
mod tracker;
mod waiters;

/// The integration tests' fixtures, shared rather than copied.
use targetlease_test_support as support;

use std::time::{Duration, Instant};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn main() {
    let requested =
        std::env::args().any(|a| a == "--bench") || std::env::var_os("TARGETLEASE_BENCH").is_some();
    if !requested {
        eprintln!("targetlease bench: skipped (run scripts/bench.sh, or cargo bench)");
        return;
    }
    let started = Instant::now();
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let _ = rustls::crypto::ring::default_provider().install_default();

    let store = (only.is_empty() || only == "store").then(|| {
        store::run(&store::Params {
            concurrencies: env_list("BENCH_CONCURRENCY", &[1, 16, 64]),
            ops: env_or("BENCH_STORE_OPS", 30_000),
            ops_single: env_or("BENCH_STORE_OPS_SINGLE", 5_000),
            pool_size: env_or("BENCH_POOL", 4),
            pool_sweep: env_list("BENCH_POOL_SWEEP", &[1, 4, 16, 64]),
            durable_pools: env_list("BENCH_DURABLE_POOL_SWEEP", &[4, 16, 64]),
            durable_ops: env_or("BENCH_DURABLE_OPS", 10_000),
        })
    });
    let store_secs = started.elapsed().as_secs_f64();
    if let Some(s) = &store {
        let dir = std::env::var("CARGO_TARGET_DIR")
            .unwrap_or_else(|_| format!("{}/target", env!("CARGO_MANIFEST_DIR")));
        let path = format!("{dir}/bench/store.json");
        let _ = std::fs::create_dir_all(format!("{dir}/bench"));
        let text = serde_json::to_string_pretty(&s.json()).expect("store.json");
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {path}: {e}"));
        eprintln!("bench: wrote {path}");
    }

    let operator = (only.is_empty() || only == "operator").then(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let results = rt.block_on(operator::run(&operator::Params {
            // The last scale's operator is the one the later steps use (steady,
            // restart, handoff, failover, heap): 5,000 leases, run after 10,000.
            scales: env_list("BENCH_SCALES", &[1_000, 10_000, 5_000]),
            steady: Duration::from_secs(env_or("BENCH_STEADY_SECS", 300)),
            curve_leases: env_or("BENCH_CURVE_LEASES", 2_000),
            curve_concurrencies: env_list("BENCH_CURVE_CONCURRENCY", &[4, 16, 64]),
            handoff_trials: env_or("BENCH_HANDOFF_TRIALS", 50),
            failover_trials: env_or("BENCH_FAILOVER_TRIALS", 30),
            create_parallelism: env_or("BENCH_CREATE_PARALLELISM", 64),
            peer_concurrencies: env_list("BENCH_PEER_CONCURRENCY", &[1, 16, 64]),
            peer_cycles: env_or("BENCH_PEER_CYCLES", 10_000),
            peer_cycles_single: env_or("BENCH_PEER_CYCLES_SINGLE", 2_000),
            peer_pool_size: env_or("BENCH_POOL", 4),
            unrelated_pods: env_or("BENCH_UNRELATED_PODS", 10_000),
            steps: std::env::var("BENCH_STEPS")
                .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
                .unwrap_or_else(|_| operator::STEPS.map(String::from).to_vec()),
        }));
        // The watches in the background are not awaited: don't wait for them.
        rt.shutdown_background();
        results
    });

    let waiters = (only.is_empty() || only == "waiters").then(|| {
        waiters::run(&waiters::Params {
            trials: env_or("BENCH_WAITER_TRIALS", 50),
        })
    });

    let text = report::render(&report::Run {
        store: store.as_ref(),
        operator: operator.as_ref(),
        waiters: waiters.as_ref(),
        store_secs,
        harness_secs: started.elapsed().as_secs_f64(),
        total_secs: std::env::var("BENCH_STARTED_EPOCH")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .map(|t0| {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(t0);
                now.saturating_sub(t0) as f64
            }),
    });
    let out = std::env::var("BENCH_OUT")
        .unwrap_or_else(|_| format!("{}/docs/benchmarks.md", env!("CARGO_MANIFEST_DIR")));
    std::fs::write(&out, &text).unwrap_or_else(|e| panic!("write {out}: {e}"));
    println!("{text}");
    eprintln!("bench: wrote {out}");
}
