//! Sentinel: one unhealthy Sentinel must not hide a healthy one.

use super::*;

/// A Sentinel watching `primary_port` as `mymaster`, killed on drop.
struct Sentinel {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    fn start(primary_port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {primary_port} 1\n",
                dir.path().display(),
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

async fn acquire_through_sentinels(
    first: u16,
    second: u16,
    name: &str,
) -> Result<Reply, StoreError> {
    let store = ValkeyStore::connect(&config(format!(
        "redis-sentinel://127.0.0.1:{first}?sentinelServiceName=mymaster&node=127.0.0.1:{second}"
    )))
    .await?;
    store
        .acquire(&AcquireRequest::new(target(name), "a", TTL))
        .await
}

/// docs/valkey.md: "Every new connection asks the Sentinels for the primary";
/// the URL lists several Sentinels so that one being down does not take the
/// lease service down. A first Sentinel that accepts and never answers eats
/// the whole connect deadline: the second, healthy one is never asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_first_sentinel_does_not_hide_a_healthy_second_one() {
    let primary = ValkeyServer::start();
    let good = Sentinel::start(primary.port);
    let silent = FaultProxy::silent();
    let r = acquire_through_sentinels(silent.port(), good.port, "silent-sentinel").await;
    assert!(
        matches!(&r, Ok(reply) if reply.outcome == Outcome::Acquired),
        "a healthy Sentinel and primary were reachable, got {r:?}"
    );
}

/// Same clause: a first Sentinel that still names a primary that is gone
/// (stale view, or it monitors a dead address) ends the connect with an error
/// instead of asking the next Sentinel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_naming_a_dead_primary_does_not_hide_one_naming_the_live_primary() {
    let primary = ValkeyServer::start();
    let stale = Sentinel::start(free_port()); // monitors an address nobody listens on
    let good = Sentinel::start(primary.port);
    let r = acquire_through_sentinels(stale.port, good.port, "stale-sentinel").await;
    assert!(
        matches!(&r, Ok(reply) if reply.outcome == Outcome::Acquired),
        "the second Sentinel names a live primary, got {r:?}"
    );
}

/// A password-protected primary watched by Sentinels that have no password
/// of their own (the usual layout: `sentinel auth-pass` for the data nodes,
/// Sentinels open on a private network). The client sends the data password
/// to the Sentinels too (`AUTH` on every connection of the dialer), which a
/// Sentinel without a password refuses, so the deployment is unusable. There
/// is no way to give Sentinels their own credentials (or none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_without_a_password_in_front_of_a_protected_primary() {
    let primary = ValkeyServer::start_with(&["--requirepass", "s3cret"]);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {} 1\nsentinel auth-pass mymaster s3cret\n",
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
        .unwrap();
    let sentinel = Sentinel {
        child,
        port,
        _dir: dir,
    };
    std::thread::sleep(Duration::from_millis(500));
    let store = ValkeyStore::connect(&ValkeyConfig {
        password: Some(targetlease::store::valkey::Secret::new("s3cret")),
        ..config(format!(
            "redis-sentinel://127.0.0.1:{}?sentinelServiceName=mymaster",
            sentinel.port
        ))
    })
    .await;
    let store = match store {
        Ok(s) => s,
        Err(e) => panic!("sentinel without a password, protected primary: {e}"),
    };
    let r = store
        .acquire(&AcquireRequest::new(target("sentinel-auth"), "a", TTL))
        .await;
    assert!(
        matches!(&r, Ok(reply) if reply.outcome == Outcome::Acquired),
        "{r:?}"
    );
}
