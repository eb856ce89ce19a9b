//! A real Valkey Sentinel on a loopback port, watching one primary as
//! `mymaster`. Killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
        let child = Command::new(server_binary())
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start valkey-server --sentinel");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = Conn::connect(&format!("127.0.0.1:{port}"))
                && password
                    .as_deref()
                    .is_none_or(|pw| c.try_cmd(&["AUTH", pw]).is_ok())
                && let Ok(r) = c.try_cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"])
                && format!("{r:?}").contains(&primary_port.to_string())
            {
                break;
            }
            assert!(Instant::now() < deadline, "sentinel did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
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
