//! The `targetlease lease …` contract, checked on the real binary against a
//! real `valkey-server` (one per test): flags, env fallbacks, the JSON
//! envelope, outcome names and exit codes, and that bad input writes nothing.

#[path = "support/deadline.rs"]
mod deadline;
#[path = "support/fault_proxy.rs"]
mod fault_proxy;
#[path = "support/resp.rs"]
mod resp;
#[path = "support/valkey_server.rs"]
mod valkey_server;

use std::collections::BTreeSet;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use resp::Resp;
use serde_json::Value;
use valkey_server::{ValkeyServer, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_targetlease");

/// A `targetlease` command with no `TARGETLEASE_*` or `RUST_LOG` leaking in from the test's environment.
fn tl(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TARGETLEASE_") {
            cmd.env_remove(k);
        }
    }
    cmd.env_remove("RUST_LOG");
    cmd.args(args);
    cmd
}

/// Runs `targetlease lease <args> --valkey-url <url>`.
fn lease(url: &str, args: &[&str]) -> Output {
    let mut all = vec!["lease"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--valkey-url", url]);
    tl(&all).output().expect("run targetlease")
}

struct Res {
    code: i32,
    json: Value,
    stdout: String,
    stderr: String,
}

fn parse(out: Output) -> Res {
    let stdout = String::from_utf8(out.stdout).expect("utf-8 stdout");
    let stderr = String::from_utf8(out.stderr).expect("utf-8 stderr");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "expected exactly one JSON line on stdout, got {stdout:?} (stderr {stderr:?})"
    );
    let json: Value = serde_json::from_str(lines[0]).expect("stdout is JSON");
    let obj = json.as_object().expect("a JSON object");
    let keys: BTreeSet<&str> = obj.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        BTreeSet::from(["outcome", "lease", "server_time_ms", "message"]),
        "{stdout}"
    );
    assert!(json["message"].is_string(), "{stdout}");
    assert!(json["server_time_ms"].is_u64(), "{stdout}");
    Res {
        code: out.status.code().expect("exit code"),
        json,
        stdout,
        stderr,
    }
}

fn run_ok(url: &str, args: &[&str], outcome: &str, code: i32) -> Res {
    let r = parse(lease(url, args));
    assert_eq!(
        r.json["outcome"], outcome,
        "{} (stderr {})",
        r.stdout, r.stderr
    );
    assert_eq!(r.code, code, "{}", r.stdout);
    r
}

fn lease_keys(l: &Value) -> BTreeSet<String> {
    l.as_object()
        .expect("lease object")
        .keys()
        .cloned()
        .collect()
}

fn set(keys: &[&str]) -> BTreeSet<String> {
    keys.iter().map(|s| s.to_string()).collect()
}

const HOLDER_FIELDS: [&str; 6] = [
    "target",
    "lease_id",
    "owner",
    "fencing_token",
    "acquired_at_ms",
    "expires_at_ms",
];
const PUBLIC_FIELDS: [&str; 5] = [
    "target",
    "owner",
    "fencing_token",
    "acquired_at_ms",
    "expires_at_ms",
];

fn acquire(url: &str, target: &str, owner: &str, ttl: &str) -> Value {
    run_ok(
        url,
        &[
            "acquire", "--target", target, "--owner", owner, "--ttl", ttl,
        ],
        "acquired",
        0,
    )
    .json
}

fn dbsize(s: &ValkeyServer) -> i64 {
    s.conn().cmd(&["DBSIZE"]).int()
}

#[test]
fn acquire_prints_the_lease_with_its_id_and_token() {
    let s = ValkeyServer::start();
    let before = now_ms();
    let j = acquire(&s.url(), "db", "alice", "10s");
    let l = &j["lease"];
    assert_eq!(lease_keys(l), set(&HOLDER_FIELDS), "{j}");
    assert_eq!(l["target"], "db");
    assert_eq!(l["owner"], "alice");
    assert_eq!(l["fencing_token"], 1);
    assert!(!l["lease_id"].as_str().unwrap().is_empty());
    let acquired = l["acquired_at_ms"].as_u64().unwrap();
    assert_eq!(l["expires_at_ms"].as_u64().unwrap(), acquired + 10_000);
    assert!(
        acquired + 5_000 > before && acquired < before + 60_000,
        "{j}"
    );
    assert!(j["server_time_ms"].as_u64().unwrap() >= acquired);

    // Optional fields appear only when given.
    let j = run_ok(
        &s.url(),
        &[
            "acquire",
            "--target",
            "db2",
            "--owner",
            "bob",
            "--ttl",
            "10s",
            "--max-lifetime",
            "1h",
            "--metadata",
            r#"{"job":"nightly","n":3}"#,
        ],
        "acquired",
        0,
    )
    .json;
    let mut fields = set(&HOLDER_FIELDS);
    fields.extend(set(&["max_expires_at_ms", "metadata"]));
    assert_eq!(lease_keys(&j["lease"]), fields, "{j}");
    assert_eq!(j["lease"]["metadata"]["job"], "nightly");
    assert_eq!(
        j["lease"]["max_expires_at_ms"].as_u64().unwrap(),
        j["lease"]["acquired_at_ms"].as_u64().unwrap() + 3_600_000
    );
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn held_and_get_never_show_the_lease_id() {
    let s = ValkeyServer::start();
    let first = acquire(&s.url(), "db", "alice", "10s");
    let held = run_ok(
        &s.url(),
        &[
            "acquire", "--target", "db", "--owner", "bob", "--ttl", "10s",
        ],
        "held",
        1,
    );
    assert_eq!(lease_keys(&held.json["lease"]), set(&PUBLIC_FIELDS));
    assert_eq!(held.json["lease"]["owner"], "alice");
    let got = run_ok(&s.url(), &["get", "--target", "db"], "found", 0);
    assert_eq!(lease_keys(&got.json["lease"]), set(&PUBLIC_FIELDS));
    assert_eq!(
        got.json["lease"]["fencing_token"],
        first["lease"]["fencing_token"]
    );
    let id = first["lease"]["lease_id"].as_str().unwrap();
    assert!(!held.stdout.contains(id) && !got.stdout.contains(id));
    assert!(!held.stderr.contains(id) && !got.stderr.contains(id));
}

#[test]
fn get_of_a_free_target_is_not_found() {
    let s = ValkeyServer::start();
    let r = run_ok(&s.url(), &["get", "--target", "nothing"], "not_found", 1);
    assert!(r.json["lease"].is_null());
    assert!(r.json["server_time_ms"].as_u64().unwrap() > 0);
}

fn holder_args(j: &Value) -> (String, String, String) {
    let l = &j["lease"];
    (
        l["owner"].as_str().unwrap().to_string(),
        l["lease_id"].as_str().unwrap().to_string(),
        l["fencing_token"].as_u64().unwrap().to_string(),
    )
}

#[test]
fn renew_extends_and_refuses_anyone_but_the_exact_holder() {
    let s = ValkeyServer::start();
    let u = s.url();
    let j = acquire(&u, "db", "alice", "5s");
    let (owner, id, token) = holder_args(&j);
    let r = run_ok(
        &u,
        &[
            "renew",
            "--target",
            "db",
            "--owner",
            &owner,
            "--lease-id",
            &id,
            "--token",
            &token,
            "--ttl",
            "60s",
        ],
        "renewed",
        0,
    );
    assert_eq!(lease_keys(&r.json["lease"]), set(&HOLDER_FIELDS));
    assert_eq!(r.json["lease"]["lease_id"], id.as_str());
    assert_eq!(
        r.json["lease"]["expires_at_ms"].as_u64().unwrap(),
        r.json["server_time_ms"].as_u64().unwrap() + 60_000
    );
    // Wrong lease id, wrong owner, wrong token: not_owner.
    for (o, i, t) in [
        (owner.as_str(), "not-the-id", token.as_str()),
        ("mallory", id.as_str(), token.as_str()),
        (owner.as_str(), id.as_str(), "99"),
    ] {
        let r = run_ok(
            &u,
            &[
                "renew",
                "--target",
                "db",
                "--owner",
                o,
                "--lease-id",
                i,
                "--token",
                t,
                "--ttl",
                "10s",
            ],
            "not_owner",
            1,
        );
        assert!(r.json["lease"].is_null() || r.json["lease"].get("lease_id").is_none());
    }
}

#[test]
fn renew_and_release_after_expiry_are_expired() {
    let s = ValkeyServer::start();
    let u = s.url();
    let j = acquire(&u, "db", "alice", "150ms");
    let (owner, id, token) = holder_args(&j);
    std::thread::sleep(Duration::from_millis(400));
    run_ok(
        &u,
        &[
            "renew",
            "--target",
            "db",
            "--owner",
            &owner,
            "--lease-id",
            &id,
            "--token",
            &token,
            "--ttl",
            "10s",
        ],
        "expired",
        1,
    );
    run_ok(
        &u,
        &[
            "release",
            "--target",
            "db",
            "--owner",
            &owner,
            "--lease-id",
            &id,
            "--token",
            &token,
        ],
        "expired",
        1,
    );
    run_ok(&u, &["get", "--target", "db"], "not_found", 1);
}

#[test]
fn release_frees_the_target_and_the_next_token_is_larger() {
    let s = ValkeyServer::start();
    let u = s.url();
    let j = acquire(&u, "db", "alice", "10s");
    let (owner, id, token) = holder_args(&j);
    // Not the holder: refused, the lease untouched.
    run_ok(
        &u,
        &[
            "release",
            "--target",
            "db",
            "--owner",
            "bob",
            "--lease-id",
            &id,
            "--token",
            &token,
        ],
        "not_owner",
        1,
    );
    run_ok(&u, &["get", "--target", "db"], "found", 0);
    run_ok(
        &u,
        &[
            "release",
            "--target",
            "db",
            "--owner",
            &owner,
            "--lease-id",
            &id,
            "--token",
            &token,
        ],
        "released",
        0,
    );
    run_ok(&u, &["get", "--target", "db"], "not_found", 1);
    let next = acquire(&u, "db", "bob", "10s");
    assert_eq!(next["lease"]["fencing_token"], 2);
}

#[test]
fn revoke_ends_any_lease_without_an_owner_check() {
    let s = ValkeyServer::start();
    let u = s.url();
    acquire(&u, "db", "alice", "10s");
    let r = run_ok(
        &u,
        &["revoke", "--target", "db", "--reason", "stuck job"],
        "revoked",
        0,
    );
    assert_eq!(r.json["lease"]["owner"], "alice");
    run_ok(&u, &["get", "--target", "db"], "not_found", 1);
    run_ok(&u, &["revoke", "--target", "db"], "not_found", 1);
    // The token counter survives a revoke.
    assert_eq!(acquire(&u, "db", "bob", "10s")["lease"]["fencing_token"], 2);
}

#[test]
fn commit_is_fenced_by_the_live_token() {
    let s = ValkeyServer::start();
    let u = s.url();
    let j = acquire(&u, "db", "alice", "10s");
    let (owner, id, token) = holder_args(&j);
    let ok = run_ok(
        &u,
        &[
            "commit", "--target", "db", "--token", &token, "--key", "k", "--value", "v1",
        ],
        "committed",
        0,
    );
    assert!(ok.json["lease"].is_null() || ok.json["lease"].get("lease_id").is_none());
    run_ok(
        &u,
        &[
            "commit", "--target", "db", "--token", "7", "--key", "k", "--value", "v2",
        ],
        "stale_token",
        1,
    );
    run_ok(
        &u,
        &[
            "release",
            "--target",
            "db",
            "--owner",
            &owner,
            "--lease-id",
            &id,
            "--token",
            &token,
        ],
        "released",
        0,
    );
    run_ok(
        &u,
        &[
            "commit", "--target", "db", "--token", &token, "--key", "k", "--value", "v3",
        ],
        "expired",
        1,
    );
    let stored = s
        .conn()
        .cmd(&["HGET", "targetlease:{default:db}:commit:k", "value"]);
    assert_eq!(stored, Resp::Bulk(Some("v1".into())));
}

#[test]
fn request_id_replays_and_conflicts() {
    let s = ValkeyServer::start();
    let u = s.url();
    let args = |ttl: &'static str| {
        vec![
            "acquire",
            "--target",
            "db",
            "--owner",
            "alice",
            "--ttl",
            ttl,
            "--request-id",
            "req-1",
        ]
    };
    let first = run_ok(&u, &args("10s"), "acquired", 0).json;
    let again = run_ok(&u, &args("10s"), "acquired", 0).json;
    assert_eq!(first["lease"]["lease_id"], again["lease"]["lease_id"]);
    assert_eq!(again["lease"]["fencing_token"], 1);
    let conflict = run_ok(&u, &args("20s"), "idempotency_conflict", 1);
    assert!(conflict.json["lease"].is_null());
    let fence = s.conn().cmd(&["GET", "targetlease:{default:db}:fence"]);
    assert_eq!(fence.text(), "1");
}

#[test]
fn tokens_beyond_2_pow_53_are_printed_exactly() {
    let s = ValkeyServer::start();
    let u = s.url();
    let big: u64 = (1u64 << 53) + 10;
    s.conn()
        .cmd(&["SET", "targetlease:{default:db}:fence", &big.to_string()]);
    let r = run_ok(
        &u,
        &[
            "acquire", "--target", "db", "--owner", "alice", "--ttl", "10s",
        ],
        "acquired",
        0,
    );
    let expected = big + 1;
    assert!(
        r.stdout.contains(&format!("\"fencing_token\":{expected}")),
        "{}",
        r.stdout
    );
    assert_eq!(r.json["lease"]["fencing_token"].as_u64(), Some(expected));
    let (owner, id, token) = holder_args(&r.json);
    assert_eq!(token, expected.to_string());
    // The exact token is accepted back; one off is not.
    run_ok(
        &u,
        &[
            "commit", "--target", "db", "--token", &token, "--key", "k", "--value", "v",
        ],
        "committed",
        0,
    );
    run_ok(
        &u,
        &[
            "commit",
            "--target",
            "db",
            "--token",
            &(expected - 1).to_string(),
            "--key",
            "k",
            "--value",
            "v",
        ],
        "stale_token",
        1,
    );
    run_ok(
        &u,
        &[
            "renew",
            "--target",
            "db",
            "--owner",
            &owner,
            "--lease-id",
            &id,
            "--token",
            &token,
            "--ttl",
            "10s",
        ],
        "renewed",
        0,
    );
    let got = run_ok(&u, &["get", "--target", "db"], "found", 0);
    assert!(
        got.stdout
            .contains(&format!("\"fencing_token\":{expected}"))
    );
}

#[test]
fn corrupt_state_exits_3() {
    let s = ValkeyServer::start();
    s.conn()
        .cmd(&["SET", "targetlease:{default:db}:lease", "garbage"]);
    let r = run_ok(&s.url(), &["get", "--target", "db"], "corrupt_state", 3);
    assert!(r.json["lease"].is_null());
    run_ok(
        &s.url(),
        &["acquire", "--target", "db", "--owner", "a", "--ttl", "1s"],
        "corrupt_state",
        3,
    );
    assert_eq!(
        s.conn().cmd(&["GET", "targetlease:{default:db}:lease"]),
        Resp::Bulk(Some("garbage".into()))
    );
}

/// Bad arguments: exit 2, a message on stderr, nothing on stdout, nothing written.
fn assert_usage_error(s: &ValkeyServer, args: &[&str], needle: &str) {
    let out = lease(&s.url(), args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stdout} {stderr}");
    assert!(stdout.is_empty(), "{args:?} printed to stdout: {stdout}");
    assert!(
        stderr.to_lowercase().contains(&needle.to_lowercase()),
        "{args:?}: stderr {stderr:?} should mention {needle:?}"
    );
    assert_eq!(dbsize(s), 0, "{args:?} wrote to valkey");
}

#[test]
fn bad_arguments_exit_2_and_write_nothing() {
    let s = ValkeyServer::start();
    let long = "o".repeat(257);
    let big_meta = format!(r#"{{"a":"{}"}}"#, "x".repeat(4100));
    let acq = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut v = vec!["acquire"];
        v.extend_from_slice(extra);
        v
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            acq(&["--target", "", "--owner", "o", "--ttl", "1s"]),
            "target must not be empty",
        ),
        (
            vec!["acquire", "--target", "t", "--owner", &long, "--ttl", "1s"],
            "owner is 257 bytes",
        ),
        (
            acq(&["--target", "t", "--owner", "", "--ttl", "1s"]),
            "owner must not be empty",
        ),
        (
            acq(&["--target", "t", "--owner", "o", "--ttl", "0s"]),
            "ttl must be at least",
        ),
        (
            acq(&["--target", "t", "--owner", "o", "--ttl", "1000days"]),
            "ttl must be at most",
        ),
        (
            acq(&["--target", "t", "--owner", "o", "--ttl", "soon"]),
            "--ttl",
        ),
        (
            acq(&[
                "--target",
                "t",
                "--owner",
                "o",
                "--ttl",
                "1s",
                "--metadata",
                "[1,2]",
            ]),
            "must be a JSON object",
        ),
        (
            acq(&[
                "--target",
                "t",
                "--owner",
                "o",
                "--ttl",
                "1s",
                "--metadata",
                "{nope",
            ]),
            "not valid JSON",
        ),
        (
            vec![
                "acquire",
                "--target",
                "t",
                "--owner",
                "o",
                "--ttl",
                "1s",
                "--metadata",
                &big_meta,
            ],
            "at most 4096",
        ),
        (acq(&["--target", "t", "--owner", "o"]), "--ttl"),
        (acq(&["--owner", "o", "--ttl", "1s"]), "--target"),
        (
            acq(&["--target", "t", "--owner", "o", "--ttl", "1s", "--bogus"]),
            "--bogus",
        ),
        (
            vec![
                "renew",
                "--target",
                "t",
                "--owner",
                "o",
                "--lease-id",
                "l",
                "--token",
                "0",
                "--ttl",
                "1s",
            ],
            "token must be between",
        ),
        (
            vec![
                "renew",
                "--target",
                "t",
                "--owner",
                "o",
                "--lease-id",
                "l",
                "--token",
                "-1",
                "--ttl",
                "1s",
            ],
            "--token",
        ),
        (
            vec![
                "release",
                "--target",
                "t",
                "--owner",
                "o",
                "--lease-id",
                "l",
                "--token",
                "1.5",
            ],
            "--token",
        ),
        (
            vec![
                "release",
                "--target",
                "t",
                "--owner",
                "o",
                "--lease-id",
                "",
                "--token",
                "1",
            ],
            "lease id must not be empty",
        ),
        (
            vec![
                "commit", "--target", "t", "--token", "1", "--key", "", "--value", "v",
            ],
            "key must not be empty",
        ),
        (
            vec!["commit", "--target", "t", "--key", "k", "--value", "v"],
            "--token",
        ),
        (
            vec!["get", "--target", "t", "--namespace", ""],
            "namespace must not be empty",
        ),
        (
            vec![
                "get",
                "--target",
                "t",
                "--password-file",
                "/nonexistent/targetlease-password",
            ],
            "cannot read password file",
        ),
        (
            vec!["get", "--target", "t", "--key-prefix", "a{b"],
            "key prefix",
        ),
    ];
    for (args, needle) in &cases {
        assert_usage_error(&s, args, needle);
    }
    // And the server still answers: nothing was wrong with it.
    run_ok(&s.url(), &["get", "--target", "t"], "not_found", 1);
}

#[test]
fn an_unreachable_server_is_backend_unavailable_within_the_deadline() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    for args in [
        vec!["get", "--target", "db"],
        vec!["acquire", "--target", "db", "--owner", "o", "--ttl", "1s"],
    ] {
        let started = Instant::now();
        let mut all = args.clone();
        all.extend_from_slice(&["--timeout", "1s", "--connect-timeout", "1s"]);
        let r = parse(lease(&url, &all));
        assert_eq!(r.json["outcome"], "backend_unavailable", "{}", r.stdout);
        assert_eq!(r.code, 3);
        assert!(r.json["lease"].is_null());
        assert_eq!(r.json["server_time_ms"], 0);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn a_server_that_stops_answering_gives_outcome_unknown_then_the_same_request_id_resolves_it() {
    let s = ValkeyServer::start();
    let u = s.url();
    // Write commands (scripts) wait; connecting and loading scripts still work.
    let paused_at = Instant::now();
    s.conn().cmd(&["CLIENT", "PAUSE", "5000", "WRITE"]);
    let args = [
        "acquire",
        "--target",
        "db",
        "--owner",
        "alice",
        "--ttl",
        "30s",
        "--request-id",
        "req-unknown",
        "--timeout",
        "300ms",
    ];
    let r = run_ok(&u, &args, "outcome_unknown", 3);
    assert!(r.json["lease"].is_null());
    assert_eq!(r.json["server_time_ms"], 0);
    assert!(
        r.json["message"].as_str().unwrap().contains("req-unknown"),
        "{}",
        r.stdout
    );
    std::thread::sleep(
        (paused_at + Duration::from_millis(5200)).saturating_duration_since(Instant::now()),
    );
    // Whether or not the paused attempt ran, the retry ends with one lease, one token.
    let again = run_ok(&u, &args, "acquired", 0);
    assert_eq!(again.json["lease"]["fencing_token"], 1);
    let fence = s.conn().cmd(&["GET", "targetlease:{default:db}:fence"]);
    assert_eq!(fence.text(), "1");
}

#[test]
fn env_fallbacks_replace_every_flag() {
    let s = ValkeyServer::start();
    let out = tl(&["lease", "acquire"])
        .env("TARGETLEASE_VALKEY_URL", s.url())
        .env("TARGETLEASE_TARGET", "db")
        .env("TARGETLEASE_OWNER", "env-owner")
        .env("TARGETLEASE_TTL", "10s")
        .env("TARGETLEASE_NAMESPACE", "team-a")
        .env("TARGETLEASE_METADATA", r#"{"from":"env"}"#)
        .env("TARGETLEASE_KEY_PREFIX", "tl-env")
        .output()
        .unwrap();
    let r = parse(out);
    assert_eq!(r.json["outcome"], "acquired", "{}", r.stderr);
    assert_eq!(r.json["lease"]["owner"], "env-owner");
    assert_eq!(r.json["lease"]["metadata"]["from"], "env");
    assert_eq!(
        s.conn().cmd(&["EXISTS", "tl-env:{team-a:db}:lease"]).int(),
        1
    );
    let (_, id, token) = holder_args(&r.json);

    // The holder's identity comes from the same variables `run` exports.
    let out = tl(&["lease", "renew"])
        .env("TARGETLEASE_VALKEY_URL", s.url())
        .env("TARGETLEASE_TARGET", "db")
        .env("TARGETLEASE_OWNER", "env-owner")
        .env("TARGETLEASE_TTL", "20s")
        .env("TARGETLEASE_NAMESPACE", "team-a")
        .env("TARGETLEASE_KEY_PREFIX", "tl-env")
        .env("TARGETLEASE_LEASE_ID", &id)
        .env("TARGETLEASE_FENCING_TOKEN", &token)
        .output()
        .unwrap();
    assert_eq!(parse(out).json["outcome"], "renewed");

    // Another namespace (the default) does not see it; flags beat env.
    let out = tl(&["lease", "get", "--namespace", "default"])
        .env("TARGETLEASE_VALKEY_URL", s.url())
        .env("TARGETLEASE_TARGET", "db")
        .env("TARGETLEASE_NAMESPACE", "team-a")
        .env("TARGETLEASE_KEY_PREFIX", "tl-env")
        .output()
        .unwrap();
    assert_eq!(parse(out).json["outcome"], "not_found");
    let out = tl(&["lease", "commit", "--key", "k", "--value", "v"])
        .env("TARGETLEASE_VALKEY_URL", s.url())
        .env("TARGETLEASE_TARGET", "db")
        .env("TARGETLEASE_NAMESPACE", "team-a")
        .env("TARGETLEASE_KEY_PREFIX", "tl-env")
        .env("TARGETLEASE_FENCING_TOKEN", &token)
        .env("TARGETLEASE_TIMEOUT", "3s")
        .output()
        .unwrap();
    assert_eq!(parse(out).json["outcome"], "committed");
}

#[test]
fn passwords_and_metadata_never_reach_logs_even_at_trace() {
    let secret = "s3cret-Pa55word-do-not-log";
    let s = ValkeyServer::start_with(&["--requirepass", secret]);
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("password");
    std::fs::write(&pw, format!("{secret}\n")).unwrap();
    let pw = pw.to_str().unwrap().to_string();
    let meta_text = "metadata-canary-7731";
    let meta = format!(r#"{{"note":"{meta_text}"}}"#);

    let traced = |args: &[&str]| -> (i32, String, String) {
        let out = tl(args)
            .env(
                "RUST_LOG",
                "trace,fred=trace,fred::protocol=trace,redis_protocol=trace",
            )
            .env("TARGETLEASE_VALKEY_URL", s.url())
            .env("TARGETLEASE_PASSWORD_FILE", &pw)
            .output()
            .unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let mut outputs = Vec::new();
    let (code, stdout, stderr) = traced(&[
        "lease",
        "acquire",
        "--target",
        "db",
        "--owner",
        "alice",
        "--ttl",
        "10s",
        "--metadata",
        &meta,
    ]);
    assert_eq!(code, 0, "{stdout} {stderr}");
    let j: Value = serde_json::from_str(stdout.trim()).unwrap();
    let (owner, id, token) = holder_args(&j);
    assert!(stdout.contains(meta_text), "acquire shows its own metadata");
    outputs.push((stdout, stderr));
    for args in [
        vec!["lease", "get", "--target", "db"],
        vec![
            "lease",
            "renew",
            "--target",
            "db",
            "--owner",
            &owner,
            "--lease-id",
            &id,
            "--token",
            &token,
            "--ttl",
            "10s",
        ],
        vec![
            "lease", "commit", "--target", "db", "--token", &token, "--key", "k", "--value", "v",
        ],
        vec![
            "lease",
            "release",
            "--target",
            "db",
            "--owner",
            &owner,
            "--lease-id",
            &id,
            "--token",
            &token,
        ],
        vec![
            "run",
            "--target",
            "db2",
            "--owner",
            "alice",
            "--ttl",
            "1s",
            "--metadata",
            &meta,
            "--",
            "true",
        ],
    ] {
        let (code, stdout, stderr) = traced(&args);
        assert_eq!(code, 0, "{args:?}: {stdout} {stderr}");
        outputs.push((stdout, stderr));
    }
    // Trace logging is really on (so the check below means something).
    assert!(
        outputs
            .iter()
            .any(|(_, e)| e.contains("TRACE") || e.contains("DEBUG")),
        "no debug/trace lines at RUST_LOG=trace"
    );
    for (stdout, stderr) in &outputs {
        // The client library, which sees the password and every command, stays capped at warn.
        assert!(
            !stderr.lines().any(|l| l.contains("fred")
                && ["TRACE", "DEBUG", "INFO"].iter().any(|lvl| l.contains(lvl))),
            "client library logged below warn: {stderr}"
        );
        assert!(!stdout.contains(secret), "password on stdout: {stdout}");
        assert!(!stderr.contains(secret), "password on stderr: {stderr}");
        assert!(!stderr.contains(meta_text), "metadata on stderr: {stderr}");
    }

    // A wrong password is backend trouble (exit 3) and is never echoed.
    let wrong = "wr0ng-Pa55word-canary";
    let wrong_file = dir.path().join("wrong");
    std::fs::write(&wrong_file, wrong).unwrap();
    for file in [wrong_file.to_str().unwrap(), pw.as_str()] {
        let out = tl(&["lease", "get", "--target", "db", "--timeout", "1s"])
            .env("RUST_LOG", "trace")
            .env("TARGETLEASE_VALKEY_URL", s.url())
            .env("TARGETLEASE_PASSWORD_FILE", file)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        for text in [&stdout, &stderr] {
            assert!(!text.contains(wrong) && !text.contains(secret), "{text}");
        }
        if file == pw {
            assert_eq!(out.status.code(), Some(1), "{stdout} {stderr}");
        } else {
            assert_eq!(out.status.code(), Some(3), "{stdout} {stderr}");
            let j: Value = serde_json::from_str(stdout.trim()).unwrap();
            assert_eq!(j["outcome"], "backend_unavailable");
        }
    }
    // No password at all: refused by the server, exit 3.
    let out = tl(&["lease", "get", "--target", "db"])
        .env("TARGETLEASE_VALKEY_URL", s.url())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
}

/// `lease <args> --valkey-url <url> --timeout 1s --connect-timeout 1s`, which
/// must end within `limit`.
fn lease_within(url: &str, args: &[&str], limit: Duration) -> (Res, Duration) {
    let mut all = vec!["lease"];
    all.extend_from_slice(args);
    all.extend_from_slice(&[
        "--valkey-url",
        url,
        "--timeout",
        "1s",
        "--connect-timeout",
        "1s",
    ]);
    let (out, took) = deadline::output_within(tl(&all), limit);
    (parse(out), took)
}

/// No Rust `Debug` output, no client-library chatter: a category and a cause.
fn assert_plain(r: &Res) {
    let msg = r.json["message"].as_str().unwrap();
    for debug in ["Os {", "kind:", "IO:", "Kind(", "Error {"] {
        assert!(!msg.contains(debug), "debug output in {msg:?}");
    }
    assert!(
        !r.stderr.contains("Attempted to quit"),
        "stray client warning: {}",
        r.stderr
    );
}

#[test]
fn a_silent_server_is_reported_within_the_connect_timeout() {
    let silent = fault_proxy::FaultProxy::silent();
    for args in [
        vec!["get", "--target", "db"],
        vec!["acquire", "--target", "db", "--owner", "o", "--ttl", "10s"],
        vec!["revoke", "--target", "db"],
    ] {
        let (r, took) = lease_within(&silent.url(), &args, Duration::from_secs(3));
        assert_eq!(
            r.json["outcome"], "backend_unavailable",
            "{args:?}: {}",
            r.stdout
        );
        assert_eq!(r.code, 3);
        assert_plain(&r);
        eprintln!("{args:?} against a silent server: {took:?}");
    }
}

#[test]
fn a_server_that_stops_answering_mid_call_is_bounded_by_the_timeout() {
    let s = ValkeyServer::start();
    let proxy = fault_proxy::FaultProxy::start(&s.addr());
    proxy.silence_from("EVALSHA_RO");
    let (r, took) = lease_within(
        &proxy.url(),
        &["get", "--target", "db"],
        Duration::from_secs(4),
    );
    assert_eq!(r.json["outcome"], "backend_unavailable", "{}", r.stdout);
    assert_plain(&r);
    eprintln!("get with no reply: {took:?}");
    proxy.silence_from("EVALSHA");
    let args = [
        "acquire",
        "--target",
        "db",
        "--owner",
        "o",
        "--ttl",
        "10s",
        "--request-id",
        "req-silent",
    ];
    let (r, took) = lease_within(&proxy.url(), &args, Duration::from_secs(4));
    assert_eq!(r.json["outcome"], "outcome_unknown", "{}", r.stdout);
    assert!(r.json["message"].as_str().unwrap().contains("req-silent"));
    assert_plain(&r);
    eprintln!("acquire with no reply: {took:?}");
}

#[test]
fn errors_name_a_plain_category_and_cause() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    let (r, _) = lease_within(&url, &["get", "--target", "db"], Duration::from_secs(3));
    assert_eq!(r.json["outcome"], "backend_unavailable");
    assert_plain(&r);
    let msg = r.json["message"].as_str().unwrap();
    assert!(msg.to_lowercase().contains("refused"), "{msg}");
}

#[test]
fn a_lost_reply_is_outcome_unknown_and_never_sent_twice() {
    let s = ValkeyServer::start();
    let proxy = fault_proxy::FaultProxy::start(&s.addr());
    let u = s.url();
    acquire(&u, "db", "alice", "30s");
    proxy.cut_before_reply("EVALSHA");
    let (r, _) = lease_within(
        &proxy.url(),
        &["revoke", "--target", "db", "--request-id", "rv-1"],
        Duration::from_secs(4),
    );
    assert_eq!(r.json["outcome"], "outcome_unknown", "{}", r.stdout);
    assert!(r.json["message"].as_str().unwrap().contains("rv-1"));
    assert_eq!(proxy.forwarded("EVALSHA"), 1, "sent once");
    // Bob takes the target; the retry of the lost revoke must not end his lease.
    let bob = acquire(&u, "db", "bob", "30s");
    let r = run_ok(
        &u,
        &["revoke", "--target", "db", "--request-id", "rv-1"],
        "revoked",
        0,
    );
    assert!(
        r.json["message"].as_str().unwrap().contains("replayed"),
        "{}",
        r.stdout
    );
    let got = run_ok(&u, &["get", "--target", "db"], "found", 0);
    assert_eq!(got.json["lease"]["owner"], "bob");
    assert_eq!(
        got.json["lease"]["fencing_token"],
        bob["lease"]["fencing_token"]
    );
}

#[test]
fn revoke_with_an_expected_token_ends_only_that_lease() {
    let s = ValkeyServer::start();
    let u = s.url();
    let alice = acquire(&u, "db", "alice", "30s");
    let token = alice["lease"]["fencing_token"].to_string();
    let wrong = (alice["lease"]["fencing_token"].as_u64().unwrap() + 1).to_string();
    let r = run_ok(
        &u,
        &["revoke", "--target", "db", "--token", &wrong],
        "not_owner",
        1,
    );
    assert!(r.json["lease"].is_null(), "{}", r.stdout);
    run_ok(&u, &["get", "--target", "db"], "found", 0);
    let r = run_ok(
        &u,
        &["revoke", "--target", "db", "--token", &token],
        "revoked",
        0,
    );
    assert_eq!(r.json["lease"]["owner"], "alice");
    assert!(r.json["lease"].get("lease_id").is_none());
    run_ok(&u, &["get", "--target", "db"], "not_found", 1);
}
