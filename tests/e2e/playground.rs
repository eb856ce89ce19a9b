//! `scripts/playground.sh`, the README's first command, as a newcomer runs
//! it: it shows a Held lease, each election's leader with its token and
//! `targetlease run`'s output; and when a part it started dies, it says
//! which, exits non-zero and leaves no process of its own behind. The tests
//! hand it the binary cargo built for them (`PLAYGROUND_BIN`): a nested
//! `cargo build` would rewrite that binary while other tests run it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn playground(dir: &Path, arg: &str) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("scripts/playground.sh"))
        .arg(arg)
        .env("PLAYGROUND_DIR", dir)
        .env("PLAYGROUND_BIN", env!("CARGO_BIN_EXE_targetlease"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Processes whose command line names `dir` (what the playground started
/// there: valkey-server, the operator, the control plane, its watchdog).
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

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Stops what a playground left running, whatever the test's outcome.
struct Cleanup<'a>(&'a Path);
impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = playground(self.0, "stop").output();
    }
}

#[test]
fn the_playground_shows_a_held_lease_a_leader_with_its_token_and_run() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("pg");
    let _cleanup = Cleanup(&dir);
    let out = playground(&dir, "start").output().unwrap();
    let all = text(&out);
    assert!(out.status.success(), "{all}");
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
    let stop = playground(&dir, "stop").output().unwrap();
    assert!(stop.status.success(), "{}", text(&stop));
    assert!(!dir.exists(), "stop removes {}", dir.display());
    let left = processes_in(&dir);
    assert!(left.is_empty(), "left running after stop: {left:#?}");
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

#[test]
fn a_playground_whose_operator_dies_fails_and_leaves_nothing_behind() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("pg");
    let _cleanup = Cleanup(&dir);
    let mut child = playground(&dir, "start").spawn().unwrap();
    let pidfile = dir.join("targetlease.pid");
    assert!(
        wait_for(&pidfile, &mut child, Duration::from_secs(600)),
        "the playground never started its operator:\n{}",
        text(&child.wait_with_output().unwrap())
    );
    // Mid-way: the operator was just started; the playground has not shown
    // anything yet.
    std::thread::sleep(Duration::from_millis(300));
    let pid = std::fs::read_to_string(&pidfile).unwrap();
    let killed = Command::new("kill")
        .args(["-KILL", pid.trim()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -KILL {pid}");
    let out = child.wait_with_output().unwrap();
    let all = text(&out);
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
    // The control plane's watchdog may take a second to go.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut left = processes_in(&dir);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        left = processes_in(&dir);
    }
    assert!(
        left.is_empty(),
        "left running after the failure: {left:#?}\n{all}"
    );
    assert!(!dir.exists(), "the failure removes {}", dir.display());
}
