//! The fault matrix: a workload with a recorded history, a real PostgreSQL
//! downstream fenced by the recipe in `examples/fencing/`, real faults, a
//! checker that can fail, and positive controls that break the product
//! through its fail points (`src/store/failpoints.rs`). Built only with
//! `--features failpoints` (`scripts/faults.sh` passes it).
//!
//! A test target without libtest (`harness = false`), so it runs scenarios
//! (a few at once in quick mode) and prints one table:
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
//! Environment: `FAULTS_QUICK_SECS` (default 8), `FAULTS_QUICK_AT_ONCE`
//! (default 3), `FAULTS_RUNS` (10), `FAULTS_SECS` (300), `FAULTS_PARTS`
//! (where long mode records each run, default `docs/faults/runs`),
//! `FAULTS_KEEP_HISTORIES` (how many passing runs of a scenario, per
//! checker version and run length, keep their history next to their
//! record; default 1, every failed run keeps its own), `FAULTS_REPORT` (write
//! docs/faults.md to this path), `FAULTS_REPORT_NOTE` (a line for its
//! header), `FAULTS_DUMP` (save every run's history, not only failed ones),
//! `FAULTS_GDB` (a hung CLI's backtrace in the failure message),
//! `FAULTS_KEEP` (keep Valkey's directories and logs); set by
//! `scripts/faults.sh fill`: `FAULTS_COMMIT` (the commit its records name),
//! `FAULTS_AT_ONCE` (how many scenarios it runs at once),
//! `FAULTS_PRODUCT_BIN` (the pinned `targetlease` binary), `FAULTS_DUMP_DIR`
//! (where failed runs' histories go). The binary re-executes itself as
//! `worker-holder` for the paused-holder process.
//!
//! Exit status 1 when any run fails: a violation of a property the scenario
//! promises, a control that was not caught, a fault that never fired or had
//! no effect, a part that did not recover, or a workload that did nothing.

// cargo builds this target with cfg(test) but without libtest: the
// checker's unit tests run in `tests/faults_checker.rs`, not here.
mod args;
#[allow(unused_imports)]
mod check;
mod control_plane;
mod controls;
mod etcd;
mod history;
mod inject;
mod pack;
mod page;
mod parts;
mod report;
mod run;
mod scenarios;
mod sink;
mod valkey;
mod workload;

use targetlease_test_support as support;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt as _;

use page::Row;
use scenarios::Scenario;

/// The full long mode: runs and seconds per scenario.
const FULL_RUNS: u64 = 10;
const FULL_SECS: u64 = 300;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if args.first().map(String::as_str) == Some("worker-holder") {
        let cfg = serde_json::from_str(&args[1]).expect("worker config");
        runtime.block_on(workload::holder::worker_main(cfg));
        return ExitCode::SUCCESS;
    }
    if args.first().map(String::as_str) == Some("recheck") {
        return recheck(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("rejudge") {
        return rejudge(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("checker") {
        println!("{}", check::CHECKER);
        return ExitCode::SUCCESS;
    }
    if args.first().map(String::as_str) == Some("list") {
        let args::Words { words, skips } = args::words(&args[1..]);
        let words: Vec<&str> = words.into_iter().filter(|w| *w != "long").collect();
        for s in args::choose(scenarios::all(), |s| s.name, &words, &skips) {
            println!("{}", s.name);
        }
        return ExitCode::SUCCESS;
    }
    let args::Words { words, skips } = args::words(&args);
    let long = words.contains(&"long");
    let filters: Vec<&str> = words.into_iter().filter(|w| *w != "long").collect();
    let (runs, secs) = if long {
        (
            env_u64("FAULTS_RUNS", FULL_RUNS),
            env_u64("FAULTS_SECS", FULL_SECS),
        )
    } else {
        (1, env_u64("FAULTS_QUICK_SECS", 8))
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
    let failed = runtime.block_on(run_all(&chosen, runs, secs, long));
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

/// How many scenarios quick mode runs at once (`FAULTS_QUICK_AT_ONCE`,
/// default 3): each has its own Valkey, database and namespace; a scenario
/// whose fail points hold in this process, or that restarts the shared API
/// server, runs alone.
fn at_once(long: bool) -> usize {
    if long {
        return 1;
    }
    env_u64("FAULTS_QUICK_AT_ONCE", 3).max(1) as usize
}

/// True for a scenario that must have the harness to itself.
fn alone(s: &Scenario) -> bool {
    s.failpoints_here
        || matches!(
            s.fault,
            scenarios::Fault::ApiserverRestart | scenarios::Fault::EtcdCompaction
        )
}

/// Runs every chosen scenario; returns the number of failed runs.
async fn run_all(chosen: &[Scenario], runs: u64, secs: u64, long: bool) -> usize {
    // The power-loss shim is compiled before anything runs: without gcc the
    // matrix fails at once, not minutes in.
    if runs > 0
        && chosen.iter().any(|s| {
            matches!(
                s.backend,
                scenarios::Backend::Valkey(valkey::Setup::PowerLoss(..))
            )
        })
    {
        tokio::task::spawn_blocking(valkey::powerloss::shim)
            .await
            .expect("compile the power-loss shim");
    }
    // No runs (rendering the page from the records): no PostgreSQL either,
    // so a clone without the tools can re-judge and render.
    let pg = if runs > 0 {
        Some(Arc::new(
            tokio::task::spawn_blocking(support::postgres::Postgres::start)
                .await
                .unwrap(),
        ))
    } else {
        None
    };
    // Long mode records every run, so the full run can be split across days.
    let parts_dir = long.then(|| {
        std::env::var_os("FAULTS_PARTS")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/faults/runs")
            })
    });
    if parts_dir.is_some() {
        // What the records will name: the tree this binary was built from.
        println!("faults: recording runs of {}", parts::commit());
    }
    let width = at_once(long);
    let permits = Arc::new(tokio::sync::Semaphore::new(width));
    let seq = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Those that run alone first, then the rest, `width` at a time.
    let mut order: Vec<(usize, &Scenario)> = chosen.iter().enumerate().collect();
    order.sort_by_key(|(i, s)| (!alone(s), *i));
    let mut pending = futures::stream::FuturesUnordered::new();
    for (i, s) in order {
        let (pg, permits, seq, parts_dir) =
            (pg.clone(), permits.clone(), seq.clone(), parts_dir.clone());
        pending.push(async move {
            let n = if alone(s) { width as u32 } else { 1 };
            let _permit = permits.acquire_many(n).await.expect("permits");
            let row = run_scenario(s, runs, secs, pg, &seq, parts_dir.as_deref()).await;
            (i, row)
        });
    }
    let mut results: Vec<(usize, Row)> = Vec::new();
    while let Some(done) = futures::StreamExt::next(&mut pending).await {
        results.push(done);
    }
    results.sort_by_key(|(i, _)| *i);
    let failed = results.iter().map(|(_, r)| r.failed).sum();
    let results: Vec<Row> = results.into_iter().map(|(_, r)| r).collect();
    if let Ok(path) = std::env::var("FAULTS_REPORT") {
        let note = std::env::var("FAULTS_REPORT_NOTE").unwrap_or_default();
        // Long mode: every run recorded so far, not only this invocation's.
        let (rows, parameters) = match &parts_dir {
            Some(dir) => (
                parts::rows(dir, &scenarios::all()),
                format!(
                    "every run recorded by `scripts/faults.sh long` in \
                     [`docs/faults/runs/`](faults/runs/) (per scenario and checker version, the runs \
                     of its longest recorded length; the full long mode is {FULL_RUNS} runs x \
                     {FULL_SECS} s)"
                ),
            ),
            None => (
                results,
                format!("quick mode, {runs} run x {secs} s per scenario"),
            ),
        };
        let header = format!(
            "{}\n\nParameters of these figures: {parameters}. {note}\n",
            include_str!("doc_header.md")
                .trim_end()
                .replace("{CHECKER}", &check::CHECKER.to_string()),
        );
        let mut doc = page::render(&header, &rows);
        if let Some(dir) = &parts_dir {
            let orphans = parts::orphans(dir, &scenarios::all());
            if !orphans.is_empty() {
                doc += "\n**Recorded runs of scenarios that no longer exist** (renamed or \
                        removed: move or delete their file):\n\n";
                for (file, runs, failed) in orphans {
                    doc += &format!("- `{file}`: {runs} run(s), {failed} failed\n");
                }
            }
        }
        let doc = doc + include_str!("doc_footer.md");
        std::fs::write(&path, doc).unwrap_or_else(|e| panic!("write {path}: {e}"));
        println!("faults: wrote {path}");
    }
    failed
}

/// Every run of one scenario, each printed (and recorded in long mode).
async fn run_scenario(
    s: &Scenario,
    runs: u64,
    secs: u64,
    pg: Option<Arc<support::postgres::Postgres>>,
    seq: &std::sync::atomic::AtomicUsize,
    parts_dir: Option<&std::path::Path>,
) -> Row {
    let mut figures = Vec::new();
    let mut caught = 0;
    let mut failed_runs = 0;
    for r in 0..runs {
        let n = seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        // A run that panics (a workload task that never stops, a server
        // that does not start) is recorded as failed before the panic
        // goes on: otherwise the record would only ever hold the runs
        // that finished.
        let pg = pg
            .clone()
            .expect("PostgreSQL runs whenever a scenario does");
        let result = match std::panic::AssertUnwindSafe(run::run(s, secs, pg, n))
            .catch_unwind()
            .await
        {
            Ok(result) => result,
            Err(panic) => {
                if let Some(dir) = parts_dir {
                    let why = panic
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .or_else(|| panic.downcast_ref::<&str>().copied())
                        .unwrap_or("(no message)");
                    parts::append(
                        dir,
                        s,
                        &parts::Record::new(
                            secs,
                            &report::Figures::default(),
                            false,
                            &[format!("the harness panicked: {why}")],
                        ),
                    );
                }
                std::panic::resume_unwind(panic);
            }
        };
        let (fig, failures) = report::judge(s, &result);
        let was_caught = s.caught(&result.report);
        caught += usize::from(was_caught);
        if let Some(dir) = parts_dir {
            let kept = if parts::keeps_history(dir, s, secs, !failures.is_empty()) {
                let kept = parts::keep_history(dir, s, n, &result.history);
                if kept.is_none() {
                    println!(
                        "  {}: its history could not be kept next to its record",
                        s.name
                    );
                }
                kept
            } else {
                None
            };
            parts::append(
                dir,
                s,
                &parts::Record::with_history(secs, &fig, was_caught, &failures, kept),
            );
        }
        let mut lines = vec![format!(
            "  {:<36} run {:>2}: {:>5.1}s {:>6} ops {:>6} writes {:>5} published {:>3} relists {:>3} faults  violations {:?}  {}",
            s.name,
            r + 1,
            fig.elapsed.as_secs_f64(),
            fig.ops,
            fig.writes,
            fig.published,
            fig.relists,
            fig.faults,
            fig.violations,
            if failures.is_empty() { "ok" } else { "FAILED" }
        )];
        if !failures.is_empty() {
            failed_runs += 1;
            for f in failures.iter().take(10) {
                lines.push(format!("      {f}"));
            }
            lines.extend(dump(s, r, &result));
        } else if std::env::var_os("FAULTS_DUMP").is_some() {
            lines.extend(dump(s, r, &result));
        }
        if failures.is_empty() && !result.report.violations.is_empty() {
            for v in result.report.violations.iter().take(3) {
                let how = if s.is_control() { "caught" } else { "measured" };
                lines.push(format!("      {how}: {v}"));
            }
        }
        // One scenario's lines together, whatever runs beside it.
        println!("{}", lines.join("\n"));
        figures.push(fig);
    }
    Row {
        scenario: s.clone(),
        secs,
        runs: figures,
        caught,
        failed: failed_runs,
        commits: String::new(),
        other_runs: 0,
        other_failed: 0,
        at_once: 1,
        unreadable: 0,
        // Judged now, by this checker.
        checker: Some(check::CHECKER),
        kept: 0,
    }
}

/// The current checker on every recorded run that kept its history: its
/// figures, failures and checker version are rewritten in the record.
fn rejudge(words: &[String]) -> ExitCode {
    let args::Words { words, skips } = args::words(words);
    let dir = std::env::var_os("FAULTS_PARTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/faults/runs")
        });
    let mut failed = 0;
    for s in args::choose(scenarios::all(), |s| s.name, &words, &skips) {
        let (mut records, unreadable) = parts::load(&dir, &s);
        if records.is_empty() {
            continue;
        }
        let (mut done, mut kept_none) = (0, 0);
        for r in &mut records {
            let Some(name) = r.history.clone() else {
                kept_none += 1;
                continue;
            };
            let history = match parts::load_history(&dir, &name) {
                Ok(h) => h,
                Err(e) => {
                    println!("  {}: {e}", s.name);
                    failed += 1;
                    continue;
                }
            };
            let report = check::check(&history);
            let result = run::RunResult {
                history,
                report,
                elapsed: r.figures.elapsed,
            };
            let (fig, failures) = report::judge(&s, &result);
            r.caught = s.caught(&result.report);
            failed += usize::from(!failures.is_empty());
            r.figures = fig;
            r.failures = failures;
            r.checker = check::CHECKER;
            done += 1;
        }
        if unreadable == 0 {
            parts::rewrite(&dir, &s, &records);
        }
        println!(
            "  {:<36} {done} run(s) re-judged by checker v{}, {kept_none} without a kept history",
            s.name,
            check::CHECKER
        );
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        println!("faults: {failed} re-judged run(s) FAILED");
        ExitCode::FAILURE
    }
}

/// Runs the checker again on saved histories (`dump`'s files) and prints
/// what it finds now: for working on the checker without rerunning faults.
fn recheck(paths: &[String]) -> ExitCode {
    #[derive(serde::Deserialize)]
    struct Saved {
        history: history::History,
    }
    let mut found = 0;
    for path in paths {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
        let saved: Saved =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {path}: {e}"));
        let report = check::check(&saved.history);
        println!("{path}: {:?}", report.counts());
        for v in report.violations.iter().take(10) {
            println!("  {v}");
        }
        found += report.violations.len();
    }
    if found == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Saves a failed run's history for inspection; the line naming it.
fn dump(s: &Scenario, run: u64, result: &run::RunResult) -> Option<String> {
    let dir = std::env::var_os("FAULTS_DUMP_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("faults"));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{}-{}.json", s.name, run + 1));
    let text =
        serde_json::json!({ "history": result.history, "violations": result.report.violations });
    std::fs::write(&path, text.to_string())
        .ok()
        .map(|()| format!("      history: {}", path.display()))
}
