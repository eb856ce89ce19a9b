//! `redis-sentinel://` URLs: the store finds the primary through a real Sentinel.

#[path = "support/resp.rs"]
mod resp;
#[path = "support/valkey_server.rs"]
mod valkey_server;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use resp::Conn;
use targetlease::store::valkey::{ValkeyConfig, ValkeyStore};
use targetlease::store::{AcquireRequest, LeaseStore, Outcome, Target};
use valkey_server::{ValkeyServer, free_port, server_binary};

/// A Sentinel watching one primary as `mymaster`, killed on drop.
struct Sentinel {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    fn start(primary: &ValkeyServer) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {} 1\n",
                dir.path().display(),
                primary.port
            ),
        )
        .unwrap();
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
                && let Ok(r) = c.try_cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"])
                && format!("{r:?}").contains(&primary.port.to_string())
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

#[tokio::test]
async fn leases_work_through_sentinel() {
    let primary = ValkeyServer::start();
    let sentinel = Sentinel::start(&primary);
    let store = ValkeyStore::connect(&ValkeyConfig {
        url: format!(
            "redis-sentinel://127.0.0.1:{}?sentinelServiceName=mymaster",
            sentinel.port
        ),
        ..ValkeyConfig::default()
    })
    .await
    .expect("connect through sentinel");
    let t = Target::new("sentinel", "t");
    let r = store
        .acquire(&AcquireRequest::new(
            t.clone(),
            "a",
            Duration::from_secs(30),
        ))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Acquired);
    // It landed on the primary the sentinel named.
    let fence = store.keys().fence(&t);
    assert_eq!(primary.conn().cmd(&["GET", &fence]).text(), "1");
}
