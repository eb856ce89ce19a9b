//! `scripts/playground.sh`, the README's first command, as a newcomer runs
//! it: it builds the binary with cargo and finds it where cargo put it (with
//! `CARGO_TARGET_DIR` set to a directory of one's own, and without it), shows
//! a Held lease, each election's leader with its token and `targetlease
//! run`'s output; and when a part it started dies, it says which, exits
//! non-zero and leaves no process of its own behind.
//!
//! It runs from a copy of the working tree whose `target` is a target
//! directory of its own (`support::nested_cargo`): its `cargo build` must not
//! rewrite the binary the other tests run, and the copy's default target
//! directory is the one cargo uses when `CARGO_TARGET_DIR` is not set. Both
//! ways build into the same directory, so the second build finds it done.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::support::nested_cargo;

/// The working-tree copy the playground runs from, brought up to date once
/// per test process.
fn tree() -> &'static Path {
    static TREE: OnceLock<PathBuf> = OnceLock::new();
    TREE.get_or_init(|| nested_cargo::working_tree_copy("playground-tree"))
}

/// Where the playground's `cargo build` goes.
#[derive(Clone, Copy)]
enum Build {
    /// `CARGO_TARGET_DIR` set to a directory that is not the tree's `target`.
    CustomTargetDir,
    /// No `CARGO_TARGET_DIR`: cargo's default, the tree's `target`.
    DefaultTargetDir,
}

impl Build {
    /// The binary cargo builds, as cargo names it.
    fn binary(self) -> PathBuf {
        match self {
            Build::CustomTargetDir => custom_target_dir().join("debug/targetlease"),
            Build::DefaultTargetDir => tree().join("target/debug/targetlease"),
        }
    }
}

/// The tree's `target` (a link to a nested target directory), named by
/// where it really is.
fn custom_target_dir() -> PathBuf {
    std::fs::canonicalize(tree().join("target")).expect("the tree's target directory")
}

fn playground(dir: &Path, arg: &str, build: Build) -> Command {
    let mut cmd = Command::new("bash");
    nested_cargo::without_cargo_env(&mut cmd);
    cmd.arg(tree().join("scripts/playground.sh"))
        .arg(arg)
        .env("PLAYGROUND_DIR", dir)
        .env_remove("PLAYGROUND_BIN")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match build {
        Build::CustomTargetDir => cmd.env("CARGO_TARGET_DIR", custom_target_dir()),
        Build::DefaultTargetDir => cmd.env_remove("CARGO_TARGET_DIR"),
    };
    cmd
}

/// A process the playground recorded (its pid files, in its directory and
/// its control plane's): name, pid and command line when it was recorded.
#[derive(Debug)]
struct Part {
    name: String,
    pid: u32,
    cmdline: String,
}

fn cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&raw).replace('\0', " "))
}

/// Alive, not a zombie, and still running what it ran when recorded (its
/// pid not reused).
fn still_running(p: &Part) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.pid)).unwrap_or_default();
    let state = stat.rsplit(") ").next().and_then(|r| r.chars().next());
    !stat.is_empty()
        && !matches!(state, Some('Z' | 'X'))
        && cmdline(p.pid).as_deref() == Some(p.cmdline.as_str())
}

/// Every part the playground in `dir` has recorded so far.
fn recorded_parts(dir: &Path) -> Vec<Part> {
    [dir.to_owned(), dir.join("cp")]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|entries| entries.flatten())
        .filter_map(|e| {
            let name = e
                .file_name()
                .to_string_lossy()
                .strip_suffix(".pid")?
                .to_owned();
            let pid = std::fs::read_to_string(e.path())
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some(Part {
                name,
                cmdline: cmdline(pid)?,
                pid,
            })
        })
        .collect()
}

/// Processes whose command line names `dir` (what the playground started
/// there that shows it: the control plane, the operator).
fn processes_in(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .filter(|e| e.file_name().to_string_lossy() != me)
        .filter_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline
                .contains(&needle)
                .then(|| format!("{}: {cmdline}", e.file_name().to_string_lossy()))
        })
        .collect()
}

/// Nothing the playground recorded in `parts` (valkey-server among them,
/// whose rewritten process title does not name `dir`) nor anything naming
/// `dir` is left running; waits up to 20 s for them to go.
fn assert_nothing_left(dir: &Path, parts: &[Part], all: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left_parts: Vec<&Part> = parts.iter().filter(|p| still_running(p)).collect();
        let left = processes_in(dir);
        if left_parts.is_empty() && left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "left running: {left_parts:#?} {left:#?}\n{all}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The playground used the binary cargo built, where cargo put it.
fn assert_used(build: Build, out: &Output) {
    let used = format!("playground: targetlease: {}", build.binary().display());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .any(|l| l == used),
        "expected `{used}`:\n{}",
        text(out)
    );
}

/// Stops what a playground left running, whatever the test's outcome.
struct Cleanup<'a>(&'a Path);
impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = playground(self.0, "stop", Build::DefaultTargetDir).output();
    }
}

#[test]
fn the_playground_shows_a_held_lease_a_leader_with_its_token_and_run() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("pg");
    let _cleanup = Cleanup(&dir);
    let build = Build::CustomTargetDir;
    let out = playground(&dir, "start", build).output().unwrap();
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert_used(build, &out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("orders-db-job-1") && l.contains("Held")),
        "a Held lease in `kubectl get tl`:\n{all}"
    );
    let leader = stdout
        .lines()
        .skip_while(|l| !l.starts_with("== the leader of each election"))
        .find(|l| l.starts_with("web-leader "))
        .unwrap_or_else(|| panic!("the election's leader row:\n{all}"));
    let cols: Vec<&str> = leader.split_whitespace().collect();
    assert!(
        cols.len() == 3 && cols[1].starts_with("web-") && cols[2].parse::<u64>().is_ok(),
        "election, leader pod and its token: {leader:?}\n{all}"
    );
    assert!(
        stdout.contains("running with fencing token ") && stdout.contains(" on nightly-report"),
        "`targetlease run` output:\n{all}"
    );
    let parts = recorded_parts(&dir);
    for name in ["valkey-server", "targetlease", "etcd", "kube-apiserver"] {
        assert!(
            parts.iter().any(|p| p.name == name && still_running(p)),
            "{name} runs: {parts:#?}\n{all}"
        );
    }
    let stop = playground(&dir, "stop", build).output().unwrap();
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(!dir.exists(), "stop removes {}", dir.display());
    assert_nothing_left(&dir, &parts, &all);
}

/// Waits for `path` to exist (or the child to end).
fn wait_for(path: &Path, child: &mut Child, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if path.exists() {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Starts a playground, kills part `victim` (by its pid file in `dir` or
/// `dir/cp`) as soon as the operator has been started, and returns the
/// playground's output and every part it had recorded by then.
fn kill_mid_way(dir: &Path, build: Build, victim: &str) -> (Output, Vec<Part>) {
    let mut child = playground(dir, "start", build).spawn().unwrap();
    assert!(
        wait_for(
            &dir.join("targetlease.pid"),
            &mut child,
            Duration::from_secs(900)
        ),
        "the playground never started its operator:\n{}",
        text(&child.wait_with_output().unwrap())
    );
    // Mid-way: the operator was just started; the playground has not shown
    // anything yet.
    std::thread::sleep(Duration::from_millis(300));
    let parts = recorded_parts(dir);
    let pid = parts
        .iter()
        .find(|p| p.name == victim)
        .unwrap_or_else(|| panic!("no {victim} among {parts:#?}"))
        .pid;
    let killed = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -KILL {pid}");
    (child.wait_with_output().unwrap(), parts)
}

#[test]
fn a_playground_whose_operator_dies_fails_and_leaves_nothing_behind() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("pg");
    let _cleanup = Cleanup(&dir);
    let build = Build::DefaultTargetDir;
    let (out, parts) = kill_mid_way(&dir, build, "targetlease");
    let all = text(&out);
    assert_used(build, &out);
    assert!(
        !out.status.success(),
        "a dead operator must fail it:\n{all}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("targetlease is not running")
            && stderr.contains("was killed by signal 9 (KILL)"),
        "says which part died and how:\n{all}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("== kubectl get tl"),
        "shows nothing after the failure:\n{all}"
    );
    assert!(
        parts.iter().any(|p| p.name == "valkey-server"),
        "valkey-server was recorded: {parts:#?}\n{all}"
    );
    assert_nothing_left(&dir, &parts, &all);
    assert!(!dir.exists(), "the failure removes {}", dir.display());
}

/// The control plane is started by another script, so its parts are not
/// the playground's children: they are watched through their pid files.
#[test]
fn a_playground_whose_api_server_dies_names_it_and_leaves_nothing_behind() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("pg");
    let _cleanup = Cleanup(&dir);
    let (out, parts) = kill_mid_way(&dir, Build::CustomTargetDir, "kube-apiserver");
    let all = text(&out);
    assert!(
        !out.status.success(),
        "a dead API server must fail it:\n{all}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ERROR: kube-apiserver is not running")
            && stderr.contains("----- last 40 lines of ")
            && stderr.contains("kube-apiserver.log -----"),
        "names the API server first, with its log:\n{all}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("== kubectl get tl"),
        "shows nothing after the failure:\n{all}"
    );
    assert_nothing_left(&dir, &parts, &all);
    assert!(!dir.exists(), "the failure removes {}", dir.display());
}
