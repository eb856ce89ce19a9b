//! A real Valkey Sentinel on a loopback port, watching one primary as
//! `mymaster`. Killed on drop.

use std::process::{Child, Command};
use std::time::Duration;

use super::process::start_ready;
use super::resp::Conn;
use super::valkey_server::{ValkeyServer, free_port, server_binary};

/// A running `valkey-server --sentinel`.
pub struct Sentinel {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    /// A Sentinel watching `primary`.
    pub fn start(primary: &ValkeyServer) -> Self {
        Self::watching(primary.port, "")
    }

    /// A Sentinel watching whatever listens on `primary_port`, with extra
    /// lines in its configuration file (a `requirepass` line is used to
    /// check that it is up).
    pub fn watching(primary_port: u16, extra_conf: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {primary_port} 1\n{extra_conf}",
                dir.path().display(),
            ),
        )
        .unwrap();
        let password = extra_conf
            .lines()
            .find_map(|l| l.strip_prefix("requirepass "))
            .map(str::to_owned);
        let up = || {
            Conn::connect(&format!("127.0.0.1:{port}")).is_ok_and(|mut c| {
                password
                    .as_deref()
                    .is_none_or(|pw| c.try_cmd(&["AUTH", pw]).is_ok())
                    && c.try_cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"])
                        .is_ok_and(|r| format!("{r:?}").contains(&primary_port.to_string()))
            })
        };
        let child = start_ready(
            &format!("sentinel on port {port} (watching port {primary_port})"),
            Command::new(server_binary()).arg(&conf).arg("--sentinel"),
            &dir.path().join("sentinel.log"),
            Duration::from_secs(10),
            up,
        );
        Self {
            child,
            port,
            _dir: dir,
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
