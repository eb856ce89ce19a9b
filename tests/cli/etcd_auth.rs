//! etcd user authentication against a real 3-member etcd with auth on:
//! a user holding exactly the role the docs give (`readwrite` on
//! `targetlease/` with `--prefix`) runs every lease command; a wrong
//! password, no credentials, a user without the role and a read-only user
//! are refused with a definite error (`backend_unavailable`, never
//! `outcome_unknown`) that shows no password.

use std::path::{Path, PathBuf};

use etcd_client::{Client, Permission};
use serde_json::Value;

use crate::support::cli::{Lease, lease, targetlease};
use crate::support::etcd_cluster::EtcdCluster;

/// Deadlines a loaded machine meets (etcd's password check alone costs a
/// bcrypt round per connect): every refusal here is definite and comes at
/// once, so only the commands that must work ever wait on them.
const DEADLINES: [&str; 4] = ["--timeout", "10s", "--connect-timeout", "10s"];

const PASSWORD: &str = "etcd-auth-right-Hx41";
const WRONG: &str = "etcd-auth-wrong-Pq93";

/// Turns auth on the way an operator would with etcdctl: a root user with
/// the root role; the documented role
/// (`role grant-permission --prefix targetlease readwrite targetlease/`)
/// given to user `targetlease`; user `reader` with read only on the same
/// range; user `nobody` with no role.
fn enable_auth(cluster: &EtcdCluster) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = Client::connect(cluster.endpoints(), None)
            .await
            .expect("connect to etcd");
        c.role_add("root").await.unwrap();
        c.user_add("root", "root-pw", None).await.unwrap();
        c.user_grant_role("root", "root").await.unwrap();
        for (role, perm) in [
            ("targetlease", Permission::read_write("targetlease/")),
            ("reader", Permission::read("targetlease/")),
        ] {
            c.role_add(role).await.unwrap();
            c.role_grant_permission(role, perm.with_prefix())
                .await
                .unwrap();
            c.user_add(role, PASSWORD, None).await.unwrap();
            c.user_grant_role(role, role).await.unwrap();
        }
        c.user_add("nobody", PASSWORD, None).await.unwrap();
        c.auth_enable().await.expect("enable auth");
    });
}

struct Setup {
    cluster: EtcdCluster,
    dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let cluster = EtcdCluster::start();
    enable_auth(&cluster);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("right"), PASSWORD).unwrap();
    std::fs::write(dir.path().join("wrong"), WRONG).unwrap();
    Setup { cluster, dir }
}

impl Setup {
    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The user and password flags of `user` with the password in `file`.
    fn as_user(&self, user: &str, file: &str) -> Vec<String> {
        let file = self.file(file);
        vec![
            "--username".into(),
            user.into(),
            "--password-file".into(),
            s(&file).into(),
        ]
    }

    fn on(&self, op: &str, who: &[String]) -> Lease {
        let who: Vec<&str> = who.iter().map(String::as_str).collect();
        lease(&self.cluster.url(), op)
            .with(&who)
            .with(&DEADLINES)
            .target("db")
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Refused as `backend_unavailable` (exit 3) naming `why`; no password shows.
fn refused(cmd: &Lease, why: &str) {
    cmd.refused(why, &[PASSWORD, WRONG]);
}

#[test]
fn the_documented_role_runs_every_lease_command() {
    let st = setup();
    let url = st.cluster.url();
    let me = st.as_user("targetlease", "right");
    let acquired = st
        .on("acquire", &me)
        .owner("alice")
        .ttl("30s")
        .ok("acquired", 0);
    assert_eq!(acquired.token(), 1);
    st.on("renew", &me)
        .handle(&acquired.json)
        .ttl("30s")
        .ok("renewed", 0);
    st.on("commit", &me)
        .token(1)
        .with(&["--key", "k", "--value", "v1"])
        .ok("committed", 0);
    let read = st.on("read", &me).with(&["--key", "k"]).output();
    assert_eq!(read.status.code(), Some(0), "{read:?}");
    let read: Value = serde_json::from_slice(&read.stdout).unwrap();
    assert_eq!(read["committed"]["value"], "v1", "{read}");
    st.on("get", &me).ok("found", 0);
    let out = targetlease(&["lease", "list", "--store-url", &url])
        .args(&me)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"found\""),
        "{out:?}"
    );
    st.on("release", &me)
        .handle(&acquired.json)
        .ok("released", 0);
    let again = st
        .on("acquire", &me)
        .owner("bob")
        .ttl("30s")
        .ok("acquired", 0);
    assert_eq!(again.token(), 2, "tokens only grow");
    st.on("revoke", &me).ok("revoked", 0);
    st.on("get", &me).ok("not_found", 1);

    let out = targetlease(&["check", "--store-url", &url])
        .args(&me)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    // Every check answered in full: the role may read etcd's alarms and
    // space too (any authenticated user may).
    // (Reachability may warn of a slow answer on a loaded machine.)
    let checks = report["checks"].as_array().unwrap();
    let names: Vec<&str> = checks.iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["reachability", "permissions", "space"], "{report}");
    assert_eq!(checks[1]["status"], "ok", "{report}");
    assert_eq!(checks[2]["status"], "ok", "{report}");
}

#[test]
fn wrong_passwords_missing_roles_and_no_credentials_are_refused_definitely() {
    let st = setup();
    let acquire = |who: &[String]| st.on("acquire", who).owner("mallory").ttl("30s");

    let wrong = st.as_user("targetlease", "wrong");
    refused(&st.on("get", &wrong), "authentication failed");
    refused(&acquire(&wrong), "authentication failed");
    // Not even the most verbose log shows either password.
    let traced = st
        .on("get", &wrong)
        .command()
        .env("RUST_LOG", "trace")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&traced.stderr);
    assert!(stderr.len() > 1000, "trace logging is on: {stderr}");
    for secret in [PASSWORD, WRONG] {
        assert!(!stderr.contains(secret), "a password in the trace log");
        assert!(!String::from_utf8_lossy(&traced.stdout).contains(secret));
    }
    // With auth on, a client with no credentials is refused too.
    refused(&st.on("get", &[]), "user name is empty");
    refused(&acquire(&[]), "user name is empty");
    // A user without the role may not even read the key range.
    let nobody = st.as_user("nobody", "right");
    refused(&acquire(&nobody), "permission denied");

    // A read-only user reads, and its write is refused whole: not
    // outcome_unknown, and nothing was taken.
    let reader = st.as_user("reader", "right");
    st.on("get", &reader).ok("not_found", 1);
    refused(&acquire(&reader), "permission denied");
    let me = st.as_user("targetlease", "right");
    st.on("get", &me).ok("not_found", 1);
    let first = st
        .on("acquire", &me)
        .owner("alice")
        .ttl("30s")
        .ok("acquired", 0);
    assert_eq!(first.token(), 1, "the refused writes took no token");
}
