//! The least-privilege ACL rule shipped in docs/valkey.md, tested as written:
//! with it every lease operation works, and everything else is refused.

#[path = "support/resp.rs"]
mod resp;
#[path = "support/valkey_server.rs"]
mod valkey_server;

use std::time::Duration;

use resp::{Conn, Resp};
use targetlease::store::valkey::{Secret, ValkeyConfig, ValkeyStore};
use targetlease::store::{
    AcquireRequest, CommitRequest, LeaseStore, Outcome, ReleaseRequest, RenewRequest,
    RevokeRequest, Target,
};
use valkey_server::ValkeyServer;

const PASSWORD: &str = "acl-test-Pw-5521";

/// The `ACL SETUSER` line of docs/valkey.md, with the password filled in.
fn documented_rule() -> Vec<String> {
    let doc = include_str!("../docs/valkey.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER targetlease "))
        .expect("docs/valkey.md has an `ACL SETUSER targetlease …` line");
    assert!(line.contains(">CHANGE-ME"), "{line}");
    line.replace(">CHANGE-ME", &format!(">{PASSWORD}"))
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn server_with_user() -> ValkeyServer {
    // DEBUG enabled, so that refusing it is the ACL's doing.
    let server = ValkeyServer::start_with(&["--enable-debug-command", "yes"]);
    let rule = documented_rule();
    let args: Vec<&str> = rule.iter().map(String::as_str).collect();
    assert_eq!(server.conn().cmd(&args).text(), "OK", "the rule applies");
    server
}

fn as_user(server: &ValkeyServer) -> Conn {
    let mut c = server.conn();
    assert_eq!(
        c.cmd(&["AUTH", "targetlease", PASSWORD]).text(),
        "OK",
        "login as the documented user"
    );
    c
}

#[tokio::test]
async fn every_lease_operation_works_with_the_documented_user() {
    let server = server_with_user();
    let cfg = ValkeyConfig {
        url: server.url(),
        username: Some("targetlease".into()),
        password: Some(Secret::new(PASSWORD)),
        ..ValkeyConfig::default()
    };
    let store = ValkeyStore::connect(&cfg)
        .await
        .expect("connect and load scripts as the ACL user");
    let t = Target::new("acl", "t");
    let ttl = Duration::from_secs(30);
    let r = store
        .acquire(&AcquireRequest::new(t.clone(), "alice", ttl))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Acquired);
    let holder = r.lease.unwrap().handle().unwrap();
    let r = store
        .renew(&RenewRequest::new(t.clone(), holder.clone(), ttl))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Renewed);
    assert_eq!(store.get(&t).await.unwrap().outcome, Outcome::Found);
    let r = store
        .commit(&CommitRequest::new(t.clone(), holder.token, "k", "v"))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Committed);
    let r = store
        .release(&ReleaseRequest::new(t.clone(), holder))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Released);
    store
        .acquire(&AcquireRequest::new(t.clone(), "bob", ttl))
        .await
        .unwrap();
    let r = store
        .revoke(&RevokeRequest {
            reason: Some("test".into()),
            ..RevokeRequest::new(t.clone())
        })
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Revoked);
    store.health().await.expect("health as the ACL user");

    // NOSCRIPT recovery (EVAL) works for the user too.
    server.conn().cmd(&["SCRIPT", "FLUSH"]);
    assert_eq!(store.get(&t).await.unwrap().outcome, Outcome::NotFound);

    // The scripts' wake-up notice is allowed on the events channel.
    let mut c = as_user(&server);
    assert!(matches!(
        c.cmd(&["PUBLISH", "targetlease:events", "x"]),
        Resp::Int(_)
    ));
}

#[test]
fn everything_else_is_refused() {
    let server = server_with_user();
    let mut c = as_user(&server);
    let refused: &[&[&str]] = &[
        &["FLUSHDB"],
        &["FLUSHALL"],
        &["CONFIG", "GET", "maxmemory-policy"],
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
        &["KEYS", "*"],
        &["SCAN", "0"],
        &["DEBUG", "SLEEP", "0"],
        &["SHUTDOWN", "NOSAVE"],
        &["ACL", "LIST"],
        &["SET", "other", "1"],
        &["GET", "other"],
        &["DEL", "other:targetlease:x"],
        &["PUBLISH", "other-channel", "x"],
        // A script naming a key outside the prefix.
        &[
            "EVAL",
            "return redis.call('SET', KEYS[1], '1')",
            "1",
            "other",
        ],
    ];
    for cmd in refused {
        match c.cmd(cmd) {
            Resp::Error(e) if e.starts_with("NOPERM") => {}
            other => panic!("{cmd:?} must be refused with NOPERM, got {other:?}"),
        }
    }
    // A script reaching for an undeclared key outside the prefix.
    match c.cmd(&["EVAL", "return redis.call('SET', 'other', '1')", "0"]) {
        Resp::Error(e) if e.contains("NOPERM") || e.contains("permission") => {}
        other => panic!("an undeclared write outside the prefix must be refused, got {other:?}"),
    }
    assert_eq!(
        server.conn().cmd(&["EXISTS", "other"]).int(),
        0,
        "nothing was written outside the prefix"
    );
}
