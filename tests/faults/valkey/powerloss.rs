//! The power cut: what a server loses when the power goes, which a SIGKILL
//! does not (the page cache survives a SIGKILL, so every byte written is
//! read back, fsynced or not).
//!
//! `powerloss/shim.c`, preloaded into valkey-server, logs for every
//! append-only file the length known to be on the disk (its last fsync or
//! fdatasync). A cut SIGKILLs the server, cuts each file back to that
//! length, and starts it again from what is left. The shim is compiled with
//! gcc once per harness process, into cargo's scratch directory.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The shim's source, next to this harness.
const SHIM_SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/powerloss/shim.c");

/// The compiled shim (compiled on first use; a missing or failing gcc is a
/// panic that says so: a power-loss scenario never runs without its shim).
pub fn shim() -> PathBuf {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let dir = crate::config::get().scratch.join("powerloss");
        std::fs::create_dir_all(&dir).expect("create the shim's directory");
        // One file per harness process: another harness may be loading its own.
        let lib = dir.join(format!("shim-{}.so", std::process::id()));
        let out = Command::new("gcc")
            .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
            .arg(&lib)
            .arg(SHIM_SOURCE)
            .arg("-ldl")
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "the power-loss scenarios compile {SHIM_SOURCE} with gcc, which did not run \
                     ({e}): scripts/setup.sh installs it"
                )
            });
        assert!(
            out.status.success(),
            "gcc could not compile {SHIM_SOURCE}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        lib
    })
    .clone()
}

/// The shim's environment for a server whose log is `log`.
pub fn env(log: &Path) -> Vec<(String, String)> {
    vec![
        ("LD_PRELOAD".into(), shim().display().to_string()),
        ("POWERLOSS_LOG".into(), log.display().to_string()),
    ]
}

/// What the disk under the server keeps when the power goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disk {
    /// Everything fsynced (or fdatasynced) before the cut.
    Honest,
    /// Like [`Disk::Honest`], but every fsync of an append-only file takes
    /// [`SLOW_FSYNC`] (the shim sleeps first): Valkey's background fsync
    /// under `everysec` is then running most of the time.
    SlowFsync,
    /// (control) A write cache that acknowledges fsync and loses its last
    /// [`CACHE_LOSES`] when the power goes: only what was fsynced before
    /// that is kept.
    CacheLosesFsyncs,
}

/// How long each fsync of an append-only file takes on a [`Disk::SlowFsync`].
pub const SLOW_FSYNC: std::time::Duration = std::time::Duration::from_millis(250);

/// The shim's environment for a server on `disk` whose log is `log`.
pub fn env_on(log: &Path, disk: Disk) -> Vec<(String, String)> {
    let mut env = env(log);
    if disk == Disk::SlowFsync {
        env.push((
            "POWERLOSS_SLOW_FSYNC_MS".into(),
            SLOW_FSYNC.as_millis().to_string(),
        ));
    }
    env
}

/// How much of what was fsynced a [`Disk::CacheLosesFsyncs`] loses.
pub const CACHE_LOSES: std::time::Duration = std::time::Duration::from_secs(1);

/// What one cut did.
#[derive(Debug, Default)]
pub struct Cut {
    /// Files on the disk whose durable length the shim knew.
    pub tracked: u64,
    /// Bytes the cut removed (file sizes before minus after, as the file
    /// system reports them).
    pub bytes: u64,
}

/// The durable length of every file the log names, by (device, inode).
fn durable(log: &str, disk: Disk) -> HashMap<(u64, u64), u64> {
    let kept_until = match disk {
        Disk::Honest | Disk::SlowFsync => u64::MAX,
        Disk::CacheLosesFsyncs => {
            crate::history::now_ms().saturating_sub(CACHE_LOSES.as_millis() as u64)
        }
    };
    let mut out: HashMap<(u64, u64), u64> = HashMap::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let [kind, dev, ino, size, ms] = f.as_slice() else {
            continue; // a torn last line (the kill came mid-write)
        };
        let (Ok(dev), Ok(ino), Ok(size), Ok(ms)) = (
            dev.parse(),
            ino.parse(),
            size.parse::<u64>(),
            ms.parse::<u64>(),
        ) else {
            continue;
        };
        let known = out.get(&(dev, ino)).copied();
        let now = match *kind {
            // Opened for writing: what it held survived the last cut.
            "O" => known.map_or(size, |k| k.min(size)),
            "S" if ms <= kept_until => size,
            "S" => continue,
            "T" => known.map_or(size, |k| k.min(size)),
            _ => continue,
        };
        out.insert((dev, ino), now);
    }
    out
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => files(&path, out),
            Ok(t) if t.is_file() => out.push(path),
            _ => {}
        }
    }
}

/// Cuts every file under `dir` back to what the log says is on the disk,
/// then empties the log for the next incarnation. The server must be dead.
pub fn cut(dir: &Path, log: &Path, disk: Disk) -> Cut {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let durable = durable(&text, disk);
    let mut all = Vec::new();
    files(dir, &mut all);
    let mut cut = Cut::default();
    for path in all {
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        let Some(&keep) = durable.get(&(meta.dev(), meta.ino())) else {
            continue;
        };
        cut.tracked += 1;
        if meta.len() > keep {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("open {} to cut it: {e}", path.display()));
            f.set_len(keep)
                .unwrap_or_else(|e| panic!("cut {}: {e}", path.display()));
        }
        let after = std::fs::metadata(&path).map_or(meta.len(), |m| m.len());
        cut.bytes += meta.len().saturating_sub(after);
    }
    std::fs::write(log, "").expect("empty the power-loss log");
    cut
}
