//! The matrix's whole configuration, read once: the `FAULTS_*` environment
//! (what `scripts/faults.sh` and `scripts/test.sh` set) and the paths only
//! the runner knows (the product binary cargo built beside it, cargo's
//! scratch directory). Nothing else in the matrix reads the environment.
//!
//! | variable | field | default |
//! |---|---|---|
//! | `FAULTS_QUICK_SECS` | [`Config::quick_secs`] | 8 |
//! | `FAULTS_QUICK_AT_ONCE` | [`Config::quick_at_once`] | 3 |
//! | `FAULTS_RUNS` | [`Config::runs`] | 10 |
//! | `FAULTS_SECS` | [`Config::secs`] | 300 |
//! | `FAULTS_PARTS` | [`Config::parts`] | `docs/faults/runs` of this tree |
//! | `FAULTS_KEEP_HISTORIES` | [`Config::keep_histories`] | 1 |
//! | `FAULTS_REPORT` | [`Config::report`] | none |
//! | `FAULTS_REPORT_NOTE` | [`Config::report_note`] | `NOTE.md` in [`Config::parts`], else empty |
//! | `FAULTS_DUMP` | [`Config::dump_all`] | off |
//! | `FAULTS_DUMP_DIR` | [`Config::dump_dir`] | `faults/` in cargo's scratch directory |
//! | `FAULTS_GDB` | [`Config::gdb`] | off |
//! | `FAULTS_KEEP` | [`Config::keep_servers`] | off |
//! | `FAULTS_COMMIT` | [`Config::commit`] | `git describe` of this tree |
//! | `FAULTS_AT_ONCE` | [`Config::fill_at_once`] | 1 |
//! | `FAULTS_PRODUCT_BIN` | [`Config::product_bin`] | the `targetlease` cargo built |
//!
//! `scripts/faults.sh` reads two of its own, never seen here:
//! `FAULTS_FILL_DIR` (where `fill` keeps its logs and pinned binaries) and
//! `FAULTS_REPORT_PATH` (where `fill` writes the page).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The page's note, in the records' directory (see [`Config::report_note`]).
const NOTE: &str = "NOTE.md";
/// The full long mode: runs and seconds per scenario.
pub const FULL_RUNS: u64 = 10;
pub const FULL_SECS: u64 = 300;

/// What only the runner (the `faults` test target) knows.
pub struct Built {
    /// The `targetlease` binary cargo built with the matrix (its fail points on).
    pub product_bin: PathBuf,
    /// Cargo's scratch directory for the runner (`CARGO_TARGET_TMPDIR`).
    pub scratch: PathBuf,
}

/// Every knob of the matrix.
#[derive(Debug, Clone)]
pub struct Config {
    /// Seconds per scenario in quick mode.
    pub quick_secs: u64,
    /// Scenarios quick mode runs at once (at least 1).
    pub quick_at_once: usize,
    /// Runs per scenario in long mode.
    pub runs: u64,
    /// Seconds per run in long mode.
    pub secs: u64,
    /// Where long mode records each run (one JSON-lines file per scenario).
    pub parts: PathBuf,
    /// How many passing runs of a scenario, per checker version and run
    /// length, keep their history next to their record (every failed run
    /// keeps its own).
    pub keep_histories: usize,
    /// Write the page (docs/faults.md) to this path.
    pub report: Option<PathBuf>,
    /// A paragraph for the page's header: what the records are and what
    /// they found, kept beside them (`NOTE.md`), so every render of the page
    /// keeps it.
    pub report_note: String,
    /// Save every run's history, not only failed ones.
    pub dump_all: bool,
    /// Where saved histories go.
    pub dump_dir: PathBuf,
    /// A hung CLI's backtrace (gdb) in the failure message.
    pub gdb: bool,
    /// Keep Valkey's directories and logs.
    pub keep_servers: bool,
    /// The commit the records name (`scripts/faults.sh fill` takes it once,
    /// right after its build); `None`: `git describe` of this tree.
    pub commit: Option<String>,
    /// How many scenarios `scripts/faults.sh fill` runs at once (the
    /// records say it).
    pub fill_at_once: usize,
    /// The `targetlease` binary the CLI and operator processes run.
    pub product_bin: PathBuf,
    /// The repository this matrix was built from.
    pub repo: PathBuf,
    /// Cargo's scratch directory for the runner (the power-loss shim is
    /// compiled there).
    pub scratch: PathBuf,
}

impl Config {
    /// The configuration the environment `get` gives, over `built`'s paths.
    pub fn from(get: impl Fn(&str) -> Option<String>, built: Built) -> Config {
        let var = |name: &str| get(name).filter(|v| !v.is_empty());
        let number = |name: &str, default: u64| {
            var(name).map_or(default, |v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number"))
            })
        };
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let repo = repo.canonicalize().unwrap_or(repo);
        let parts =
            var("FAULTS_PARTS").map_or_else(|| repo.join("docs/faults/runs"), PathBuf::from);
        Config {
            quick_secs: number("FAULTS_QUICK_SECS", 8),
            quick_at_once: number("FAULTS_QUICK_AT_ONCE", 3).max(1) as usize,
            runs: number("FAULTS_RUNS", FULL_RUNS),
            secs: number("FAULTS_SECS", FULL_SECS),
            report_note: var("FAULTS_REPORT_NOTE").unwrap_or_else(|| {
                let path = parts.join(NOTE);
                match std::fs::read_to_string(&path) {
                    Ok(n) => n.split_whitespace().collect::<Vec<_>>().join(" "),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                    Err(e) => panic!("the page's note {}: {e}", path.display()),
                }
            }),
            parts,
            keep_histories: number("FAULTS_KEEP_HISTORIES", 1) as usize,
            report: var("FAULTS_REPORT").map(PathBuf::from),
            dump_all: var("FAULTS_DUMP").is_some(),
            dump_dir: var("FAULTS_DUMP_DIR")
                .map_or_else(|| built.scratch.join("faults"), PathBuf::from),
            gdb: var("FAULTS_GDB").is_some(),
            keep_servers: var("FAULTS_KEEP").is_some(),
            commit: var("FAULTS_COMMIT"),
            fill_at_once: number("FAULTS_AT_ONCE", 1) as usize,
            product_bin: var("FAULTS_PRODUCT_BIN").map_or(built.product_bin, PathBuf::from),
            repo,
            scratch: built.scratch,
        }
    }

    /// The configuration of this process's environment.
    pub fn from_env(built: Built) -> Config {
        Config::from(|name| std::env::var(name).ok(), built)
    }
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// Makes `config` the matrix's configuration (once, before anything runs).
pub fn install(config: Config) -> &'static Config {
    CONFIG
        .set(config)
        .unwrap_or_else(|_| panic!("the fault matrix's configuration is installed once"));
    get()
}

/// The matrix's configuration.
pub fn get() -> &'static Config {
    #[cfg(test)]
    {
        CONFIG.get_or_init(|| {
            Config::from(
                |_| None,
                Built {
                    product_bin: "/nonexistent/targetlease".into(),
                    scratch: std::env::temp_dir().join("targetlease-faults-tests"),
                },
            )
        })
    }
    #[cfg(not(test))]
    CONFIG
        .get()
        .expect("the runner installs the fault matrix's configuration before anything runs")
}
