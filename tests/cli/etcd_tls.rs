//! `etcds://` against a real 3-member etcd that serves clients over TLS
//! only (certificates made for the test): the lease commands work with
//! `--tls-ca-file`; a CA that did not sign the members' certificate fails
//! closed, with a sentence and no secret; with `--client-cert-auth` only a
//! client certificate the cluster trusts gets in.

use std::path::Path;

use crate::support::cli::{Lease, Res, lease, targetlease};
use crate::support::etcd_cluster::{ClientTls, EtcdCluster};
use crate::support::tls::TestCa;

/// Deadlines a loaded machine meets (etcd's password check alone costs a
/// bcrypt round per connect): every refusal here is definite and comes at
/// once, so only the commands that must work ever wait on them.
const DEADLINES: [&str; 4] = ["--timeout", "10s", "--connect-timeout", "10s"];

const PASSWORD: &str = "etcd-tls-canary-Vq27";
const NOT_TRUSTED: &str = "certificate is not signed by a trusted certificate authority";

/// A cluster whose members present a certificate for 127.0.0.1 issued by
/// `ca`; with `client_ca`, clients need a certificate it issued.
fn cluster(ca: &TestCa, client_ca: Option<&TestCa>) -> EtcdCluster {
    let server = ca.issue("etcd-member", &["127.0.0.1"], false);
    EtcdCluster::start_tls(ClientTls {
        cert: server.cert,
        key: server.key,
        client_ca: client_ca.map(TestCa::ca_file),
    })
}

/// `lease <op>` on `url` with the TLS flags in `tls`.
fn on(url: &str, op: &str, tls: &[&str]) -> Lease {
    lease(url, op).with(tls).with(&DEADLINES)
}

/// Acquire, renew, get, release and acquire again (the token grows) on
/// target `target`, each over TLS.
fn lease_cycle_works(url: &str, tls: &[&str], target: &str) {
    let acquired = on(url, "acquire", tls)
        .target(target)
        .owner("alice")
        .ttl("30s")
        .ok("acquired", 0);
    let first = acquired.token();
    on(url, "renew", tls)
        .target(target)
        .handle(&acquired.json)
        .ttl("30s")
        .ok("renewed", 0);
    let held = on(url, "get", tls).target(target).ok("found", 0);
    assert_eq!(held.json["lease"]["owner"], "alice", "{}", held.stdout);
    on(url, "release", tls)
        .target(target)
        .handle(&acquired.json)
        .ok("released", 0);
    on(url, "get", tls).target(target).ok("not_found", 1);
    let next = on(url, "acquire", tls)
        .target(target)
        .owner("bob")
        .ttl("30s")
        .ok("acquired", 0);
    assert_eq!(next.token(), first + 1, "tokens only grow");
}

/// The command is refused as `backend_unavailable` (exit 3) with a message
/// naming `why` in words; neither stream shows the password.
fn refused(cmd: &Lease, why: &str) -> Res {
    let r = cmd.refused(why, &[PASSWORD]);
    // A sentence for people, not the TLS library's variant names.
    let message = r.json["message"].as_str().unwrap_or_default();
    for name in ["UnknownIssuer", "CertificateRequired", "Canceled"] {
        assert!(!message.contains(name), "{name} in {message}");
    }
    r
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn etcds_with_the_right_ca_works_and_a_wrong_ca_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "etcd");
    let other = TestCa::new(dir.path(), "other");
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, PASSWORD).unwrap();
    let cluster = cluster(&ca, None);
    let url = cluster.url();
    assert!(url.starts_with("etcds://"), "{url}");

    let right = ca.ca_file();
    let trusted = ["--tls-ca-file", path(&right)];
    lease_cycle_works(&url, &trusted, "db");
    let out = targetlease(&["check", "--store-url", &url])
        .args(trusted)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    // A CA that did not sign the members' certificate: nothing is sent,
    // credentials included, and the message says why in words.
    let wrong = other.ca_file();
    let with_credentials = [
        "--tls-ca-file",
        path(&wrong),
        "--username",
        "targetlease",
        "--password-file",
        path(&password_file),
    ];
    refused(
        &on(&url, "get", &with_credentials).target("db"),
        NOT_TRUSTED,
    );
    let acquire = on(&url, "acquire", &with_credentials)
        .target("db")
        .owner("carol")
        .ttl("30s");
    refused(&acquire, NOT_TRUSTED);
    // The system roots do not hold the test CA either.
    refused(&on(&url, "get", &[]).target("db"), NOT_TRUSTED);
    // Plain etcd:// to a TLS-only member does not get an answer.
    let plain = url.replacen("etcds://", "etcd://", 1);
    let r = on(&plain, "get", &[]).target("db").res();
    assert_eq!(
        (r.json["outcome"].as_str(), r.code),
        (Some("backend_unavailable"), 3),
        "{}",
        r.stdout
    );

    // The lease bob took above is still his: the refusals changed nothing.
    let held = on(&url, "get", &trusted).target("db").ok("found", 0);
    assert_eq!(held.json["lease"]["owner"], "bob", "{}", held.stdout);
}

#[test]
fn client_certificate_auth_admits_only_a_certificate_the_cluster_trusts() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "etcd");
    let cluster = cluster(&ca, Some(&ca));
    let url = cluster.url();
    let right = ca.ca_file();

    // No client certificate: the members end the handshake. (With TLS 1.3
    // the client may learn it from their alert or only from the closed
    // connection: the message names client certificates either way.)
    refused(
        &on(&url, "get", &["--tls-ca-file", path(&right)]).target("db"),
        "a client certificate (see --tls-cert-file and --tls-key-file)",
    );
    // A client certificate from a CA the cluster does not trust.
    let stranger = TestCa::new(dir.path(), "stranger").issue("client", &["client"], true);
    let untrusted = [
        "--tls-ca-file",
        path(&right),
        "--tls-cert-file",
        path(&stranger.cert),
        "--tls-key-file",
        path(&stranger.key),
    ];
    refused(
        &on(&url, "get", &untrusted).target("db"),
        "our client certificate",
    );

    let client = ca.issue("client", &["client"], true);
    let trusted = [
        "--tls-ca-file",
        path(&right),
        "--tls-cert-file",
        path(&client.cert),
        "--tls-key-file",
        path(&client.key),
    ];
    lease_cycle_works(&url, &trusted, "db");
}
