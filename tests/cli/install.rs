//! `cargo install --locked --path .`, as docs/cli.md gives it, from a clean
//! checkout of this repository's HEAD (what was committed, not the working
//! tree: a file that was never added fails here) into a scratch root; then
//! the installed binary (not the one the tests built) prints its version
//! and takes a lease from a real Valkey.
//!
//! The checkout is kept under the target directory and moved to HEAD each
//! run, so unchanged files keep their times. The install builds in a target
//! directory of its own (`support::nested_cargo`: the test build's would have
//! its `debug/targetlease` replaced while other tests run it), seeded with
//! the dependencies already compiled; with `--offline` (every dependency is
//! already here) and `--debug` it costs a compile of the crate and of the
//! few dependencies whose features differ from the test build's, rather than
//! a release build of every dependency. What is tested is the install path
//! (the manifest, the lock file, the build script, the binary target), the
//! same in both profiles.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::support::cli::{BIN, lease};
use crate::support::nested_cargo;
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

/// A clean checkout of the repository's HEAD, kept under the target directory.
fn clean_checkout() -> std::path::PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let checkout = nested_cargo::nested_root().join("install-checkout");
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

/// Which file `path` is, and when it was last written.
fn identity(path: &Path) -> (u64, std::time::SystemTime) {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (meta.ino(), meta.modified().unwrap())
}

#[test]
fn cargo_install_from_the_checkout_gives_a_working_binary() {
    let checkout = clean_checkout();
    let target_dir = nested_cargo::target_dir("install");
    let tested_before = identity(Path::new(BIN));
    let root = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut install = Command::new(env!("CARGO"));
    nested_cargo::without_cargo_env(&mut install);
    let out = install
        .args(["install", "--locked", "--offline", "--debug", "--path"])
        .arg(&checkout)
        .arg("--root")
        .arg(root.path())
        .env("CARGO_TARGET_DIR", &target_dir)
        .output()
        .expect("run cargo install");
    assert!(
        out.status.success(),
        "cargo install failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("cargo install --debug --offline: {:?}", started.elapsed());
    assert_eq!(
        identity(Path::new(BIN)),
        tested_before,
        "the install replaced {BIN}, which other tests run"
    );
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
