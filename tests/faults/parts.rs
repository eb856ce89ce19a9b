//! The long mode's record, kept per scenario so that the full long run
//! (10 runs x 300 s for every scenario, about 22 hours) can be split across
//! days and machines: every finished long-mode run appends one JSON line to
//! `<dir>/<scenario>.jsonl` (default `docs/faults/runs/`), and docs/faults.md
//! is rendered from every line recorded so far, whatever run produced it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::report::{Figures, Row};
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
}

fn one() -> usize {
    1
}

impl Record {
    pub fn new(secs: u64, figures: &Figures, caught: bool, failures: &[String]) -> Record {
        Record {
            commit: commit().to_string(),
            finished: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
            secs,
            figures: figures.clone(),
            caught,
            failures: failures.to_vec(),
            at_once: std::env::var("FAULTS_AT_ONCE")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1),
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
        if let Some(c) = std::env::var("FAULTS_COMMIT")
            .ok()
            .filter(|c| !c.is_empty())
        {
            return c;
        }
        Command::new("git")
            .args(["describe", "--always", "--dirty", "--abbrev=12"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
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

/// One row per scenario, from everything recorded in `dir`.
pub fn rows(dir: &Path, all: &[Scenario]) -> Vec<Row> {
    all.iter()
        .map(|s| {
            let (recorded, unreadable) = load(dir, s);
            let runs = longest(&recorded);
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
                unreadable,
            }
        })
        .collect()
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
