//! The fault matrix: a workload with a recorded history, a real PostgreSQL
//! downstream fenced by the recipe in `examples/fencing/`, real faults, a
//! checker that can fail, and positive controls that break the product
//! through its fail points (`src/store/failpoints.rs`). It runs only
//! where the product is built with them (`--features failpoints`, which
//! `scripts/faults.sh` passes); the plain workspace build compiles it for
//! its checker's unit tests, and there a scenario that sets a fail point in
//! this process fails at once.
//!
//! A workspace member of its own: this library is the whole matrix, and
//! the root package's `faults` test target (`tests/faults.rs`, without
//! libtest: `harness = false`) only hands it the product binary cargo built
//! with the fail points and runs [`main`]. It runs scenarios (a few at once
//! in quick mode) and prints one table:
//!
//! ```text
//! cargo test --features failpoints --test faults             # quick: every scenario and control once
//! cargo test --features failpoints --test faults -- long     # FAULTS_RUNS x FAULTS_SECS per scenario
//! cargo test --features failpoints --test faults -- holder   # scenarios whose name contains a word
//!                                           # (a whole name: that one; --skip WORD drops)
//! … -- recheck F.json        # the current checker on a saved history
//! … -- rejudge [WORD…]       # the current checker on every record's kept history
//! … -- list [WORD…]          # the chosen scenarios' names
//! … -- checker               # the checker's version (what `fill` counts)
//! ```
//!
//! Its configuration is one struct, [`Config`], read once from the
//! `FAULTS_*` environment (`config.rs` lists every variable). The runner
//! re-executes itself as `worker-holder` for the paused-holder process.
//!
//! Exit status 1 when any run fails: a violation of a property the scenario
//! promises, a control that was not caught, a fault that never fired or had
//! no effect, a part that did not recover, or a workload that did nothing.

mod args;
mod check;
pub mod config;
mod control_plane;
mod controls;
mod etcd;
mod history;
mod inject;
mod matrix;
mod pack;
mod page;
mod parts;
mod rejudge;
mod report;
mod run;
mod scenarios;
mod sink;
mod valkey;
mod workload;

#[cfg(test)]
mod checker_tests;

use targetlease_test_support as support;

use std::process::ExitCode;
use std::time::Instant;

pub use config::{Built, Config};

/// The matrix's command line (`args`, without the program name), under
/// `config`.
pub fn main(args: &[String], config: Config) -> ExitCode {
    let config = config::install(config);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match args.first().map(String::as_str) {
        Some("worker-holder") => {
            let cfg = serde_json::from_str(&args[1]).expect("worker config");
            runtime.block_on(workload::holder::worker_main(cfg));
            return ExitCode::SUCCESS;
        }
        Some("recheck") => return rejudge::recheck(&args[1..]),
        Some("rejudge") => return rejudge::rejudge(&args[1..]),
        Some("checker") => {
            println!("{}", check::CHECKER);
            return ExitCode::SUCCESS;
        }
        Some("recorded") => {
            // `recorded SECS NAME`: how many runs of that length count as
            // judged by the current checker.
            let secs: u64 = args[1].parse().expect("recorded SECS NAME");
            let s = scenarios::all()
                .into_iter()
                .find(|s| s.name == args[2])
                .unwrap_or_else(|| panic!("no scenario {}", args[2]));
            println!("{}", parts::current_runs(&config.parts, &s, secs));
            return ExitCode::SUCCESS;
        }
        Some("list") => {
            let args::Words { words, skips } = args::words(&args[1..]);
            let words: Vec<&str> = words.into_iter().filter(|w| *w != "long").collect();
            for s in args::choose(scenarios::all(), |s| s.name, &words, &skips) {
                println!("{}", s.name);
            }
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    let args::Words { words, skips } = args::words(args);
    let long = words.contains(&"long");
    let filters: Vec<&str> = words.into_iter().filter(|w| *w != "long").collect();
    let (runs, secs) = if long {
        (config.runs, config.secs)
    } else {
        (1, config.quick_secs)
    };
    let chosen = args::choose(scenarios::all(), |s| s.name, &filters, &skips);
    if chosen.is_empty() {
        println!("faults: no scenario matches {filters:?}");
        return ExitCode::SUCCESS;
    }
    println!(
        "faults: {} mode, {} scenario(s), {runs} run(s) x {secs}s each",
        if long { "long" } else { "quick" },
        chosen.len()
    );
    let started = Instant::now();
    let failed = runtime.block_on(matrix::run_all(&chosen, runs, secs, long));
    println!(
        "faults: {} in {:.0}s",
        if failed == 0 {
            "ok".to_string()
        } else {
            format!("{failed} run(s) FAILED")
        },
        started.elapsed().as_secs_f64()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
