//! Bad input: exit 2 and nothing written; every flag has an environment fallback; secrets never reach logs.

use super::*;

/// Bad arguments: exit 2, a message on stderr, nothing on stdout, nothing written.
fn assert_usage_error(s: &ValkeyServer, command: &Lease, needle: &str) {
    let args = command.args();
    let out = command.output();
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
    let u = s.url();
    let cases = [
        (
            lease(&u, "acquire").target("").owner("o").ttl("1s"),
            "target must not be empty",
        ),
        (
            lease(&u, "acquire").target("t").owner(&long).ttl("1s"),
            "owner is 257 bytes",
        ),
        (
            lease(&u, "acquire").target("t").owner("").ttl("1s"),
            "owner must not be empty",
        ),
        (
            lease(&u, "acquire").target("t").owner("o").ttl("0s"),
            "ttl must be at least",
        ),
        (
            lease(&u, "acquire").target("t").owner("o").ttl("1000days"),
            "ttl must be at most",
        ),
        (
            lease(&u, "acquire").target("t").owner("o").ttl("soon"),
            "--ttl",
        ),
        (
            lease(&u, "acquire")
                .target("t")
                .owner("o")
                .ttl("1s")
                .flag("metadata", "[1,2]"),
            "must be a JSON object",
        ),
        (
            lease(&u, "acquire")
                .target("t")
                .owner("o")
                .ttl("1s")
                .flag("metadata", "{nope"),
            "not valid JSON",
        ),
        (
            lease(&u, "acquire")
                .target("t")
                .owner("o")
                .ttl("1s")
                .flag("metadata", &big_meta),
            "at most 4096",
        ),
        (
            lease(&u, "renew").target("t").lease_id("l").token("1"),
            "--owner",
        ),
        (lease(&u, "acquire").owner("o").ttl("1s"), "--target"),
        (
            lease(&u, "acquire")
                .target("t")
                .owner("o")
                .ttl("1s")
                .switch("bogus"),
            "--bogus",
        ),
        (
            lease(&u, "renew")
                .target("t")
                .owner("o")
                .lease_id("l")
                .token("0")
                .ttl("1s"),
            "token must be between",
        ),
        (
            lease(&u, "renew")
                .target("t")
                .owner("o")
                .lease_id("l")
                .token("-1")
                .ttl("1s"),
            "token must be between 1 and 9223372036854775807",
        ),
        (
            lease(&u, "release")
                .target("t")
                .owner("o")
                .lease_id("l")
                .token("1.5"),
            "token must be between 1 and 9223372036854775807 (a whole number)",
        ),
        (
            lease(&u, "release")
                .target("t")
                .owner("o")
                .lease_id("")
                .token("1"),
            "lease id must not be empty",
        ),
        (
            lease(&u, "commit")
                .target("t")
                .token("1")
                .flag("key", "")
                .flag("value", "v"),
            "key must not be empty",
        ),
        (
            lease(&u, "commit")
                .target("t")
                .flag("key", "k")
                .flag("value", "v"),
            "--token",
        ),
        (
            lease(&u, "get").target("t").flag("namespace", ""),
            "namespace must not be empty",
        ),
        (
            lease(&u, "get")
                .target("t")
                .flag("password-file", "/nonexistent/targetlease-password"),
            "cannot read password file /nonexistent/targetlease-password: No such file or directory",
        ),
        (
            lease(&u, "get").target("t").flag("key-prefix", "a{b"),
            "key prefix",
        ),
    ];

    for (command, needle) in &cases {
        assert_usage_error(&s, command, needle);
    }
    // And the server still answers: nothing was wrong with it.
    lease(&s.url(), "get").target("t").ok("not_found", 1);
}

#[test]
fn env_fallbacks_replace_every_flag() {
    let s = ValkeyServer::start();
    // `lease <op>` with the server, target, namespace and key prefix from the environment.
    let from_env = |op: &str| {
        let mut cmd = targetlease(&["lease", op]);
        cmd.env("TARGETLEASE_VALKEY_URL", s.url())
            .env("TARGETLEASE_TARGET", "db")
            .env("TARGETLEASE_NAMESPACE", "team-a")
            .env("TARGETLEASE_KEY_PREFIX", "tl-env");
        cmd
    };
    let out = from_env("acquire")
        .env("TARGETLEASE_OWNER", "env-owner")
        .env("TARGETLEASE_TTL", "10s")
        .env("TARGETLEASE_METADATA", r#"{"from":"env"}"#)
        .output()
        .unwrap();
    let r = Res::parse(out);
    assert_eq!(r.json["outcome"], "acquired", "{}", r.stderr);
    assert_eq!(r.json["lease"]["owner"], "env-owner");
    assert_eq!(r.json["lease"]["metadata"]["from"], "env");
    assert_eq!(
        s.conn()
            .cmd(&["HEXISTS", "tl-env:{team-a:db}", "lease"])
            .int(),
        1
    );
    let (_, id, token) = handle_args(&r.json);

    // The holder's identity comes from the same variables `run` exports.
    let out = from_env("renew")
        .env("TARGETLEASE_OWNER", "env-owner")
        .env("TARGETLEASE_TTL", "20s")
        .env("TARGETLEASE_LEASE_ID", &id)
        .env("TARGETLEASE_FENCING_TOKEN", &token)
        .output()
        .unwrap();
    assert_eq!(Res::parse(out).json["outcome"], "renewed");

    // `list`: every namespace (-A) and the target prefix come from it too.
    for (ns, target) in [("team-b", "dbx"), ("team-b", "other")] {
        lease(&s.url(), "acquire")
            .target(target)
            .flag("namespace", ns)
            .flag("key-prefix", "tl-env")
            .ok("acquired", 0);
    }
    let listed = |all: &str| -> Vec<(String, String)> {
        let out = from_env("list")
            .env("TARGETLEASE_ALL_NAMESPACES", all)
            .env("TARGETLEASE_TARGET_PREFIX", "db")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let e: Value = serde_json::from_str(l).unwrap();
                let s = |k: &str| e[k].as_str().unwrap().to_owned();
                (s("namespace"), s("target"))
            })
            .collect()
    };
    let pair = |ns: &str, t: &str| (ns.to_owned(), t.to_owned());
    assert_eq!(
        listed("true"),
        [pair("team-a", "db"), pair("team-b", "dbx")]
    );
    assert_eq!(listed("false"), [pair("team-a", "db")]);

    // Another namespace (the default) does not see it; flags beat env.
    let out = from_env("get")
        .args(["--namespace", "default"])
        .output()
        .unwrap();
    assert_eq!(Res::parse(out).json["outcome"], "not_found");
    let out = from_env("commit")
        .args(["--key", "k", "--value", "v"])
        .env("TARGETLEASE_FENCING_TOKEN", &token)
        .env("TARGETLEASE_TIMEOUT", "3s")
        .output()
        .unwrap();
    assert_eq!(Res::parse(out).json["outcome"], "committed");
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

    let traced = |mut cmd: Command| -> (i32, String, String) {
        let out = cmd
            .env(
                "RUST_LOG",
                "trace,fred=trace,fred::protocol=trace,redis_protocol=trace",
            )
            .env("TARGETLEASE_PASSWORD_FILE", &pw)
            .output()
            .unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let u = s.url();
    let mut outputs = Vec::new();
    let acquire = lease(&u, "acquire")
        .target("db")
        .owner("alice")
        .ttl("10s")
        .flag("metadata", &meta);
    let (code, stdout, stderr) = traced(acquire.command());
    assert_eq!(code, 0, "{stdout} {stderr}");
    let j: Value = serde_json::from_str(stdout.trim()).unwrap();
    let (_, _, token) = handle_args(&j);
    assert!(stdout.contains(meta_text), "acquire shows its own metadata");
    outputs.push((stdout, stderr));
    for cmd in [
        lease(&u, "get").target("db").command(),
        lease(&u, "renew")
            .target("db")
            .handle(&j)
            .ttl("10s")
            .command(),
        commit(&u, &token, "v").command(),
        lease(&u, "release").target("db").handle(&j).command(),
        run(&u, "db2", "alice", "1s")
            .with(&["--metadata", &meta])
            .exec(&["true"]),
    ] {
        let args = format!("{cmd:?}");
        let (code, stdout, stderr) = traced(cmd);
        assert_eq!(code, 0, "{args}: {stdout} {stderr}");
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
        let out = targetlease(&["lease", "get", "--target", "db", "--timeout", "1s"])
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
    let out = targetlease(&["lease", "get", "--target", "db"])
        .env("TARGETLEASE_VALKEY_URL", s.url())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
}
