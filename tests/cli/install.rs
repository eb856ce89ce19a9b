//! `cargo install --locked --path .`, as docs/cli.md gives it, from a clean
//! checkout of this repository's HEAD (what was committed, not the working
//! tree: a file that was never added fails here) into a scratch root; then
//! the installed binary (not the one the tests built) prints its version
//! and takes a lease from a real Valkey.
//!
//! The checkout is kept in the target directory and moved to HEAD each run,
//! so unchanged files keep their times; with `--offline` (every dependency
//! is already here) and `--debug` with this build's own target directory it
//! costs at most one compile of the crate, rather than a release build of
//! every dependency. What is tested is the install path (the manifest, the
//! lock file, the build script, the binary target), the same in both
//! profiles.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::support::cli::{BIN, lease};
use crate::support::valkey_server::ValkeyServer;

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .expect("git runs (the repository is a git checkout)");
    assert!(
        out.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A clean checkout of the repository's HEAD under `target_dir`.
fn clean_checkout(target_dir: &Path) -> std::path::PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let checkout = target_dir.join("install-test-checkout");
    if !checkout.join(".git").exists() {
        let _ = std::fs::remove_dir_all(&checkout);
        std::fs::create_dir_all(&checkout).unwrap();
        git(&checkout, &["init", "--quiet"]);
    }
    let repo = repo.to_str().expect("a UTF-8 path");
    git(&checkout, &["fetch", "--quiet", "--no-tags", repo, "HEAD"]);
    git(
        &checkout,
        &["checkout", "--quiet", "--force", "--detach", "FETCH_HEAD"],
    );
    git(&checkout, &["clean", "-q", "-f", "-d", "-x"]);
    checkout
}

#[test]
fn cargo_install_from_the_checkout_gives_a_working_binary() {
    // <target dir>/debug/targetlease
    let target_dir = Path::new(BIN)
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in <target>/debug");
    let checkout = clean_checkout(target_dir);
    let root = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut install = Command::new(env!("CARGO"));
    // What cargo set for this test process (CARGO_MANIFEST_DIR, CARGO_PKG_…)
    // would reach the dependencies' build scripts and make them look changed.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if (name.starts_with("CARGO_") && name != "CARGO_HOME") || name == "OUT_DIR" {
            install.env_remove(name);
        }
    }
    let out = install
        .args(["install", "--locked", "--offline", "--debug", "--path"])
        .arg(&checkout)
        .arg("--root")
        .arg(root.path())
        .env("CARGO_TARGET_DIR", target_dir)
        .output()
        .expect("run cargo install");
    assert!(
        out.status.success(),
        "cargo install failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("cargo install --debug --offline: {:?}", started.elapsed());
    let installed = root.path().join("bin/targetlease");

    let version = Command::new(&installed).arg("--version").output().unwrap();
    assert!(version.status.success());
    let line = String::from_utf8(version.stdout).unwrap();
    assert!(
        line.starts_with(&format!("targetlease {} (", env!("CARGO_PKG_VERSION"))),
        "{line:?}"
    );

    let s = ValkeyServer::start();
    let args = lease(&s.url(), "acquire").target("installed");
    let out = Command::new(&installed)
        .args(args.args())
        .env_remove("TARGETLEASE_VALKEY_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["outcome"], "acquired", "{j}");
    assert_eq!(j["lease"]["fencing_token"], 1, "{j}");
}
