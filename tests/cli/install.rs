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

use crate::support::cli::{bin, lease};
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
    clean_checkout_at(nested_cargo::nested_root().join("install-checkout"))
}

/// A clean checkout of the repository's HEAD at `checkout` (one per test:
/// the tests run at once).
fn clean_checkout_at(checkout: std::path::PathBuf) -> std::path::PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
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
    let tested_before = identity(Path::new(bin()));
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
        identity(Path::new(bin())),
        tested_before,
        "the install replaced {}, which other tests run",
        bin()
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

/// `cargo install --locked --git <URL> targetlease`, as docs/cli.md gives
/// it, from a clone of HEAD by a `file://` URL (no network), and the
/// commit that `--version` then names.
///
/// build.rs asks git for the commit inside cargo's own checkout of a git
/// source, in any profile, so the install is `--debug`: in a target directory
/// of its own that starts with the test build's dependencies
/// (`support::nested_cargo`), it costs one compile of the crate. The clone
/// and a cargo home whose registry is the user's own (linked) and whose git
/// sources are the test's live under `<target>/install-git`, kept between
/// runs.
#[test]
fn cargo_install_from_git_names_the_commit_it_was_built_from() {
    let work = Path::new(bin())
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in <target>/debug")
        .join("install-git");
    let clone = clean_checkout_at(work.join("install-test-checkout"));
    let head = Command::new("git")
        .arg("-C")
        .arg(&clone)
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .expect("git runs");
    let head = String::from_utf8(head.stdout).unwrap().trim().to_owned();
    assert_eq!(head.len(), 12, "{head:?}");

    let home = work.join("cargo-home");
    let registry = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .expect("a cargo home")
        .join("registry");
    std::fs::create_dir_all(&home).unwrap();
    if std::fs::symlink_metadata(home.join("registry")).is_err() {
        std::os::unix::fs::symlink(&registry, home.join("registry")).unwrap();
    }
    // A checkout per commit would pile up; the fetched repository stays.
    let _ = std::fs::remove_dir_all(home.join("git/checkouts"));
    let url = format!("file://{}", clone.display());
    // Cargo as a user runs it: nothing of this test's own cargo (its
    // CARGO_MANIFEST_DIR, CARGO_PKG_…), and no network: a request would go
    // to a closed port and fail the command.
    let cargo = |dir: &Path| {
        let mut c = Command::new(env!("CARGO"));
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy().into_owned();
            if name.starts_with("CARGO_") || name == "OUT_DIR" {
                c.env_remove(name);
            }
        }
        // A user's own protoc, as docs/cli.md asks for one (no checkout's
        // .cargo/config.toml applies to `--git`): the tools directory's,
        // since the tests' PATH holds only a stub.
        c.current_dir(dir)
            .env("PROTOC", crate::support::tools::tool("protoc"))
            .env("CARGO_HOME", &home)
            .env("CARGO_HTTP_PROXY", "http://127.0.0.1:9")
            .env("CARGO_NET_RETRY", "0");
        c
    };
    let ok = |what: &str, out: std::process::Output| {
        assert!(
            out.status.success(),
            "{what} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // `--offline` builds a git source only from cargo's copy of it, and
    // `cargo install` fetches only online (with the registry): `cargo add
    // --dry-run` fetches the local clone alone.
    let probe = work.join("probe");
    std::fs::create_dir_all(probe.join("src")).unwrap();
    std::fs::write(
        probe.join("Cargo.toml"),
        "[package]\nname = \"probe\"\nversion = \"0.0.0\"\nedition = \"2024\"\n",
    )
    .unwrap();
    std::fs::write(probe.join("src/lib.rs"), "").unwrap();
    let fetched = cargo(&probe)
        .args(["add", "--dry-run", "--git", &url, "targetlease"])
        .output()
        .expect("run cargo add");
    ok("cargo add --dry-run --git", fetched);

    // Cargo watches the files of path packages only: a reused target
    // directory holding a build of this git package (any commit of it)
    // counts as up to date. The crate's own artifacts go; the rest stays.
    let target = nested_cargo::target_dir("install-git");
    let cleaned = cargo(&work)
        .args(["clean", "--offline", "-p", "targetlease"])
        .arg("--manifest-path")
        .arg(clone.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .output()
        .expect("run cargo clean");
    ok("cargo clean -p targetlease", cleaned);

    let root = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let install = cargo(&work)
        .args([
            "install",
            "--locked",
            "--offline",
            "--debug",
            "--git",
            &url,
            "targetlease",
        ])
        .arg("--root")
        .arg(root.path())
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("run cargo install");
    ok("cargo install --git", install);
    eprintln!("cargo install --debug --git: {:?}", started.elapsed());

    let version = Command::new(root.path().join("bin/targetlease"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(version.status.success());
    assert_eq!(
        String::from_utf8(version.stdout).unwrap(),
        format!(
            "targetlease {} (commit {head})\n",
            env!("CARGO_PKG_VERSION")
        )
    );
}

/// build.rs's rule: `cargo install --locked --path .` (a release build, as
/// docs/cli.md gives it) and any build of a git source name their commit;
/// a debug build of a working tree does not (it would rebuild per commit).
#[test]
fn release_builds_and_git_sources_ask_git_for_the_commit() {
    use targetlease_build::asks_git;
    assert!(asks_git(Some("release"), Some("/src/targetlease")));
    assert!(asks_git(
        Some("debug"),
        Some("/root/.cargo/git/checkouts/targetlease-1a2b/0c1d2e3")
    ));
    assert!(!asks_git(Some("debug"), Some("/src/targetlease")));
    assert!(!asks_git(None, None));
}
