//! The least-privilege ACL rule shipped in docs/valkey.md, tested as written:
//! with it every lease operation works, and everything else is refused.

use crate::support::cluster;
use crate::support::resp;
use crate::support::valkey_server;

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
    let doc = include_str!("../../docs/valkey.md");
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

/// The `ACL SETUSER team-a` line of docs/valkey.md, with the password filled in.
fn tenant_rule() -> Vec<String> {
    let doc = include_str!("../../docs/valkey.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER team-a "))
        .expect("docs/valkey.md has an `ACL SETUSER team-a …` line");
    line.replace(">CHANGE-ME", &format!(">{PASSWORD}"))
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// A server with the tenant user of docs/valkey.md, and no library loaded.
fn server_with_tenant() -> ValkeyServer {
    let server = ValkeyServer::start();
    let rule = tenant_rule();
    let args: Vec<&str> = rule.iter().map(String::as_str).collect();
    assert_eq!(server.conn().cmd(&args).text(), "OK", "the rule applies");
    server
}

fn tenant_config(server: &ValkeyServer) -> ValkeyConfig {
    ValkeyConfig {
        url: server.url(),
        username: Some("team-a".into()),
        password: Some(Secret::new(PASSWORD)),
        ..ValkeyConfig::default()
    }
}

/// What the operator does when it starts: load the lease functions, with
/// the deployment's user of docs/valkey.md.
async fn load_scripts_as_the_deployment(server: &ValkeyServer) {
    let rule = documented_rule();
    let args: Vec<&str> = rule.iter().map(String::as_str).collect();
    assert_eq!(server.conn().cmd(&args).text(), "OK", "the rule applies");
    let store = ValkeyStore::connect(&ValkeyConfig {
        url: server.url(),
        username: Some("targetlease".into()),
        password: Some(Secret::new(PASSWORD)),
        ..ValkeyConfig::default()
    })
    .await
    .expect("the deployment's user loads the library");
    store.load_scripts().await.expect("load the library");
    store.close().await;
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
    // With an append-only file, so that `--durability aof` (WAITAOF) runs
    // too; the URL names a database (SELECT).
    let server = ValkeyServer::start_with(&["--appendonly", "yes"]);
    let rule = documented_rule();
    let args: Vec<&str> = rule.iter().map(String::as_str).collect();
    assert_eq!(server.conn().cmd(&args).text(), "OK", "the rule applies");
    let cfg = ValkeyConfig {
        url: format!("{}/0", server.url()),
        username: Some("targetlease".into()),
        password: Some(Secret::new(PASSWORD)),
        durability: targetlease::store::valkey::Durability::Aof,
        ..ValkeyConfig::default()
    };
    let store = ValkeyStore::connect(&cfg)
        .await
        .expect("connect and load scripts as the ACL user");
    let t = Target::new("acl", "t");
    let ttl = Duration::from_secs(30);
    let first = AcquireRequest::new(t.clone(), "alice", ttl);
    let r = store.acquire(&first).await.unwrap();
    assert_eq!(r.outcome, Outcome::Acquired);
    let holder = r.lease.unwrap().handle().unwrap();
    // A replay rewrites its cache entry's expiry (HPEXPIREAT).
    let r = store.acquire(&first).await.unwrap();
    assert_eq!(r.outcome, Outcome::Acquired, "{}", r.message);
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
    let read = store.read(&t, "k").await.unwrap();
    assert_eq!(read.outcome, Outcome::Found);
    // A key of another type at a target's name is refused in words (TYPE).
    let other = Target::new("acl", "wrong-type");
    server
        .conn()
        .cmd(&["SET", &store.keys().target(&other), "x"]);
    let r = store.get(&other).await.unwrap();
    assert_eq!(r.outcome, Outcome::CorruptState, "{}", r.message);
    assert!(r.message.contains("holds a string"), "{}", r.message);
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
            ..RevokeRequest::new(t.clone())
        })
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Revoked);
    store.health().await.expect("health as the ACL user");

    // The library lost (FUNCTION FLUSH): the user loads it again itself.
    server.conn().cmd(&["FUNCTION", "FLUSH"]);
    assert_eq!(store.get(&t).await.unwrap().outcome, Outcome::NotFound);
    assert_eq!(
        server.calls("function|load"),
        2,
        "at connect, then once more"
    );

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

/// During a slot migration the old owner answers `ASK` for keys it no longer
/// has, and the client asks the importing node after `ASKING`: the
/// documented rule must allow that command, or leases on a migrating slot
/// cannot even be read. (The same rule without `+asking` is shown to fail,
/// so this test does exercise `ASKING`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_user_follows_ask_during_a_slot_migration() {
    let c = cluster::Cluster::start();
    let rule = documented_rule();
    let without_asking: Vec<String> = rule.iter().filter(|w| *w != "+asking").cloned().collect();
    assert_eq!(
        without_asking.len() + 1,
        rule.len(),
        "the rule grants +asking"
    );
    for n in &c.nodes {
        let args: Vec<&str> = rule.iter().map(String::as_str).collect();
        assert_eq!(n.conn().cmd(&args).text(), "OK", "the rule applies");
        let mut args: Vec<&str> = without_asking.iter().map(String::as_str).collect();
        assert_eq!(args[2], "targetlease");
        args[2] = "no-asking";
        assert_eq!(n.conn().cmd(&args).text(), "OK");
    }
    let config = |user: &str| ValkeyConfig {
        url: c.url(),
        username: Some(user.into()),
        password: Some(Secret::new(PASSWORD)),
        ..ValkeyConfig::default()
    };
    let store = ValkeyStore::connect(&config("targetlease"))
        .await
        .expect("connect as the documented user");
    let no_asking = ValkeyStore::connect(&config("no-asking"))
        .await
        .expect("connect as the user without +asking");
    let t = Target::new("acl", "migrating");
    let r = store
        .acquire(&AcquireRequest::new(
            t.clone(),
            "alice",
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Acquired);

    // Migrate the target's slot halfway: its keys move, the slot stays
    // MIGRATING on the old owner and IMPORTING on the new one.
    let lease_key = store.keys().target(&t);
    let slot = c.keyslot(&lease_key);
    let from = c.owner_of_slot(slot);
    let to = (from + 1) % 3;
    let s = slot.to_string();
    let (from_id, to_id) = (c.id(from), c.id(to));
    let ok = Resp::Simple("OK".into());
    assert_eq!(
        c.nodes[to]
            .conn()
            .cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id]),
        ok
    );
    assert_eq!(
        c.nodes[from]
            .conn()
            .cmd(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id]),
        ok
    );
    let keys = match c.nodes[from]
        .conn()
        .cmd(&["CLUSTER", "GETKEYSINSLOT", &s, "100"])
    {
        Resp::Array(Some(keys)) => keys.iter().map(Resp::text).collect::<Vec<_>>(),
        other => panic!("GETKEYSINSLOT: {other:?}"),
    };
    assert!(keys.contains(&lease_key), "{keys:?}");
    let port = c.nodes[to].port.to_string();
    let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
    migrate.extend(keys.iter().map(String::as_str));
    assert_eq!(c.nodes[from].conn().cmd(&migrate), ok, "MIGRATE");

    let asked_before = c.nodes[to].calls("asking");
    let got = store
        .get(&t)
        .await
        .expect("a lease on a migrating slot can be read");
    assert_eq!(got.outcome, Outcome::Found, "{}", got.message);
    assert_eq!(got.lease.unwrap().owner, "alice");
    assert!(
        c.nodes[to].calls("asking") > asked_before,
        "the read went through ASKING on the importing node"
    );
    let refused = no_asking.get(&t).await;
    assert!(
        refused.is_err(),
        "without +asking the same read cannot succeed: {refused:?}"
    );
}

/// The per-tenant rule of docs/valkey.md, as written: its user works in its
/// own namespace and is refused, before anything runs, in any other.
#[tokio::test]
async fn a_tenant_user_reaches_only_its_namespace() {
    let server = server_with_tenant();
    load_scripts_as_the_deployment(&server).await;
    let store = ValkeyStore::connect(&tenant_config(&server))
        .await
        .expect("connect as the tenant user, the scripts loaded by another");
    let ttl = Duration::from_secs(30);

    let own = Target::new("team-a", "db");
    let r = store
        .acquire(&AcquireRequest::new(own.clone(), "alice", ttl))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Acquired);
    let holder = r.lease.unwrap().handle().unwrap();
    let r = store
        .renew(&RenewRequest::new(own.clone(), holder.clone(), ttl))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Renewed);
    let r = store
        .commit(&CommitRequest::new(own.clone(), holder.token, "k", "v"))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Committed);
    let r = store
        .release(&ReleaseRequest::new(own.clone(), holder))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Released);
    let r = store
        .revoke(&RevokeRequest::new(own.clone()))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::NotFound);

    // Another namespace, and one whose name merely starts like it.
    for ns in ["team-b", "team-ab"] {
        let other = Target::new(ns, "db");
        let refused = [
            (
                "acquire",
                store
                    .acquire(&AcquireRequest::new(other.clone(), "mallory", ttl))
                    .await,
            ),
            ("get", store.get(&other).await),
            (
                "revoke",
                store.revoke(&RevokeRequest::new(other.clone())).await,
            ),
        ];
        for (op, r) in refused {
            match r {
                Err(targetlease::store::StoreError::BackendUnavailable(why)) => {
                    assert!(why.contains("NOPERM"), "{ns} {op}: {why}")
                }
                other => panic!("{ns} {op}: a definite refusal, got {other:?}"),
            }
        }
        let key = store.keys().target(&other);
        assert_eq!(server.conn().cmd(&["EXISTS", &key]).int(), 0, "{ns}");
    }
}

/// The tenant's rule grants no Lua of its own: `EVAL`, `SCRIPT LOAD` and
/// `FUNCTION LOAD` are refused, so it cannot block the server with a script
/// that loops. It runs the lease functions once a user that may has loaded
/// them; before that, and after the server loses them, it is refused in
/// words that say who must load them, and nothing runs.
#[tokio::test]
async fn a_tenant_user_runs_no_lua_of_its_own_and_works_once_the_scripts_are_loaded() {
    let server = server_with_tenant();
    let mut c = server.conn();
    assert_eq!(c.cmd(&["AUTH", "team-a", PASSWORD]).text(), "OK");
    let own_key = "targetlease:{team-a:db}";
    let lua: &[&[&str]] = &[
        &["EVAL", "return 1", "0"],
        &["EVAL", "return 1", "1", own_key],
        &["EVAL_RO", "return 1", "1", own_key],
        &["SCRIPT", "LOAD", "return 1"],
        &["SCRIPT", "FLUSH"],
        &[
            "FUNCTION",
            "LOAD",
            "#!lua name=x\nredis.register_function('x', function() return 1 end)",
        ],
        &["FUNCTION", "FLUSH"],
        &["FUNCTION", "DELETE", "x"],
        &["FUNCTION", "RESTORE", "x"],
    ];
    for cmd in lua {
        match c.cmd(cmd) {
            Resp::Error(e) if e.starts_with("NOPERM") => {}
            other => panic!("{:?} must be refused with NOPERM, got {other:?}", &cmd[..2]),
        }
    }

    // Nothing loaded yet: the connect says which library is missing and
    // who must load it.
    let why = match ValkeyStore::connect(&tenant_config(&server)).await {
        Err(targetlease::store::StoreError::BackendUnavailable(why)) => why,
        Err(other) => panic!("backend_unavailable, got {other:?}"),
        Ok(_) => panic!("the tenant cannot connect before the scripts are loaded"),
    };
    let library = &targetlease::store::valkey::scripts::SCRIPTS.library.name;
    assert!(
        why.contains("not loaded") && why.contains("may not load") && why.contains(library),
        "{why}"
    );
    assert!(!why.contains(PASSWORD), "{why}");

    load_scripts_as_the_deployment(&server).await;
    let store = ValkeyStore::connect(&tenant_config(&server))
        .await
        .expect("the tenant connects once the scripts are loaded");
    let t = Target::new("team-a", "db");
    let ttl = Duration::from_secs(30);
    let r = store
        .acquire(&AcquireRequest::new(t.clone(), "alice", ttl))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Acquired);
    let holder = r.lease.unwrap().handle().unwrap();

    // The server loses the library (FUNCTION FLUSH, a restart without
    // persistence): the tenant is refused before anything runs, in words,
    // and may not load it.
    assert_eq!(server.conn().cmd(&["FUNCTION", "FLUSH"]).text(), "OK");
    let loads_before = server.calls("function|load");
    match store
        .renew(&RenewRequest::new(t.clone(), holder.clone(), ttl))
        .await
    {
        Err(targetlease::store::StoreError::BackendUnavailable(why)) => assert!(
            why.contains("not loaded") && why.contains("may not load"),
            "{why}"
        ),
        other => panic!("a definite refusal that says why, got {other:?}"),
    }
    assert_eq!(
        server.calls("function|load"),
        loads_before,
        "the tenant's FUNCTION LOAD ran nothing"
    );
    assert!(
        server.command_stat("function|load", "rejected_calls") >= 1,
        "it was tried"
    );
    let r = store.get(&t).await;
    assert!(
        matches!(&r, Err(targetlease::store::StoreError::BackendUnavailable(why)) if why.contains("not loaded")),
        "{r:?}"
    );

    // Loaded again by the deployment's user: the lease is still the tenant's.
    load_scripts_as_the_deployment(&server).await;
    let r = store
        .renew(&RenewRequest::new(t.clone(), holder.clone(), ttl))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Renewed, "{}", r.message);
    let r = store
        .release(&ReleaseRequest::new(t, holder))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Released);
}
