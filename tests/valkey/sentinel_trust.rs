//! What a Sentinel names is not trusted by itself: over TLS the named server
//! must prove a certificate from the configured CA for the expected name
//! before it is sent the data nodes' password, and a named server that says
//! it is not the primary is sent nothing but the handshake and the question.

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use targetlease::store::valkey::{Secret, TlsFiles, ValkeyConfig, ValkeyStore};
use targetlease::store::{AcquireRequest, LeaseStore, Outcome, StoreError, Target};

use crate::support::process::start_ready;
use crate::support::recording_server::{RecordingServer, bulk};
use crate::support::tls::{Issued, TestCa, TlsServer};
use crate::support::tools::tool;
use crate::support::valkey_server::{ValkeyServer, free_port};

const PASSWORD: &str = "data-node-pw-canary";

/// A Sentinel that names `127.0.0.1:port` as the primary of anything.
fn names(port: u16) -> impl Fn(&str) -> String + Send + Sync + 'static {
    move |cmd| {
        if cmd.starts_with("SENTINEL GET-MASTER-ADDR-BY-NAME") {
            format!("*2\r\n{}{}", bulk("127.0.0.1"), bulk(&port.to_string()))
        } else if cmd.starts_with("PING") {
            "+PONG\r\n".into()
        } else {
            "-ERR unexpected\r\n".into()
        }
    }
}

/// A server that takes any password and answers `ROLE` with `role` (a
/// refusal when `None`) and `INFO replication` with `info_role`.
fn data_node(
    role: Option<&'static str>,
    info_role: &'static str,
) -> impl Fn(&str) -> String + Send + Sync + 'static {
    move |cmd| match cmd.split(' ').next().unwrap_or_default() {
        "AUTH" => "+OK\r\n".into(),
        "PING" => "+PONG\r\n".into(),
        "ROLE" => match role {
            Some("master") => format!("*3\r\n{}:0\r\n*0\r\n", bulk("master")),
            Some(r) => format!(
                "*5\r\n{}{}:6379\r\n{}:0\r\n",
                bulk(r),
                bulk("10.0.0.9"),
                bulk("connected")
            ),
            None => "-NOPERM this user has no permissions to run the 'role' command\r\n".into(),
        },
        "INFO" => bulk(&format!("# Replication\r\nrole:{info_role}\r\n")),
        _ => "-ERR unexpected\r\n".into(),
    }
}

fn sentinel_config(sentinel_port: u16, tls: Option<TlsFiles>) -> ValkeyConfig {
    let scheme = if tls.is_some() {
        "valkeys-sentinel"
    } else {
        "valkey-sentinel"
    };
    ValkeyConfig {
        url: format!("{scheme}://127.0.0.1:{sentinel_port}?sentinelServiceName=mymaster"),
        password: Some(Secret::new(PASSWORD)),
        tls: tls.unwrap_or_default(),
        connect_timeout: Duration::from_secs(3),
        ..ValkeyConfig::default()
    }
}

fn trusting(ca: &TestCa, server_name: Option<&str>) -> Option<TlsFiles> {
    Some(TlsFiles {
        ca_file: Some(ca.ca_file()),
        server_name: server_name.map(String::from),
        ..TlsFiles::default()
    })
}

async fn refused(cfg: &ValkeyConfig) -> String {
    match ValkeyStore::connect(cfg).await {
        Err(StoreError::BackendUnavailable(msg)) => {
            assert!(!msg.contains(PASSWORD), "{msg}");
            msg
        }
        Err(e) => panic!("expected backend_unavailable, got {e:?}"),
        Ok(_) => panic!("connected through a Sentinel that named an untrusted server"),
    }
}

/// A Sentinel (itself trusted: its certificate is from the configured CA)
/// names a server whose certificate comes from another CA. The server is
/// reached, but the handshake fails on its certificate and it never gets
/// the password, neither in the clear nor inside TLS; nor does the Sentinel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_server_with_another_cas_certificate_never_receives_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "trusted");
    let other = TestCa::new(dir.path(), "other");
    let rogue_cert = other.issue("rogue", &["127.0.0.1"], false);
    let rogue = RecordingServer::start(Some(&rogue_cert), data_node(Some("master"), "master"));
    let sentinel_cert = ca.issue("sentinel", &["127.0.0.1"], false);
    let sentinel = RecordingServer::start(Some(&sentinel_cert), names(rogue.port));

    let msg = refused(&sentinel_config(sentinel.port, trusting(&ca, None))).await;
    let got = &rogue.received;
    assert!(!got.saw(PASSWORD), "the rogue received the password");
    assert!(
        got.connections.load(Ordering::SeqCst) >= 1,
        "the client never went to the named server: this test would prove nothing"
    );
    assert_eq!(got.handshakes.load(Ordering::SeqCst), 0);
    assert!(
        got.commands().is_empty(),
        "the rogue got {:?}",
        got.commands()
    );
    assert!(
        msg.contains("not signed by a trusted certificate authority"),
        "{msg}"
    );
    assert!(
        sentinel
            .received
            .commands()
            .iter()
            .any(|c| c == "SENTINEL GET-MASTER-ADDR-BY-NAME"),
        "{:?}",
        sentinel.received.commands()
    );
    assert!(
        !sentinel.received.saw(PASSWORD),
        "a Sentinel got the password"
    );
}

/// What TLS proves, and no more: a named server with a certificate from the
/// configured CA for the host the Sentinel named gets `AUTH` (so the CA must
/// issue data-node certificates only to data nodes), while
/// `--tls-server-name` narrows it to certificates for that one name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ca_and_the_expected_name_are_what_a_named_server_must_prove() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "trusted");
    let impostor_cert = ca.issue("impostor", &["127.0.0.1"], false);
    let impostor = RecordingServer::start(Some(&impostor_cert), data_node(Some("master"), ""));
    let sentinel_cert = ca.issue("sentinel", &["127.0.0.1", "valkey.internal"], false);
    let sentinel = RecordingServer::start(Some(&sentinel_cert), names(impostor.port));

    // Pinned to the data nodes' name: the impostor's certificate (for
    // 127.0.0.1) is refused before anything is sent.
    let pinned = sentinel_config(sentinel.port, trusting(&ca, Some("valkey.internal")));
    let msg = refused(&pinned).await;
    assert!(msg.contains("not valid for"), "{msg}");
    assert!(impostor.received.connections.load(Ordering::SeqCst) >= 1);
    assert!(!impostor.received.saw(PASSWORD));
    assert!(impostor.received.commands().is_empty());

    // Not pinned: a certificate from the CA for the named address is all it
    // takes (the recorder does see what a trusted server is sent).
    let _ = ValkeyStore::connect(&sentinel_config(sentinel.port, trusting(&ca, None))).await;
    assert!(
        impostor.received.saw(PASSWORD),
        "{:?}",
        impostor.received.commands()
    );
}

/// TLS through Sentinels with only the system roots would let a Sentinel
/// name any server with a public certificate for a name of its choosing:
/// it is refused before anything connects.
#[tokio::test]
async fn tls_through_sentinels_needs_a_ca_file_or_a_server_name() {
    let sentinel = RecordingServer::start(None, names(1));
    match ValkeyStore::connect(&sentinel_config(sentinel.port, Some(TlsFiles::default()))).await {
        Err(StoreError::Invalid(msg)) => {
            assert!(
                msg.contains("--tls-ca-file") && msg.contains("--tls-server-name"),
                "{msg}"
            )
        }
        Err(e) => panic!("expected invalid settings, got {e:?}"),
        Ok(_) => panic!("connected with the system roots through a Sentinel"),
    }
    assert_eq!(sentinel.received.connections.load(Ordering::SeqCst), 0);
}

/// A named server that says it is not the primary — by `ROLE`, or by `INFO
/// replication` when `ROLE` is not granted (the documented ACL rule grants
/// `INFO`) — is sent nothing after the question: no script, no write. A
/// server that says it is the primary does get the scripts (so the recorder
/// would have seen them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_server_that_is_not_the_primary_is_sent_nothing_after_the_question() {
    let allowed = |c: &String| c.starts_with("AUTH") || c == "ROLE" || c == "INFO REPLICATION";
    for (role, info, asked) in [
        (Some("slave"), "", "ROLE"),
        (None, "slave", "INFO REPLICATION"),
        (Some("sentinel"), "", "ROLE"),
    ] {
        let node = RecordingServer::start(None, data_node(role, info));
        let sentinel = RecordingServer::start(None, names(node.port));
        let msg = refused(&sentinel_config(sentinel.port, None)).await;
        assert!(msg.contains("not a primary"), "{role:?}/{info}: {msg}");
        let seen = node.received.commands();
        assert!(seen.iter().any(|c| c == asked), "{seen:?}");
        assert!(seen.iter().all(allowed), "{role:?}/{info}: sent {seen:?}");
    }
    // The control: a primary by either answer is asked for the library.
    for (role, info) in [(Some("master"), ""), (None, "master")] {
        let node = RecordingServer::start(None, data_node(role, info));
        let sentinel = RecordingServer::start(None, names(node.port));
        let _ = ValkeyStore::connect(&sentinel_config(sentinel.port, None)).await;
        let seen = node.received.commands();
        assert!(
            seen.iter().any(|c| c == "FUNCTION LIST"),
            "{role:?}/{info}: {seen:?}"
        );
    }
}

/// The same on real servers with the documented ACL user, which may ask
/// `INFO` but not `ROLE`: a Sentinel naming a replica gets no lease on it,
/// one naming the primary does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_user_checks_the_role_of_a_real_replica() {
    let rule = include_str!("../../docs/valkey.md")
        .lines()
        .find(|l| l.starts_with("ACL SETUSER targetlease "))
        .expect("docs/valkey.md has the rule")
        .replace(">CHANGE-ME", &format!(">{PASSWORD}"));
    let rule: Vec<&str> = rule.split_whitespace().collect();
    let primary = ValkeyServer::start();
    let replica =
        ValkeyServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    for server in [&primary, &replica] {
        assert_eq!(server.conn().cmd(&rule).text(), "OK");
    }
    // So the answer comes from INFO: the documented user may not ask ROLE.
    let mut user = replica.conn();
    assert_eq!(user.cmd(&["AUTH", "targetlease", PASSWORD]).text(), "OK");
    assert!(
        matches!(user.cmd(&["ROLE"]), crate::support::resp::Resp::Error(_)),
        "the documented rule grants ROLE: this test no longer covers INFO"
    );
    let config = |port: u16| ValkeyConfig {
        username: Some("targetlease".into()),
        ..sentinel_config(port, None)
    };
    let to_replica = RecordingServer::start(None, names(replica.port));
    match ValkeyStore::connect(&config(to_replica.port)).await {
        Err(StoreError::BackendUnavailable(msg)) => {
            assert!(msg.contains("not a primary (its role: slave)"), "{msg}")
        }
        other => panic!("a replica was used: {:?}", other.err()),
    }
    let to_primary = RecordingServer::start(None, names(primary.port));
    let store = ValkeyStore::connect(&config(to_primary.port))
        .await
        .expect("the primary, with the documented user");
    let r = store
        .acquire(&AcquireRequest::new(
            Target::new("sentinel", "acl"),
            "a",
            Duration::from_secs(30),
        ))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Acquired);
}

/// A real Sentinel over TLS (apt's `redis-server --sentinel`, built with
/// TLS) serving `cert`, watching over TLS the primary on `primary_port`,
/// whose certificate it checks against `primary_ca`. Returns it and its port.
fn tls_sentinel(
    dir: &std::path::Path,
    cert: &Issued,
    primary_ca: &TestCa,
    primary_port: u16,
) -> (std::process::Child, u16) {
    let port = free_port();
    let conf = dir.join(format!("sentinel-{port}.conf"));
    std::fs::write(
        &conf,
        format!(
            "port 0\ntls-port {port}\nbind 127.0.0.1\ndir {}\ntls-cert-file {}\ntls-key-file {}\n\
             tls-ca-cert-file {}\ntls-auth-clients no\ntls-replication yes\n\
             sentinel monitor mymaster 127.0.0.1 {primary_port} 1\nsentinel auth-pass mymaster {PASSWORD}\n",
            dir.display(),
            cert.cert.display(),
            cert.key.display(),
            primary_ca.ca_file().display(),
        ),
    )
    .unwrap();
    let child = start_ready(
        &format!("TLS sentinel on port {port}"),
        Command::new(tool("redis-server"))
            .arg(&conf)
            .arg("--sentinel"),
        &dir.join(format!("sentinel-{port}.log")),
        Duration::from_secs(10),
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
    );
    (child, port)
}

async fn acquire_through(cfg: &ValkeyConfig, target: &str) -> Result<Outcome, StoreError> {
    let store = ValkeyStore::connect(cfg).await?;
    let r = store
        .acquire(&AcquireRequest::new(
            Target::new("sentinel", target),
            "a",
            Duration::from_secs(30),
        ))
        .await?;
    store.close().await;
    Ok(r.outcome)
}

/// A real Sentinel over TLS (watching over TLS a `valkey-server` behind
/// `stunnel`), each with a certificate from the configured CA: leases work
/// through `valkeys-sentinel://`, with the data nodes' password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_work_through_sentinels_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "trusted");
    let primary = TlsServer::start(&ca, &["127.0.0.1"], false, &["--requirepass", PASSWORD]);
    let cert = ca.issue("sentinel", &["127.0.0.1"], false);
    let (mut sentinel, port) = tls_sentinel(dir.path(), &cert, &ca, primary.port);
    let result = acquire_through(&sentinel_config(port, trusting(&ca, None)), "tls").await;
    let _ = sentinel.kill();
    let _ = sentinel.wait();
    match result {
        Ok(outcome) => assert_eq!(outcome, Outcome::Acquired),
        Err(e) => panic!("through a TLS Sentinel: {e}"),
    }
}

/// Sentinels with certificates from a CA of their own, data nodes from
/// another: the Sentinels are verified with their own settings
/// (`--sentinel-tls-*`) and the data nodes with theirs, so neither CA
/// vouches for the other kind of server. Without the Sentinels' own CA the
/// data nodes' CA does not accept them; Sentinel TLS settings with a URL
/// that is not `valkeys-sentinel://` are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_are_verified_with_tls_settings_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let data_ca = TestCa::new(dir.path(), "data");
    let sentinel_ca = TestCa::new(dir.path(), "sentinels");
    let primary = TlsServer::start(
        &data_ca,
        &["127.0.0.1"],
        false,
        &["--requirepass", PASSWORD],
    );
    let cert = sentinel_ca.issue("sentinel", &["127.0.0.1", "sentinel.internal"], false);
    let (mut sentinel, port) = tls_sentinel(dir.path(), &cert, &data_ca, primary.port);
    let own = |server_name: Option<&str>| ValkeyConfig {
        sentinel_tls: TlsFiles {
            ca_file: Some(sentinel_ca.ca_file()),
            server_name: server_name.map(String::from),
            ..TlsFiles::default()
        },
        ..sentinel_config(port, trusting(&data_ca, None))
    };
    let with_their_own = acquire_through(&own(None), "own-ca").await;
    let pinned = acquire_through(&own(Some("sentinel.internal")), "own-name").await;
    let wrong_name = acquire_through(&own(Some("valkey.internal")), "wrong-name").await;
    let with_the_data_nodes_ca =
        acquire_through(&sentinel_config(port, trusting(&data_ca, None)), "data-ca").await;
    let _ = sentinel.kill();
    let _ = sentinel.wait();
    for (what, r) in [("their own CA", with_their_own), ("their own name", pinned)] {
        match r {
            Ok(outcome) => assert_eq!(outcome, Outcome::Acquired, "{what}"),
            Err(e) => panic!("Sentinels verified with {what}: {e}"),
        }
    }
    for (r, words) in [
        (wrong_name, "not valid for"),
        (
            with_the_data_nodes_ca,
            "not signed by a trusted certificate authority",
        ),
    ] {
        match r {
            Err(StoreError::BackendUnavailable(msg)) => {
                assert!(msg.contains(words) && msg.contains("sentinel"), "{msg}");
                assert!(!msg.contains(PASSWORD), "{msg}");
            }
            other => panic!("a Sentinel was accepted without proving itself: {other:?}"),
        }
    }

    let not_tls = ValkeyConfig {
        sentinel_tls: TlsFiles {
            ca_file: Some(sentinel_ca.ca_file()),
            ..TlsFiles::default()
        },
        ..sentinel_config(port, None)
    };
    match ValkeyStore::connect(&not_tls).await {
        Err(StoreError::Invalid(msg)) => assert!(msg.contains("valkeys-sentinel://"), "{msg}"),
        other => panic!("expected invalid settings, got {:?}", other.err()),
    }
}
