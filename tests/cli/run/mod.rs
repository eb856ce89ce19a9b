//! `targetlease run … -- CMD`, on the real binary against a real `valkey-server`:
//! the child's environment and exit code, waiting for a held target, renewal,
//! stopping the child when the lease is lost, signal forwarding, release.

mod child;
mod holding;
mod waiting;

pub(crate) use crate::support::deadline;
pub(crate) use crate::support::fault_proxy;
pub(crate) use crate::support::valkey_server;

pub(crate) use std::path::{Path, PathBuf};
pub(crate) use std::process::{Child, Command, Output, Stdio};
pub(crate) use std::time::{Duration, Instant};

pub(crate) use serde_json::Value;
pub(crate) use valkey_server::{ValkeyServer, free_port};

pub(crate) use crate::support::cli::{BIN, run};

/// `targetlease <args>` with the server's URL in the environment.
pub(crate) fn tl(url: &str, args: &[&str]) -> Command {
    let mut cmd = crate::support::cli::targetlease(args);
    cmd.env("TARGETLEASE_VALKEY_URL", url);
    cmd
}

pub(crate) fn lease_json(url: &str, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["lease"];
    all.extend_from_slice(args);
    let out = tl(url, &all).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "not JSON: {stdout} / {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap(), json)
}

pub(crate) fn get(url: &str, target: &str) -> Value {
    lease_json(url, &["get", "--target", target]).1
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

pub(crate) fn wait_for_file(path: &Path, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} did not appear within {within:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn wait_child(child: &mut Child, within: Duration) -> Output {
    let deadline = Instant::now() + within;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("targetlease run did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = Output {
        status: child.wait().unwrap(),
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    use std::io::Read;
    if let Some(mut s) = child.stdout.take() {
        s.read_to_end(&mut out.stdout).unwrap();
    }
    if let Some(mut s) = child.stderr.take() {
        s.read_to_end(&mut out.stderr).unwrap();
    }
    out
}

pub(crate) fn spawn(mut cmd: Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

pub(crate) fn tmp_file(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

pub(crate) fn hold(url: &str, target: &str, owner: &str) -> Value {
    let (code, j) = lease_json(
        url,
        &[
            "acquire", "--target", target, "--owner", owner, "--ttl", "60s",
        ],
    );
    assert_eq!(code, 0, "{j}");
    j
}

pub(crate) fn revoke(url: &str, target: &str) {
    let (code, j) = lease_json(url, &["revoke", "--target", target, "--reason", "test"]);
    assert_eq!(code, 0, "{j}");
}

pub(crate) const QUICK: [&str; 4] = ["--timeout", "1s", "--connect-timeout", "1s"];
