//! `redis-sentinel://` URLs: the store finds the primary through a real Sentinel.

use crate::support::valkey_server;

use std::time::Duration;

use targetlease::store::valkey::{Secret, ValkeyConfig, ValkeyStore};
use targetlease::store::{AcquireRequest, LeaseStore, Outcome, StoreError, Target};
use valkey_server::ValkeyServer;

use crate::support::sentinel::Sentinel;

/// Connects with `url`, acquires `name`, and checks the lease landed on
/// `primary` (its counter there is 1).
async fn acquire_lands_on(url: String, primary: &ValkeyServer, name: &str) {
    let store = ValkeyStore::connect(&ValkeyConfig {
        url,
        ..ValkeyConfig::default()
    })
    .await
    .expect("connect through the Sentinels");
    let t = Target::new("sentinel", name);
    let r = store
        .acquire(&AcquireRequest::new(
            t.clone(),
            "a",
            Duration::from_secs(30),
        ))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Acquired);
    let key = store.keys().target(&t);
    assert_eq!(primary.conn().cmd(&["HGET", &key, "fence"]).text(), "1");
}

#[tokio::test]
async fn leases_work_through_sentinel() {
    let primary = ValkeyServer::start();
    let sentinel = Sentinel::start(&primary);
    let url = format!(
        "redis-sentinel://127.0.0.1:{}?sentinelServiceName=mymaster",
        sentinel.port
    );
    // It lands on the primary the sentinel named.
    acquire_lands_on(url, &primary, "t").await;
}

/// Sentinels and data nodes have their own credentials: a Sentinel with a
/// password of its own in front of a primary with another. Each password
/// goes only where it belongs; without the Sentinel's, the connect is
/// refused with a clear cause, and neither password shows in the message.
#[tokio::test]
async fn sentinels_and_the_primary_each_get_their_own_password() {
    let primary = ValkeyServer::start_with(&["--requirepass", "data-pw-1"]);
    let sentinel = Sentinel::watching(
        primary.port,
        "sentinel auth-pass mymaster data-pw-1\nrequirepass sentinel-pw-2\n",
    );
    let config = |sentinel_password: Option<&str>| ValkeyConfig {
        url: format!(
            "redis-sentinel://127.0.0.1:{}?sentinelServiceName=mymaster",
            sentinel.port
        ),
        password: Some(Secret::new("data-pw-1")),
        sentinel_password: sentinel_password.map(Secret::new),
        ..ValkeyConfig::default()
    };
    let store = ValkeyStore::connect(&config(Some("sentinel-pw-2")))
        .await
        .expect("each password where it belongs");
    let r = store
        .acquire(&AcquireRequest::new(
            Target::new("sentinel", "auth"),
            "a",
            Duration::from_secs(30),
        ))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Acquired);
    match ValkeyStore::connect(&config(None)).await {
        Err(StoreError::BackendUnavailable(msg)) => {
            assert!(msg.contains("sentinel") && msg.contains("NOAUTH"), "{msg}");
            assert!(
                !msg.contains("data-pw-1") && !msg.contains("sentinel-pw-2"),
                "{msg}"
            );
        }
        other => panic!("the Sentinel wants its password: {:?}", other.err()),
    }
}

/// Sentinel credentials with a URL that does not use Sentinel are a mistake
/// in the configuration, refused before anything connects.
#[tokio::test]
async fn sentinel_credentials_need_a_sentinel_url() {
    let r = ValkeyStore::connect(&ValkeyConfig {
        url: "redis://127.0.0.1:1".into(),
        sentinel_password: Some(Secret::new("x")),
        ..ValkeyConfig::default()
    })
    .await;
    match r {
        Err(StoreError::Invalid(msg)) => assert!(msg.contains("redis-sentinel://"), "{msg}"),
        other => panic!("expected invalid, got {:?}", other.err()),
    }
}

/// A stand-in Sentinel that names `named` as the primary of anything.
fn fake_sentinel(named: u16) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for sock in listener.incoming() {
            let Ok(mut sock) = sock else { return };
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut buf = [0u8; 4096];
                // One command per read: the client waits for each answer.
                while let Ok(n) = sock.read(&mut buf) {
                    let got = String::from_utf8_lossy(&buf[..n]).to_uppercase();
                    let answer = if n == 0 {
                        return;
                    } else if got.contains("SENTINEL") {
                        let port = named.to_string();
                        format!("*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{port}\r\n", port.len())
                    } else if got.contains("PING") {
                        "+PONG\r\n".into()
                    } else {
                        "-ERR unexpected\r\n".into()
                    };
                    if sock.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// A Sentinel that names a server which says it is not a primary (`ROLE`:
/// a replica, e.g. a stale view after a failover) does not end the connect:
/// the next Sentinel is asked, and the lease lands on the real primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_naming_a_replica_does_not_hide_the_next_one() {
    let primary = ValkeyServer::start();
    let replica =
        ValkeyServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let stale = fake_sentinel(replica.port);
    let good = Sentinel::start(&primary);
    let url = format!(
        "redis-sentinel://127.0.0.1:{stale}?sentinelServiceName=mymaster&node=127.0.0.1:{}",
        good.port
    );
    acquire_lands_on(url, &primary, "after-a-replica").await;
}

/// A Sentinel that names another Sentinel as the primary (a monitor line
/// pointing at the wrong port) is refused in words, and the named Sentinel
/// is never sent the data nodes' password: one that takes no password is
/// asked its role before `AUTH`, one listed in the URL is not connected to
/// as a data node at all (the next Sentinel is asked instead). Each
/// Sentinel's ACL log would show an `AUTH` with the data nodes' user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_named_as_the_primary_is_refused_and_never_sent_the_password() {
    use crate::support::resp::Resp;
    let primary = ValkeyServer::start();
    let user = [
        "ACL", "SETUSER", "app", "on", ">data-pw", "~*", "&*", "+@all",
    ];
    assert_eq!(primary.conn().cmd(&user).text(), "OK");
    let config = |url: String, sentinel_password: Option<&str>| ValkeyConfig {
        url,
        username: Some("app".into()),
        password: Some(Secret::new("data-pw")),
        sentinel_password: sentinel_password.map(Secret::new),
        ..ValkeyConfig::default()
    };
    let acl_log = |port: u16, password: Option<&str>| {
        let mut c = crate::support::resp::Conn::connect(&format!("127.0.0.1:{port}")).unwrap();
        if let Some(pw) = password {
            assert_eq!(c.cmd(&["AUTH", pw]).text(), "OK");
        }
        match c.cmd(&["ACL", "LOG"]) {
            Resp::Array(Some(entries)) => entries,
            other => panic!("ACL LOG: {other:?}"),
        }
    };

    // An open Sentinel named by the only one in the URL.
    let named = Sentinel::start(&primary);
    let naming = Sentinel::watching(named.port, "");
    let url = format!(
        "redis-sentinel://127.0.0.1:{}?sentinelServiceName=mymaster",
        naming.port
    );
    match ValkeyStore::connect(&config(url, None)).await {
        Err(StoreError::BackendUnavailable(msg)) => {
            assert!(msg.contains("it is a Sentinel, not a primary"), "{msg}");
            assert!(!msg.contains("data-pw"), "{msg}");
        }
        other => panic!("a Sentinel was used as the primary: {:?}", other.err()),
    }
    assert_eq!(acl_log(named.port, None), [], "the named Sentinel got AUTH");

    // Sentinels that take a password (which cannot be told from a data
    // node before AUTH): the named one is in the URL, so it is skipped as a
    // primary and asked in turn, and it names the real primary.
    let extra = "requirepass sentinel-pw\n";
    let named = Sentinel::watching(primary.port, extra);
    let naming = Sentinel::watching(named.port, extra);
    let url = format!(
        "redis-sentinel://127.0.0.1:{}?sentinelServiceName=mymaster&node=127.0.0.1:{}",
        naming.port, named.port
    );
    let store = ValkeyStore::connect(&config(url, Some("sentinel-pw")))
        .await
        .expect("the next Sentinel names the real primary");
    let r = store
        .acquire(&AcquireRequest::new(
            Target::new("sentinel", "named-a-sentinel"),
            "a",
            Duration::from_secs(30),
        ))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Acquired);
    assert_eq!(
        acl_log(named.port, Some("sentinel-pw")),
        [],
        "the named Sentinel got AUTH"
    );
}
