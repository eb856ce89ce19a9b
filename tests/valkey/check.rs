//! `targetlease check` (the real binary) against real servers: safe, unsafe,
//! restricted and unreachable deployments.

use crate::support::deadline;
use crate::support::fault_proxy;
use crate::support::valkey_server;

use std::process::{Command, Output};

use serde_json::Value;
use valkey_server::{ValkeyServer, free_port};

fn check(url: &str, extra: &[&str]) -> (i32, Output) {
    let out = Command::new(env!("CARGO_BIN_EXE_targetlease"))
        .arg("check")
        .args(["--valkey-url", url])
        .args(extra)
        .env_remove("RUST_LOG")
        .output()
        .expect("run targetlease check");
    (out.status.code().expect("exit code"), out)
}

fn report(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON object ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn find<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["checks"]
        .as_array()
        .expect("checks array")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} check in {r}"))
}

fn status(r: &Value, name: &str) -> String {
    find(r, name)["status"].as_str().unwrap().to_owned()
}

#[test]
fn safe_server_passes() {
    let server = ValkeyServer::start_with(&["--appendonly", "yes"]);
    let (code, out) = check(&server.url(), &[]);
    let r = report(&out);
    assert_eq!(code, 0, "{r}");
    assert_eq!(r["ok"], true);
    for name in [
        "reachability",
        "server-version",
        "scripts",
        "permissions",
        "maxmemory-policy",
        "persistence",
        "cluster",
    ] {
        assert_eq!(status(&r, name), "ok", "{name}: {r}");
    }
    // No replica: allowed, but said.
    assert_eq!(status(&r, "replication"), "warn", "{r}");
    for c in r["checks"].as_array().unwrap() {
        assert_eq!(c.as_object().unwrap().len(), 3, "name, status, detail: {c}");
    }
}

#[test]
fn eviction_of_fence_counters_fails_and_says_why() {
    let server = ValkeyServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let (code, out) = check(&server.url(), &[]);
    let r = report(&out);
    assert_eq!(code, 1, "{r}");
    assert_eq!(r["ok"], false);
    let c = find(&r, "maxmemory-policy");
    assert_eq!(c["status"], "fail");
    let detail = c["detail"].as_str().unwrap();
    assert!(
        detail.contains("allkeys-lru") && detail.contains("fence counter"),
        "{detail}"
    );

    let (code, out) = check(&server.url(), &["--human"]);
    assert_eq!(code, 1);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("FAIL") && l.contains("maxmemory-policy")),
        "{text}"
    );
    assert!(text.contains("UNSAFE"), "{text}");
}

#[test]
fn a_volatile_policy_is_fine_and_missing_aof_warns_only() {
    // A target's key has no expiry, so volatile-* never evicts one.
    let server = ValkeyServer::start_with(&["--maxmemory-policy", "volatile-lru"]);
    let (code, out) = check(&server.url(), &[]);
    let r = report(&out);
    assert_eq!(code, 0, "{r}");
    assert_eq!(status(&r, "maxmemory-policy"), "ok");
    assert_eq!(status(&r, "persistence"), "warn");
    // Asking for durability the deployment cannot give is a failure.
    let (code, out) = check(&server.url(), &["--durability", "aof"]);
    assert_eq!(code, 1);
    assert_eq!(status(&report(&out), "persistence"), "fail");
    let (code, out) = check(&server.url(), &["--durability", "replicas:1"]);
    assert_eq!(code, 1);
    assert_eq!(status(&report(&out), "replication"), "fail");
}

#[test]
fn a_replica_fails() {
    let primary = ValkeyServer::start_with(&["--appendonly", "yes"]);
    let replica = ValkeyServer::start_with(&[
        "--appendonly",
        "yes",
        "--replicaof",
        "127.0.0.1",
        &primary.port.to_string(),
    ]);
    let (code, out) = check(&replica.url(), &[]);
    let r = report(&out);
    assert_eq!(code, 1, "{r}");
    assert_eq!(status(&r, "replication"), "fail");
}

#[test]
fn the_least_privilege_user_can_run_every_check() {
    let server = ValkeyServer::start_with(&["--appendonly", "yes"]);
    let doc = include_str!("../../docs/valkey.md");
    let rule = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER targetlease "))
        .expect("documented rule")
        .replace(">CHANGE-ME", ">check-pw");
    let args: Vec<&str> = rule.split_whitespace().collect();
    server.conn().cmd(&args);
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "check-pw\n").unwrap();
    let pw = pw.to_str().unwrap();
    let (code, out) = check(
        &server.url(),
        &["--username", "targetlease", "--password-file", pw],
    );
    let r = report(&out);
    assert_eq!(code, 0, "{r}");
    assert_eq!(status(&r, "maxmemory-policy"), "ok", "{r}");
    assert_eq!(status(&r, "permissions"), "ok", "{r}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("check-pw"));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("check-pw"));

    // A user that may not run scripts: reachable, but the scripts check fails.
    server.conn().cmd(&[
        "ACL",
        "SETUSER",
        "noscripts",
        "on",
        ">ns-pw",
        "~*",
        "+@all",
        "-eval",
        "-evalsha",
        "-script",
        "-fcall",
        "-fcall_ro",
        "-function",
    ]);
    std::fs::write(dir.path().join("ns"), "ns-pw").unwrap();
    let ns = dir.path().join("ns");
    let (code, out) = check(
        &server.url(),
        &[
            "--username",
            "noscripts",
            "--password-file",
            ns.to_str().unwrap(),
        ],
    );
    let r = report(&out);
    assert_eq!(code, 1, "{r}");
    assert_eq!(status(&r, "scripts"), "fail", "{r}");
    assert_eq!(status(&r, "permissions"), "fail", "{r}");
}

/// A tenant's user (docs/valkey.md: `+fcall`, no `FUNCTION LOAD`) did not
/// load the lease functions: the check says it found them loaded, and says
/// "load" only for a user that loaded them.
#[test]
fn a_user_that_may_not_load_scripts_is_told_it_found_them_loaded() {
    let server = ValkeyServer::start();
    let doc = include_str!("../../docs/valkey.md");
    let rule = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER team-a "))
        .expect("documented tenant rule")
        .replace(">CHANGE-ME", ">tenant-pw");
    let args: Vec<&str> = rule.split_whitespace().collect();
    server.conn().cmd(&args);
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "tenant-pw\n").unwrap();
    let tenant = [
        "--username",
        "team-a",
        "--password-file",
        pw.to_str().unwrap(),
    ];
    let detail = |r: &Value| find(r, "scripts")["detail"].as_str().unwrap().to_owned();

    // Nothing loaded yet: the tenant cannot do it.
    let (_, out) = check(&server.url(), &tenant);
    let r = report(&out);
    assert_eq!(status(&r, "scripts"), "fail", "{r}");

    // The default user loads them.
    let (_, out) = check(&server.url(), &[]);
    let r = report(&out);
    assert_eq!(status(&r, "scripts"), "ok", "{r}");
    let library = &targetlease::store::valkey::scripts::SCRIPTS.library.name;
    assert_eq!(
        detail(&r),
        format!("the lease functions load (library {library})"),
        "{r}"
    );

    // The tenant finds them loaded, and is told so.
    let (_, out) = check(&server.url(), &tenant);
    let r = report(&out);
    assert_eq!(status(&r, "scripts"), "ok", "{r}");
    let said = detail(&r);
    assert!(said.starts_with("the lease functions found loaded"), "{r}");
    assert!(!said.contains("functions load"), "{r}");
}

#[test]
fn unreachable_server_exits_3() {
    let (code, out) = check(
        &format!("redis://127.0.0.1:{}", free_port()),
        &["--connect-timeout", "1s"],
    );
    let r = report(&out);
    assert_eq!(code, 3, "{r}");
    assert_eq!(r["ok"], false);
    assert_eq!(status(&r, "reachability"), "fail");
}

#[test]
fn wrong_password_is_unreachable_and_not_printed() {
    let server = ValkeyServer::start_with(&["--requirepass", "right-pw-1"]);
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "wrong-pw-2").unwrap();
    let (code, out) = check(&server.url(), &["--password-file", pw.to_str().unwrap()]);
    assert_eq!(code, 3);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("WRONGPASS"), "{all}");
    assert!(
        !all.contains("wrong-pw-2") && !all.contains("right-pw-1"),
        "{all}"
    );
}

fn check_within(url: &str, limit: std::time::Duration) -> (i32, Output, std::time::Duration) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_targetlease"));
    cmd.arg("check")
        .args([
            "--valkey-url",
            url,
            "--timeout",
            "1s",
            "--connect-timeout",
            "1s",
        ])
        .env_remove("RUST_LOG");
    let (out, took) = deadline::output_within(cmd, limit);
    (out.status.code().expect("exit code"), out, took)
}

#[test]
fn a_silent_server_is_unreachable_within_the_connect_timeout() {
    let silent = fault_proxy::FaultProxy::silent();
    let (code, out, took) = check_within(&silent.url(), std::time::Duration::from_secs(3));
    let r = report(&out);
    assert_eq!(code, 3, "{r}");
    assert_eq!(status(&r, "reachability"), "fail");
    assert!(!r.to_string().contains("Os {"), "{r}");
    eprintln!("check against a silent server: {took:?}");
}

#[test]
fn a_server_that_stops_answering_ends_the_check_within_its_deadlines() {
    let server = ValkeyServer::start();
    let proxy = fault_proxy::FaultProxy::start(&server.addr());
    proxy.silence_from("INFO");
    // Connect (1s) + the call that got no answer (1s): the rest is not attempted.
    let (code, out, took) = check_within(&proxy.url(), std::time::Duration::from_secs(4));
    let r = report(&out);
    assert_eq!(code, 3, "{r}");
    assert_eq!(r["ok"], false);
    eprintln!("check against a server that stopped answering: {took:?}: {r}");
}
