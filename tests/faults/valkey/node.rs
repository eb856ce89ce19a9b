//! One `valkey-server` process the harness can kill, restart, pause and run
//! under libfaketime: unlike `support::valkey_server`, it takes extra
//! environment variables (LD_PRELOAD) and can run as a Sentinel.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use crate::support::process::start_ready;
use crate::support::resp::{Conn, Resp};
use crate::support::valkey_server::{answers, free_port, server_binary};

/// A server or sentinel, killed on drop.
pub struct Node {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    args: Vec<String>,
    env: Vec<(String, String)>,
    sentinel: bool,
}

impl Node {
    /// A server with these extra `--option value` arguments and environment.
    pub fn server(args: &[String], env: &[(String, String)]) -> Self {
        Self::spawned(args, env, false)
    }

    /// A Sentinel monitoring `mymaster` at `primary_port` (quorum 1), with
    /// fast failure detection (3 s: with 1 s, a freshly promoted primary on a
    /// loaded machine was declared down before its first ping reply, and the
    /// second promotion picked a replica still holding stale data).
    pub fn sentinel(primary_port: u16) -> Self {
        Self::spawned(&[primary_port.to_string()], &[], true)
    }

    fn spawned(args: &[String], env: &[(String, String)], sentinel: bool) -> Self {
        let mut n = Self {
            child: None,
            port: free_port(),
            dir: tempfile::tempdir().expect("tempdir"),
            args: args.to_vec(),
            env: env.to_vec(),
            sentinel,
        };
        n.spawn();
        n
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(server_binary());
        if self.sentinel {
            let conf = self.dir.path().join("sentinel.conf");
            if !conf.exists() {
                let primary = &self.args[0];
                std::fs::write(
                    &conf,
                    format!(
                        "port {}\nbind 127.0.0.1\ndir {}\n\
                         sentinel monitor mymaster 127.0.0.1 {primary} 1\n\
                         sentinel down-after-milliseconds mymaster 3000\n\
                         sentinel failover-timeout mymaster 10000\n\
                         sentinel parallel-syncs mymaster 1\nlogfile {}\n",
                        self.port,
                        self.dir.path().display(),
                        self.log().display()
                    ),
                )
                .expect("write sentinel.conf");
            }
            cmd.arg(conf).arg("--sentinel");
        } else {
            cmd.arg("--port")
                .arg(self.port.to_string())
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(self.dir.path())
                .arg("--logfile")
                .arg(self.log())
                .args(&self.args);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Its log: the server's own (`logfile`) with its stdout and stderr
    /// (what it says before it opens the log file, e.g. a bad option).
    fn log(&self) -> PathBuf {
        self.dir.path().join("valkey.log")
    }

    fn spawn(&mut self) {
        let port = self.port;
        let role = if self.sentinel {
            "sentinel"
        } else {
            "valkey-server"
        };
        self.child = Some(start_ready(
            &format!("{role} on port {port}"),
            &mut self.command(),
            &self.log(),
            Duration::from_secs(20),
            || answers(port),
        ));
    }

    /// The server's working directory (`--dir`: its AOF and log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// SIGKILL the server and every process it forked (an AOF rewrite
    /// child would go on writing after the power went).
    pub fn kill_all(&mut self) {
        let Some(pid) = self.pid() else { return };
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        self.kill();
        for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// Starts a killed server again (same port, directory, arguments and
    /// environment).
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "the server is still running");
        self.spawn();
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// One command on a fresh connection; None when the node does not answer.
    pub fn try_cmd(&self, args: &[&str]) -> Option<Resp> {
        Conn::connect(&self.addr()).ok()?.try_cmd(args).ok()
    }

    /// SIGKILL: no shutdown, no save.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`): the process keeps its sockets
    /// but reads nothing while stopped.
    pub fn freeze(&self, stopped: bool) {
        use nix::sys::signal::{Signal, kill};
        let Some(c) = &self.child else { return };
        let sig = if stopped {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        let _ = kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
    }

    /// Replaces the extra arguments used by the next (re)start.
    pub fn set_args(&mut self, args: &[String]) {
        self.args = args.to_vec();
    }

    /// Starts again on the same port, directory, arguments and environment.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
        if crate::config::get().keep_servers {
            let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir"));
            eprintln!("  kept {} (port {})", dir.keep().display(), self.port);
        }
    }
}
