//! Cargo builds that tests run themselves (`cargo install` from a checkout,
//! the playground's `cargo build`) get target directories of their own,
//! never the test build's: a nested build of `targetlease` without the test
//! build's features would replace `<target>/debug/targetlease` while other
//! tests run it. Each nested directory starts from the dependencies already
//! compiled (the test build's and the other nested directories'), so a
//! nested build compiles only what its features change (tokio without
//! `test-util` and what depends on it) and the crate itself.
//!
//! One directory per source tree: two checkouts of this crate share cargo's
//! unit hashes, so a directory shared between them could take one tree's
//! build for the other's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The test build's target directory (`<target>/debug/targetlease` is the
/// binary the tests run).
pub fn test_target_dir() -> PathBuf {
    Path::new(super::cli::bin())
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in <target>/debug")
        .to_owned()
}

/// `<target>/nested`, where the nested target directories (and the source
/// trees they build, when a test needs one) live.
pub fn nested_root() -> PathBuf {
    test_target_dir().join("nested")
}

static SEEDING: Mutex<()> = Mutex::new(());

/// `<target>/nested/NAME`, a target directory for one nested build, seeded
/// on first use with the compiled dependencies of the test build and of the
/// other nested directories (never this crate's own units: they are built
/// from another tree).
pub fn target_dir(name: &str) -> PathBuf {
    let _one_at_a_time = SEEDING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = nested_root().join(name);
    if dir.join("debug").exists() {
        return dir;
    }
    // Seeded aside and renamed into place: a seeding cut short is not taken
    // for a seeded directory by the next run.
    let tmp = nested_root().join(format!(".{name}.seeding-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let mut sources = vec![test_target_dir().join("debug")];
    if let Ok(entries) = std::fs::read_dir(nested_root()) {
        sources.extend(
            entries
                .flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .map(|e| e.path().join("debug")),
        );
    }
    for source in sources.iter().filter(|s| s.is_dir()) {
        for sub in ["deps", "build", ".fingerprint"] {
            seed(&source.join(sub), &tmp.join("debug").join(sub));
        }
    }
    std::fs::create_dir_all(&dir).expect("create the nested target directory");
    let _ = std::fs::remove_dir(&dir);
    if let Err(e) = std::fs::rename(&tmp, &dir) {
        // Another test process seeded it meanwhile: use that one.
        let _ = std::fs::remove_dir_all(&tmp);
        assert!(dir.join("debug").exists(), "{}: {e}", dir.display());
    }
    dir
}

/// Copies `from` into `to` (what `to` already has stays): compiled outputs,
/// which rustc and the linker replace rather than rewrite, as hard links;
/// everything else (fingerprints, dep-info, build-script output, which cargo
/// rewrites in place) as copies. This crate's own units are left out, and so
/// are the executables in `deps` (test binaries: nothing depends on them,
/// and copies of them would cost gigabytes).
fn seed(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(entries) = std::fs::read_dir(from) else {
        return;
    };
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("targetlease") || name.starts_with("libtargetlease") {
            continue;
        }
        let (src, dst) = (entry.path(), to.join(&*name));
        if dst.exists() {
            continue;
        }
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let executable = kind.is_file()
            && entry
                .metadata()
                .is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
        if executable && from.ends_with("deps") && !name.contains('.') {
            continue;
        }
        if kind.is_dir() {
            seed(&src, &dst);
        } else if kind.is_symlink() {
            if let Ok(target) = std::fs::read_link(&src) {
                let _ = std::os::unix::fs::symlink(target, &dst);
            }
        } else {
            let replaced_whole = executable
                || [".rlib", ".rmeta", ".so", ".a"]
                    .iter()
                    .any(|ext| name.ends_with(ext));
            // A file another cargo removes or rewrites meanwhile (a nested
            // build of another test process, seeded from too) is left out:
            // a unit without its files is one cargo builds again.
            if !(replaced_whole && std::fs::hard_link(&src, &dst).is_ok()) {
                let _ = try_copy_keeping_time(&src, &dst);
            }
        }
    }
}

/// A copy with the original's modification time (cargo's freshness checks
/// compare them).
pub fn copy_keeping_time(src: &Path, dst: &Path) {
    try_copy_keeping_time(src, dst)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", src.display(), dst.display()));
}

fn try_copy_keeping_time(src: &Path, dst: &Path) -> std::io::Result<()> {
    let modified = std::fs::metadata(src).and_then(|m| m.modified());
    if let Err(e) = std::fs::copy(src, dst) {
        let _ = std::fs::remove_file(dst);
        return Err(e);
    }
    if let Ok(modified) = modified {
        // futimens needs ownership, not write access: a read-only file too.
        let _ = std::fs::File::open(dst).and_then(|f| f.set_modified(modified));
    }
    Ok(())
}

/// Removes what cargo sets for a test process (`CARGO_MANIFEST_DIR`,
/// `CARGO_PKG_…`, …): passed on to a nested cargo, it would reach the
/// dependencies' build scripts and make them look changed. The user's own
/// cargo settings (`CARGO_HOME`, `CARGO_INCREMENTAL`, `CARGO_BUILD_…`) stay;
/// the caller sets `CARGO_TARGET_DIR`.
pub fn without_cargo_env(cmd: &mut Command) -> &mut Command {
    const SET_FOR_TESTS: [&str; 6] = [
        "CARGO_MANIFEST_",
        "CARGO_PKG_",
        "CARGO_CRATE_",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_BIN_",
        "CARGO_TARGET_TMPDIR",
    ];
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if SET_FOR_TESTS.iter().any(|p| name.starts_with(p)) || name == "OUT_DIR" {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// `<target>/nested/NAME`: a copy of this repository's working tree as it is
/// now (every file git tracks or would track), brought up to date on each
/// call. Unchanged files keep their modification times, so a build in the
/// copy recompiles only what changed. Its `target` is
/// [`target_dir`]`(NAME-target)`, so a cargo that is not told where to
/// build (no `CARGO_TARGET_DIR`) builds there.
pub fn working_tree_copy(name: &str) -> PathBuf {
    let repo = crate::repo();
    let copy = nested_root().join(name);
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .output()
        .expect("git runs (the repository is a git checkout)");
    assert!(
        out.status.success(),
        "git ls-files: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: std::collections::BTreeSet<PathBuf> = out
        .stdout
        .split(|b| *b == 0)
        .filter(|f| !f.is_empty())
        .map(|f| PathBuf::from(String::from_utf8_lossy(f).into_owned()))
        .filter(|f| repo.join(f).is_file())
        .collect();
    for file in &listed {
        let (src, dst) = (repo.join(file), copy.join(file));
        let same = |a: &Path, b: &Path| {
            let (Ok(a), Ok(b)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
                return false;
            };
            a.len() == b.len() && a.modified().ok() == b.modified().ok()
        };
        if !same(&src, &dst) {
            std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
            let _ = std::fs::remove_file(&dst);
            copy_keeping_time(&src, &dst);
        }
    }
    remove_unlisted(&copy, &copy, &listed);
    let target = copy.join("target");
    if std::fs::symlink_metadata(&target).is_err() {
        std::os::unix::fs::symlink(target_dir(&format!("{name}-target")), &target)
            .unwrap_or_else(|e| panic!("{}: {e}", target.display()));
    }
    copy
}

/// Removes the files under `dir` (of the copy at `root`) that the working
/// tree no longer has; `root/target` stays.
fn remove_unlisted(root: &Path, dir: &Path, listed: &std::collections::BTreeSet<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let rel = path.strip_prefix(root).unwrap().to_owned();
        if rel == Path::new("target") {
            continue;
        }
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_unlisted(root, &path, listed);
        } else if !listed.contains(&rel) {
            let _ = std::fs::remove_file(&path);
        }
    }
}
