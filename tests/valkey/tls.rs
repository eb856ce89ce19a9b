//! TLS against a real TLS-only server: verification always on, CA, server
//! name override and mutual TLS.

use crate::support::tls;
use crate::support::valkey_server;

use std::time::Duration;

use targetlease::store::valkey::{Secret, TlsFiles, ValkeyConfig, ValkeyStore};
use targetlease::store::{AcquireRequest, LeaseStore, Outcome, StoreError, Target};
use tls::{TestCa, TlsServer};

const PASSWORD: &str = "tls-test-password-Zq81";

fn config(url: String, tls: TlsFiles) -> ValkeyConfig {
    ValkeyConfig {
        url,
        tls,
        connect_timeout: Duration::from_secs(3),
        ..ValkeyConfig::default()
    }
}

async fn acquire_works(cfg: &ValkeyConfig) {
    let store = ValkeyStore::connect(cfg)
        .await
        .unwrap_or_else(|e| panic!("TLS connect failed: {e}"));
    let r = store
        .acquire(&AcquireRequest::new(
            Target::new("tls", "t"),
            "alice",
            Duration::from_secs(30),
        ))
        .await
        .expect("acquire over TLS");
    assert_eq!(r.outcome, Outcome::Acquired);
    store.close().await;
}

/// Connecting fails as backend_unavailable, for the reason named by `why`.
async fn refused(cfg: &ValkeyConfig, why: &str) -> String {
    match ValkeyStore::connect(cfg).await {
        Ok(_) => panic!("connection must fail with {cfg:?}"),
        Err(e @ StoreError::BackendUnavailable(_)) => {
            let msg = e.to_string();
            assert!(msg.contains(why), "expected {why:?} in {msg}");
            // A sentence for people, not the TLS library's variant names.
            for name in [
                "UnknownIssuer",
                "CertificateRequired",
                "UnknownCA",
                "DnsName",
                "Alert",
            ] {
                assert!(!msg.contains(name), "{name} in {msg}");
            }
            msg
        }
        Err(e) => panic!("expected backend_unavailable, got {e:?}"),
    }
}

#[tokio::test]
async fn right_ca_works() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "good");
    let server = TlsServer::start(&ca, &["127.0.0.1"], false, &[]);
    let cfg = config(
        server.url(),
        TlsFiles {
            ca_file: Some(ca.ca_file()),
            ..TlsFiles::default()
        },
    );
    acquire_works(&cfg).await;
}

#[tokio::test]
async fn wrong_ca_fails_closed_and_shows_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "good");
    let other = TestCa::new(dir.path(), "other");
    let server = TlsServer::start(&ca, &["127.0.0.1"], false, &["--requirepass", PASSWORD]);
    let mut cfg = config(
        server.url(),
        TlsFiles {
            ca_file: Some(other.ca_file()),
            ..TlsFiles::default()
        },
    );
    cfg.password = Some(Secret::new(PASSWORD));
    let msg = refused(&cfg, "not signed by a trusted certificate authority").await;
    assert!(!msg.contains(PASSWORD), "{msg}");
    assert!(!format!("{cfg:?}").contains(PASSWORD));

    // The same settings with the right CA do get through: the refusal was the CA.
    cfg.tls.ca_file = Some(ca.ca_file());
    acquire_works(&cfg).await;
}

#[tokio::test]
async fn hostname_mismatch_fails_and_server_name_override_fixes_it() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "good");
    // The certificate names a DNS name only; the URL names an IP.
    let server = TlsServer::start(&ca, &["valkey.test"], false, &[]);
    let mut cfg = config(
        server.url(),
        TlsFiles {
            ca_file: Some(ca.ca_file()),
            ..TlsFiles::default()
        },
    );
    refused(&cfg, "not valid for name").await;
    cfg.tls.server_name = Some("elsewhere.test".into());
    refused(&cfg, "not valid for name").await;
    cfg.tls.server_name = Some("valkey.test".into());
    acquire_works(&cfg).await;
}

#[tokio::test]
async fn mtls_needs_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "good");
    let server = TlsServer::start(&ca, &["127.0.0.1"], true, &[]);
    let mut cfg = config(
        server.url(),
        TlsFiles {
            ca_file: Some(ca.ca_file()),
            ..TlsFiles::default()
        },
    );
    refused(&cfg, "requires a client certificate").await;

    // A certificate from a CA the server does not trust is refused too.
    let stranger = TestCa::new(dir.path(), "stranger").issue("client", &["client"], true);
    cfg.tls.cert_file = Some(stranger.cert);
    cfg.tls.key_file = Some(stranger.key);
    refused(&cfg, "does not trust the authority").await;

    let client = ca.issue("client", &["client"], true);
    cfg.tls.cert_file = Some(client.cert);
    cfg.tls.key_file = Some(client.key);
    acquire_works(&cfg).await;
}

#[tokio::test]
async fn tls_settings_without_a_tls_url_are_refused() {
    let cfg = config(
        "redis://127.0.0.1:1".into(),
        TlsFiles {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..TlsFiles::default()
        },
    );
    match ValkeyStore::connect(&cfg).await {
        Err(StoreError::Invalid(msg)) => assert!(msg.contains("rediss://"), "{msg}"),
        other => panic!("expected invalid, got {:?}", other.err()),
    }
}

#[tokio::test]
async fn unreadable_ca_file_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("ca.pem");
    std::fs::write(&bogus, "not a certificate").unwrap();
    let cfg = config(
        "rediss://127.0.0.1:1".into(),
        TlsFiles {
            ca_file: Some(bogus),
            ..TlsFiles::default()
        },
    );
    match ValkeyStore::connect(&cfg).await {
        Err(StoreError::Invalid(msg)) => assert!(msg.contains("CA file"), "{msg}"),
        other => panic!("expected invalid, got {:?}", other.err()),
    }
}

#[tokio::test]
async fn valkey_behind_stunnel() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "good");
    let other = TestCa::new(dir.path(), "other");
    let valkey = valkey_server::ValkeyServer::start();
    let tunnel = tls::Stunnel::start(&ca, &["127.0.0.1"], &valkey.addr());
    let mut cfg = config(
        tunnel.url(),
        TlsFiles {
            ca_file: Some(other.ca_file()),
            ..TlsFiles::default()
        },
    );
    refused(&cfg, "not signed by a trusted certificate authority").await;
    cfg.tls.ca_file = Some(ca.ca_file());
    acquire_works(&cfg).await;
}
