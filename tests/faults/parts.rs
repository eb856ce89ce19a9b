//! The long mode's record, kept per scenario so that the full long run
//! (10 runs x 300 s for every scenario, about 44 hours) can be split across
//! days and machines: every finished long-mode run appends one JSON line to
//! `<dir>/<scenario>.jsonl` (default `docs/faults/runs/`), and docs/faults.md
//! is rendered from every line recorded so far, whatever run produced it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::page::Row;
use crate::report::Figures;
use crate::scenarios::Scenario;

/// One finished run of one scenario.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    /// The commit the harness and the product were built from.
    pub commit: String,
    /// When the run finished (RFC 3339, UTC).
    pub finished: String,
    /// The run length asked for (`FAULTS_SECS`).
    pub secs: u64,
    #[serde(flatten)]
    pub figures: Figures,
    /// For a control: whether the checker reported the expected property.
    pub caught: bool,
    /// Why the run failed (empty: it passed).
    pub failures: Vec<String>,
    /// How many harness processes `scripts/faults.sh fill` ran on the
    /// machine at once (`FAULTS_AT_ONCE`; 1 when run alone).
    #[serde(default = "one")]
    pub at_once: usize,
    /// The checker version that judged the figures ([`crate::check::CHECKER`]).
    #[serde(default = "first_checker")]
    pub checker: u32,
    /// The run's kept history, a file next to the record (its name relative
    /// to the records' directory), for `rejudge`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<String>,
}

impl Record {
    /// The checker version this record counts as, for scenario `s`
    /// ([`crate::check::counts_as`]).
    pub fn judged_as(&self, s: &Scenario) -> u32 {
        crate::check::counts_as(
            self.checker,
            s.backend.dating(),
            self.figures.violations.values().sum(),
        )
    }
}

/// How many runs of `secs` seconds recorded for `s` in `dir` count as
/// judged by the current checker (what `scripts/faults.sh fill` tops up).
pub fn current_runs(dir: &Path, s: &Scenario, secs: u64) -> usize {
    let (records, _) = load(dir, s);
    records
        .iter()
        .filter(|r| r.secs == secs && r.judged_as(s) == crate::check::CHECKER)
        .count()
}

fn one() -> usize {
    1
}

fn first_checker() -> u32 {
    1
}

/// Where a run's history is kept: next to its record, in a directory named
/// after the scenario (`<dir>/<scenario>/<finished>-<process>-<n>.json.xz`),
/// so that a clone of the repository can re-judge every record. The name is
/// relative to the records' directory.
fn history_name(s: &Scenario, seq: usize) -> String {
    format!(
        "{}/{}-{}-{seq}.json.xz",
        s.name,
        humantime::format_rfc3339_seconds(SystemTime::now()),
        std::process::id()
    )
    .replace(':', "")
}

/// Saves a history, packed (`pack.rs`) and xz-compressed, next to the
/// scenario's record in `dir`; its name there (relative to `dir`), or
/// `None` when it could not be saved.
pub fn keep_history(
    dir: &Path,
    s: &Scenario,
    seq: usize,
    h: &crate::history::History,
) -> Option<String> {
    let name = history_name(s, seq);
    let path = dir.join(&name);
    std::fs::create_dir_all(path.parent()?).ok()?;
    let text = serde_json::to_vec(&crate::pack::pack(h)).ok()?;
    compress(&text, &path).then_some(name)
}

/// `xz -9` of `text` into `path` (whole or not at all).
fn compress(text: &[u8], path: &Path) -> bool {
    use std::io::Write as _;
    let tmp = path.with_extension("xz.tmp");
    let Ok(out) = std::fs::File::create(&tmp) else {
        return false;
    };
    let Ok(mut xz) = Command::new("xz")
        .args(["-9", "-T1", "-c"])
        .stdin(std::process::Stdio::piped())
        .stdout(out)
        .spawn()
    else {
        return false;
    };
    let written = xz
        .stdin
        .take()
        .is_some_and(|mut i| i.write_all(text).is_ok());
    let ok = xz.wait().is_ok_and(|s| s.success()) && written;
    ok && std::fs::rename(&tmp, path).is_ok()
}

/// How many passing runs of one scenario (of one checker version and run
/// length) keep their history (`FAULTS_KEEP_HISTORIES`, default 1): a
/// packed history of a 300 s run is about half a megabyte, all of them
/// together far too much for the repository (docs/faults.md says why).
fn histories_kept() -> usize {
    crate::config::get().keep_histories
}

/// Whether the next run of `s` of `secs` seconds keeps its history: every
/// failed run does; a passing one while fewer than [`histories_kept`]
/// passing runs of the current checker and that length have.
pub fn keeps_history(dir: &Path, s: &Scenario, secs: u64, failed: bool) -> bool {
    if failed {
        return true;
    }
    let (records, _) = load(dir, s);
    let kept = records
        .iter()
        .filter(|r| r.judged_as(s) == crate::check::CHECKER && r.secs == secs)
        .filter(|r| r.failures.is_empty() && r.history.is_some())
        .count();
    kept < histories_kept()
}

/// A kept history, read back from `dir` (the records' directory).
pub fn load_history(dir: &Path, name: &str) -> Result<crate::history::History, String> {
    let path = dir.join(name);
    if !path.exists() {
        return Err(format!(
            "{}: no such history (histories are kept next to the records)",
            path.display()
        ));
    }
    let out = Command::new("xz")
        .arg("-dc")
        .arg(&path)
        .output()
        .map_err(|e| format!("xz -dc {}: {e}", path.display()))?;
    if !out.status.success() {
        return Err(format!("{}: unreadable", path.display()));
    }
    let packed =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("{}: {e}", path.display()))?;
    crate::pack::unpack(packed).map_err(|e| format!("{}: {e}", path.display()))
}

/// Rewrites a scenario's record file with `records` (in order).
pub fn rewrite(dir: &Path, s: &Scenario, records: &[Record]) {
    let path = file(dir, s);
    let tmp = path.with_extension("jsonl.tmp");
    let text: String = records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, &path).unwrap_or_else(|e| panic!("rename {}: {e}", path.display()));
}

impl Record {
    pub fn new(secs: u64, figures: &Figures, caught: bool, failures: &[String]) -> Record {
        Record::with_history(secs, figures, caught, failures, None)
    }

    pub fn with_history(
        secs: u64,
        figures: &Figures,
        caught: bool,
        failures: &[String],
        history: Option<String>,
    ) -> Record {
        Record {
            commit: commit().to_string(),
            finished: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            secs,
            figures: figures.clone(),
            caught,
            failures: failures.to_vec(),
            at_once: crate::config::get().fill_at_once,
            checker: crate::check::CHECKER,
            history,
        }
    }
}

/// `git describe` of the working tree (`-dirty` when it has changes), taken
/// once, at the first call: main calls this before the first run, right
/// after cargo built the harness and the product from that tree. Asking git
/// again after each run would name whatever the tree holds hours later (a
/// commit, a checkout, an edit made while the long run goes on), not what
/// this binary was built from. `scripts/faults.sh fill` takes it once, right
/// after its build, and passes it down in `FAULTS_COMMIT`: its harness
/// processes start over hours.
pub fn commit() -> &'static str {
    static COMMIT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    COMMIT.get_or_init(|| {
        let config = crate::config::get();
        if let Some(c) = &config.commit {
            return c.clone();
        }
        Command::new("git")
            .args(["describe", "--always", "--dirty", "--abbrev=12"])
            .current_dir(&config.repo)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".into())
    })
}

fn file(dir: &Path, s: &Scenario) -> PathBuf {
    dir.join(format!("{}.jsonl", s.name))
}

/// Appends one run to the scenario's record.
pub fn append(dir: &Path, s: &Scenario, r: &Record) {
    use std::io::Write as _;
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let path = file(dir, s);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    // A torn last line (a writer killed mid-line) stays alone on its line.
    let torn = {
        use std::io::{Read as _, Seek as _, SeekFrom};
        let mut last = [0u8; 1];
        f.metadata().is_ok_and(|m| m.len() > 0)
            && f.seek(SeekFrom::End(-1)).is_ok()
            && f.read_exact(&mut last).is_ok()
            && last[0] != b'\n'
    };
    // The line and its newline in one write: a record is never glued to the next.
    let line = format!(
        "{}{}\n",
        if torn { "\n" } else { "" },
        serde_json::to_string(r).unwrap()
    );
    f.write_all(line.as_bytes())
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Each non-blank line of a record file, parsed (`None`: unreadable). Read
/// as bytes: a line torn inside a UTF-8 character spoils that line only.
fn lines(path: &Path) -> Vec<Option<Record>> {
    std::fs::read(path)
        .unwrap_or_default()
        .split(|b| *b == b'\n')
        .filter(|l| !l.trim_ascii().is_empty())
        .map(|l| serde_json::from_slice(l).ok())
        .collect()
}

/// Every run recorded for the scenario, oldest first, and how many lines
/// could not be read (a writer killed mid-line): those are counted, not fatal.
pub fn load(dir: &Path, s: &Scenario) -> (Vec<Record>, usize) {
    let all = lines(&file(dir, s));
    let unreadable = all.iter().filter(|r| r.is_none()).count();
    (all.into_iter().flatten().collect(), unreadable)
}

/// What one scenario's rows show: the longest run length recorded, and only
/// the runs of that length (a 30 s trial run never dilutes 300 s runs).
pub fn longest(records: &[Record]) -> Vec<&Record> {
    let secs = records.iter().map(|r| r.secs).max().unwrap_or(0);
    records.iter().filter(|r| r.secs == secs).collect()
}

/// The rows of one scenario, from everything recorded in `dir`: one per
/// checker version that judged runs of it, the current version first (its
/// row even when it judged none); figures never mix versions, so runs a
/// weaker checker passed are never counted as evidence for the current one.
pub fn rows(dir: &Path, all: &[Scenario]) -> Vec<Row> {
    let mut out = Vec::new();
    for s in all {
        let (recorded, unreadable) = load(dir, s);
        let mut versions: Vec<u32> = recorded.iter().map(|r| r.judged_as(s)).collect();
        versions.push(crate::check::CHECKER);
        versions.sort_unstable_by(|a, b| b.cmp(a));
        versions.dedup();
        for v in versions {
            let mine: Vec<Record> = recorded
                .iter()
                .filter(|r| r.judged_as(s) == v)
                .cloned()
                .collect();
            if mine.is_empty() && v != crate::check::CHECKER {
                continue;
            }
            let mut row = row(s, &mine);
            if v == crate::check::CHECKER {
                row.unreadable = unreadable;
            }
            row.checker = (!mine.is_empty()).then_some(v);
            out.push(row);
        }
    }
    out
}

/// One scenario's row from records of one checker version.
fn row(s: &Scenario, recorded: &[Record]) -> Row {
    let runs = longest(recorded);
    let mut commits: Vec<&str> = Vec::new();
    for r in &runs {
        if !commits.contains(&r.commit.as_str()) {
            commits.push(&r.commit);
        }
    }
    let secs = runs.first().map_or(0, |r| r.secs);
    let others: Vec<&Record> = recorded.iter().filter(|r| r.secs != secs).collect();
    Row {
        scenario: s.clone(),
        secs,
        runs: runs.iter().map(|r| r.figures.clone()).collect(),
        caught: runs.iter().filter(|r| r.caught).count(),
        failed: runs.iter().filter(|r| !r.failures.is_empty()).count(),
        commits: commits.join(", "),
        other_runs: others.len(),
        other_failed: others.iter().filter(|r| !r.failures.is_empty()).count(),
        at_once: runs.iter().map(|r| r.at_once).max().unwrap_or(1),
        unreadable: 0,
        checker: None,
        kept: runs.iter().filter(|r| r.history.is_some()).count(),
        carried: runs.iter().filter(|r| r.checker != r.judged_as(s)).fold(
            Default::default(),
            |mut m, r| {
                *m.entry(r.checker).or_default() += 1;
                m
            },
        ),
    }
}

/// Record files in `dir` that belong to no scenario (renamed or removed):
/// `(file name, runs, failed runs)`, for the page to list rather than drop.
pub fn orphans(dir: &Path, all: &[Scenario]) -> Vec<(String, usize, usize)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".jsonl") else {
            continue;
        };
        if all.iter().any(|s| s.name == stem) {
            continue;
        }
        let records = lines(&e.path());
        let failed = records
            .iter()
            .filter(|r| r.as_ref().is_none_or(|r| !r.failures.is_empty()))
            .count();
        found.push((name, records.len(), failed));
    }
    found.sort();
    found
}
