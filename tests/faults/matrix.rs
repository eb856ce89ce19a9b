//! Quick and long mode: every chosen scenario run, judged, printed, and in
//! long mode recorded; then the page.

use std::sync::Arc;

use futures::FutureExt as _;

use crate::config::{self, FULL_RUNS, FULL_SECS};
use crate::page::{self, Row};
use crate::scenarios::{self, Scenario};
use crate::support;
use crate::{check, parts, report, run, valkey};

/// How many scenarios quick mode runs at once (`FAULTS_QUICK_AT_ONCE`,
/// default 3): each has its own Valkey, database and namespace; a scenario
/// whose fail points hold in this process, or that restarts the shared API
/// server, runs alone.
fn at_once(long: bool) -> usize {
    if long {
        return 1;
    }
    config::get().quick_at_once
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
pub async fn run_all(chosen: &[Scenario], runs: u64, secs: u64, long: bool) -> usize {
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
    let parts_dir = long.then(|| config::get().parts.clone());
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
    if let Some(path) = &config::get().report {
        let note = &config::get().report_note;
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
        std::fs::write(path, doc).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        println!("faults: wrote {}", path.display());
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
        } else if config::get().dump_all {
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
        carried: Default::default(),
    }
}

/// Saves a failed run's history for inspection; the line naming it.
fn dump(s: &Scenario, run: u64, result: &run::RunResult) -> Option<String> {
    let dir = &config::get().dump_dir;
    let _ = std::fs::create_dir_all(dir);
    let path = dir.join(format!("{}-{}.json", s.name, run + 1));
    let text =
        serde_json::json!({ "history": result.history, "violations": result.report.violations });
    std::fs::write(&path, text.to_string())
        .ok()
        .map(|()| format!("      history: {}", path.display()))
}
