//! `targetlease run … -- CMD`, on the real binary against a real `valkey-server`
//! (and a real etcd cluster: `etcd.rs`):
//! the child's environment and exit code, waiting for a held target, renewal,
//! stopping the child when the lease is lost, signal forwarding, release.

mod child;
mod etcd;
mod holding;
mod isolation;
mod waiting;
mod wakeups;

pub(crate) use crate::support::deadline;
pub(crate) use crate::support::fault_proxy;
pub(crate) use crate::support::valkey_server;

pub(crate) use std::path::{Path, PathBuf};
pub(crate) use std::process::{Child, Command, Output, Stdio};
pub(crate) use std::time::{Duration, Instant};

pub(crate) use deadline::wait_within;
pub(crate) use serde_json::Value;
pub(crate) use valkey_server::{ValkeyServer, free_port};

pub(crate) use crate::support::cli::{bin, lease, run};

/// `run`'s own exit codes (docs/cli.md): the target stayed held.
pub(crate) const BUSY: i32 = 75;
/// The lease ended while CMD ran.
pub(crate) const LOST: i32 = 124;
/// `run` failed before CMD started (the store could not be used).
pub(crate) const FAILED: i32 = 125;

/// `targetlease <args>` with the server's URL in the environment.
pub(crate) fn tl(url: &str, args: &[&str]) -> Command {
    let mut cmd = crate::support::cli::targetlease(args);
    cmd.env("TARGETLEASE_VALKEY_URL", url);
    cmd
}

/// `lease get` of `target`: its JSON line.
pub(crate) fn get(url: &str, target: &str) -> Value {
    lease(url, "get").target(target).res().json
}

/// Asserts `run` exited with `code`, showing its stderr otherwise.
pub(crate) fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Asserts `run` exited with `code`; its JSON summary.
pub(crate) fn ended(out: &Output, code: i32) -> Value {
    assert_exit(out, code);
    summary(out)
}

/// The JSON summary `run` writes as its last stderr line.
pub(crate) fn summary(out: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or("");
    let j: Value = serde_json::from_str(last)
        .unwrap_or_else(|_| panic!("last stderr line is not JSON: {stderr}"));
    for field in [
        "outcome",
        "lease",
        "server_time_ms",
        "message",
        "exit_code",
        "command_exit_code",
        "lease_lost",
    ] {
        assert!(j.get(field).is_some(), "summary lacks {field}: {last}");
    }
    assert_eq!(
        j["exit_code"].as_i64(),
        out.status.code().map(i64::from),
        "{last}"
    );
    j
}

/// A file CMD may write, in a temporary directory of its own.
pub(crate) struct Scratch {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Scratch {
    pub(crate) fn new(name: &str) -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        Scratch { _dir: dir, path }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// `touch <file>`: a CMD that only shows whether it ran.
    pub(crate) fn touch(&self) -> [&str; 2] {
        ["touch", self.path.to_str().unwrap()]
    }

    pub(crate) fn exists(&self) -> bool {
        self.path.exists()
    }

    /// The file's text once a whole line is there.
    pub(crate) fn wait(&self, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(text) = std::fs::read_to_string(&self.path)
                && text.ends_with('\n')
            {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not appear within {within:?}",
                self.path.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn read(&self) -> String {
        std::fs::read_to_string(&self.path).unwrap()
    }
}

/// A CMD that runs `on_term` on SIGTERM, writes `up` to `started` and then
/// loops until it is killed.
pub(crate) fn looping(on_term: &str, started: &Scratch) -> String {
    format!(
        "trap '{on_term}' TERM; echo up > {}; while :; do sleep 0.1; done",
        started.path().display()
    )
}

/// SIGTERM to a running `targetlease run`.
pub(crate) fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

pub(crate) fn spawn(mut cmd: Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

pub(crate) fn revoke(url: &str, target: &str) {
    lease(url, "revoke").target(target).ok("revoked", 0);
}
