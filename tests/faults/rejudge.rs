//! The current checker on histories already recorded: every record's kept
//! history (`rejudge`), or histories a failed run saved (`recheck`).

use std::process::ExitCode;

use crate::{args, check, config, history, parts, report, run, scenarios};

/// The current checker on every recorded run that kept its history: its
/// figures, failures and checker version are rewritten in the record.
pub fn rejudge(words: &[String]) -> ExitCode {
    let args::Words { words, skips } = args::words(words);
    let dir = &config::get().parts;
    let mut failed = 0;
    for s in args::choose(scenarios::all(), |s| s.name, &words, &skips) {
        let (mut records, unreadable) = parts::load(dir, &s);
        if records.is_empty() {
            continue;
        }
        let (mut done, mut kept_none) = (0, 0);
        for r in &mut records {
            let Some(name) = r.history.clone() else {
                kept_none += 1;
                continue;
            };
            let history = match parts::load_history(dir, &name) {
                // Histories kept before the dating was recorded have the
                // default: their scenario knows.
                Ok(h) => crate::history::History {
                    dating: s.backend.dating(),
                    ..h
                },
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
            parts::rewrite(dir, &s, &records);
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
/// what it finds now, and how the history's times are dated (a dump saved
/// before that was recorded says `Store`, even from etcd): for working on
/// the checker without rerunning faults.
pub fn recheck(paths: &[String]) -> ExitCode {
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
        // A dump saved before the dating was recorded reads as the store's.
        println!(
            "{path} (times dated by {:?}): {:?}",
            saved.history.dating,
            report.counts()
        );
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
