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

/// The short commit of HEAD, watching the files that move it.
fn git_commit() -> Option<String> {
    for file in ["HEAD", "packed-refs"] {
        if let Some(path) = git(&["rev-parse", "--git-path", file]) {
            println!("cargo:rerun-if-changed={}", PathBuf::from(path).display());
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(path) = git(&["rev-parse", "--git-path", &branch])
    {
        println!("cargo:rerun-if-changed={}", PathBuf::from(path).display());
    }
    git(&["rev-parse", "--short=12", "HEAD"]).filter(|c| !c.is_empty())
}
