//! Build information for `targetlease --version`: the commit it was built
//! from. `TARGETLEASE_COMMIT` names it (an image build without `.git`);
//! otherwise release builds (`cargo install`, the Dockerfile) and any build
//! of cargo's own checkout of a git source (`cargo install --git`, also with
//! `--debug`) ask git, and rebuild when HEAD moves. Other debug builds do not
//! ask: watching HEAD would recompile the crate after every commit of a
//! working tree, so they say "dev build".

use std::path::PathBuf;
use std::process::Command;

use targetlease_build as commit_rule;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TARGETLEASE_COMMIT");
    let given = std::env::var("TARGETLEASE_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty());
    let commit = match given {
        Some(c) => Some(c.trim().to_owned()),
        None if commit_rule::asks_git(
            std::env::var("PROFILE").ok().as_deref(),
            std::env::var("CARGO_MANIFEST_DIR").ok().as_deref(),
        ) =>
        {
            git_commit()
        }
        None => None,
    };
    println!(
        "cargo:rustc-env=TARGETLEASE_BUILD_COMMIT={}",
        commit.unwrap_or_default()
    );
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Asks cargo to run this script again when `path` changes, or, when it
/// does not exist and `ancestor` says so, when the nearest directory above
/// it that exists does (a file created under it): cargo treats a missing
/// path as changed on every build, so a repository without `packed-refs`
/// (none is written until refs are packed) would rebuild the crate every
/// time.
fn watch(path: String, ancestor: bool) {
    let path = PathBuf::from(path);
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    } else if ancestor && let Some(dir) = path.ancestors().skip(1).find(|d| d.is_dir()) {
        println!("cargo:rerun-if-changed={}", dir.display());
    }
}

/// The short commit of HEAD, watching the files that move it.
fn git_commit() -> Option<String> {
    // Refs kept in a reftable change its table list, whatever moves.
    if git(&["rev-parse", "--show-ref-format"]).as_deref() == Some("reftable") {
        if let Some(path) = git(&["rev-parse", "--git-path", "reftable/tables.list"]) {
            watch(path, false);
        }
        if let Some(path) = git(&["rev-parse", "--git-path", "HEAD"]) {
            watch(path, false);
        }
        return git(&["rev-parse", "--short=12", "HEAD"]).filter(|c| !c.is_empty());
    }
    // Packing refs deletes the branch's loose ref, watched below: a change.
    // (Not packed-refs' directory when it is missing: that is the whole git
    // directory, which every git command touches.)
    for file in ["HEAD", "packed-refs"] {
        if let Some(path) = git(&["rev-parse", "--git-path", file]) {
            watch(path, false);
        }
    }
    // A branch whose ref is packed has no loose file until its next commit
    // writes one, and packing may have removed its directories too
    // (refs/heads/feature/ for feature/x): watch the nearest one left.
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(path) = git(&["rev-parse", "--git-path", &branch])
    {
        watch(path, true);
    }
    git(&["rev-parse", "--short=12", "HEAD"]).filter(|c| !c.is_empty())
}
