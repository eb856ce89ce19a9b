//! Granting, renewing, releasing, revoking and committing: what each command prints and what it changes.

use super::*;

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
    let j = lease(&s.url(), "acquire")
        .target("db2")
        .owner("bob")
        .ttl("10s")
        .flag("max-lifetime", "1h")
        .flag("metadata", r#"{"job":"nightly","n":3}"#)
        .ok("acquired", 0)
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

#[test]
fn held_and_get_never_show_the_lease_id() {
    let s = ValkeyServer::start();
    let first = acquire(&s.url(), "db", "alice", "10s");
    let held = lease(&s.url(), "acquire")
        .target("db")
        .owner("bob")
        .ttl("10s")
        .ok("held", 1);
    assert_eq!(lease_keys(&held.json["lease"]), set(&PUBLIC_FIELDS));
    assert_eq!(held.json["lease"]["owner"], "alice");
    let got = lease(&s.url(), "get").target("db").ok("found", 0);
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
    let r = lease(&s.url(), "get").target("nothing").ok("not_found", 1);
    assert!(r.json["lease"].is_null());
    assert!(r.json["server_time_ms"].as_u64().unwrap() > 0);
}

#[test]
fn renew_extends_and_refuses_anyone_but_the_exact_holder() {
    let s = ValkeyServer::start();
    let u = s.url();
    let j = acquire(&u, "db", "alice", "5s");
    let (owner, id, token) = handle_args(&j);
    let r = lease(&u, "renew")
        .target("db")
        .handle(&j)
        .ttl("60s")
        .ok("renewed", 0);
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
        let r = lease(&u, "renew")
            .target("db")
            .owner(o)
            .lease_id(i)
            .token(t)
            .ttl("10s")
            .ok("not_owner", 1);
        assert!(r.json["lease"].is_null() || r.json["lease"].get("lease_id").is_none());
    }
}

#[test]
fn renew_and_release_after_expiry_are_expired() {
    let s = ValkeyServer::start();
    let u = s.url();
    let j = acquire(&u, "db", "alice", "150ms");
    std::thread::sleep(Duration::from_millis(400));
    lease(&u, "renew")
        .target("db")
        .handle(&j)
        .ttl("10s")
        .ok("expired", 1);
    lease(&u, "release")
        .target("db")
        .handle(&j)
        .ok("expired", 1);
    lease(&u, "get").target("db").ok("not_found", 1);
}

#[test]
fn release_frees_the_target_and_the_next_token_is_larger() {
    let s = ValkeyServer::start();
    let u = s.url();
    let j = acquire(&u, "db", "alice", "10s");
    let (_, id, token) = handle_args(&j);
    // Not the holder: refused, the lease untouched.
    lease(&u, "release")
        .target("db")
        .owner("bob")
        .lease_id(&id)
        .token(&token)
        .ok("not_owner", 1);
    lease(&u, "get").target("db").ok("found", 0);
    lease(&u, "release")
        .target("db")
        .handle(&j)
        .ok("released", 0);
    lease(&u, "get").target("db").ok("not_found", 1);
    let next = acquire(&u, "db", "bob", "10s");
    assert_eq!(next["lease"]["fencing_token"], 2);
}

#[test]
fn revoke_ends_any_lease_without_an_owner_check() {
    let s = ValkeyServer::start();
    let u = s.url();
    acquire(&u, "db", "alice", "10s");
    let r = lease(&u, "revoke").target("db").ok("revoked", 0);
    assert_eq!(r.json["lease"]["owner"], "alice");
    lease(&u, "get").target("db").ok("not_found", 1);
    lease(&u, "revoke").target("db").ok("not_found", 1);
    // The token counter survives a revoke.
    assert_eq!(acquire(&u, "db", "bob", "10s")["lease"]["fencing_token"], 2);
}

#[test]
fn revoke_with_an_expected_token_ends_only_that_lease() {
    let s = ValkeyServer::start();
    let u = s.url();
    let alice = acquire(&u, "db", "alice", "30s");
    let token = alice["lease"]["fencing_token"].to_string();
    let wrong = (alice["lease"]["fencing_token"].as_u64().unwrap() + 1).to_string();
    let r = lease(&u, "revoke")
        .target("db")
        .token(&wrong)
        .ok("not_owner", 1);
    assert!(r.json["lease"].is_null(), "{}", r.stdout);
    lease(&u, "get").target("db").ok("found", 0);
    let r = lease(&u, "revoke")
        .target("db")
        .token(&token)
        .ok("revoked", 0);
    assert_eq!(r.json["lease"]["owner"], "alice");
    assert!(r.json["lease"].get("lease_id").is_none());
    lease(&u, "get").target("db").ok("not_found", 1);
}

#[test]
fn commit_is_fenced_by_the_live_token() {
    let s = ValkeyServer::start();
    let u = s.url();
    let j = acquire(&u, "db", "alice", "10s");
    let (_, _, token) = handle_args(&j);
    let ok = commit(&u, &token, "v1").ok("committed", 0);
    assert!(ok.json["lease"].is_null() || ok.json["lease"].get("lease_id").is_none());
    commit(&u, "7", "v2").ok("stale_token", 1);
    lease(&u, "release")
        .target("db")
        .handle(&j)
        .ok("released", 0);
    commit(&u, &token, "v3").ok("expired", 1);
    let stored = s.conn().cmd(&["HGET", "targetlease:{default:db}", "c:k"]);
    let stored = stored.text();
    assert!(stored.ends_with(":v1"), "{stored}");
}

#[test]
fn request_id_replays_and_conflicts() {
    let s = ValkeyServer::start();
    let u = s.url();
    let acquire = |ttl: &str| {
        lease(&u, "acquire")
            .target("db")
            .owner("alice")
            .ttl(ttl)
            .request_id("req-1")
    };
    let first = acquire("10s").ok("acquired", 0).json;
    let again = acquire("10s").ok("acquired", 0).json;
    assert_eq!(first["lease"]["lease_id"], again["lease"]["lease_id"]);
    assert_eq!(again["lease"]["fencing_token"], 1);
    let conflict = acquire("20s").ok("idempotency_conflict", 1);
    assert!(conflict.json["lease"].is_null());
    let fence = s.conn().cmd(&["HGET", "targetlease:{default:db}", "fence"]);
    assert_eq!(fence.text(), "1");
}

#[test]
fn tokens_beyond_2_pow_53_are_printed_exactly() {
    let s = ValkeyServer::start();
    let u = s.url();
    let big: u64 = (1u64 << 53) + 10;
    s.conn().cmd(&[
        "HSET",
        "targetlease:{default:db}",
        "fence",
        &big.to_string(),
    ]);
    let r = lease(&u, "acquire")
        .target("db")
        .owner("alice")
        .ttl("10s")
        .ok("acquired", 0);
    let expected = big + 1;
    assert!(
        r.stdout.contains(&format!("\"fencing_token\":{expected}")),
        "{}",
        r.stdout
    );
    assert_eq!(r.json["lease"]["fencing_token"].as_u64(), Some(expected));
    let (_, _, token) = handle_args(&r.json);
    assert_eq!(token, expected.to_string());
    // The exact token is accepted back; one off is not.
    commit(&u, &token, "v").ok("committed", 0);
    commit(&u, expected - 1, "v").ok("stale_token", 1);
    lease(&u, "renew")
        .target("db")
        .handle(&r.json)
        .ttl("10s")
        .ok("renewed", 0);
    let got = lease(&u, "get").target("db").ok("found", 0);
    assert!(
        got.stdout
            .contains(&format!("\"fencing_token\":{expected}"))
    );
}

#[test]
fn corrupt_state_exits_3() {
    let s = ValkeyServer::start();
    s.conn()
        .cmd(&["HSET", "targetlease:{default:db}", "lease", "garbage"]);
    let r = lease(&s.url(), "get").target("db").ok("corrupt_state", 3);
    assert!(r.json["lease"].is_null());
    lease(&s.url(), "acquire")
        .target("db")
        .owner("a")
        .ttl("1s")
        .ok("corrupt_state", 3);
    assert_eq!(
        s.conn().cmd(&["HGET", "targetlease:{default:db}", "lease"]),
        Resp::Bulk(Some("garbage".into()))
    );
}

#[test]
fn owner_namespace_and_ttl_defaults_say_who_and_where() {
    let s = ValkeyServer::start();
    let u = s.url();
    let j = lease(&u, "acquire").target("db").ok("acquired", 0).json;
    let l = &j["lease"];
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let user = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let user = String::from_utf8(user.stdout).unwrap();
    let owner = l["owner"].as_str().unwrap();
    let pid = owner
        .strip_prefix(&format!("{}@{}:", user.trim(), host.trim()))
        .unwrap_or_else(|| panic!("owner {owner:?} is not user@host:pid"));
    assert!(pid.parse::<u32>().is_ok(), "{owner}");
    assert_eq!(
        l["expires_at_ms"].as_u64().unwrap() - l["acquired_at_ms"].as_u64().unwrap(),
        30_000
    );
    // Renew keeps the documented default too.
    let r = lease(&u, "renew").target("db").handle(&j).ok("renewed", 0);
    assert_eq!(
        r.json["lease"]["expires_at_ms"].as_u64().unwrap(),
        r.json["server_time_ms"].as_u64().unwrap() + 30_000
    );

    // In a pod (the downward API's POD_NAME and POD_NAMESPACE): the pod is
    // the owner and its namespace the tenant.
    let r = Res::parse(
        lease(&u, "acquire")
            .target("web")
            .command()
            .env("POD_NAME", "web-7f9c4-x2")
            .env("POD_NAMESPACE", "shop")
            .output()
            .unwrap(),
    );
    assert_eq!(r.json["lease"]["owner"], "web-7f9c4-x2", "{}", r.stdout);
    lease(&u, "get")
        .target("web")
        .flag("namespace", "shop")
        .ok("found", 0);
    lease(&u, "get").target("web").ok("not_found", 1);

    // Outside a pod: the kubeconfig's current namespace, as kubectl and
    // `token` take it; in a pod, the pod's namespace still wins.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("config");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\ncurrent-context: here\nclusters: []\nusers: []\n\
         contexts:\n\
         - {name: there, context: {cluster: c, user: u, namespace: team-x}}\n\
         - {name: here, context: {cluster: c, user: u, namespace: team-k}}\n",
    )
    .unwrap();
    for (target, pod_namespace, tenant) in [("k8s", None, "team-k"), ("pod", Some("shop"), "shop")]
    {
        let mut acquire = lease(&u, "acquire").target(target).command();
        acquire.env("KUBECONFIG", &kubeconfig);
        if let Some(ns) = pod_namespace {
            acquire.env("POD_NAMESPACE", ns);
        }
        let r = Res::parse(acquire.output().unwrap());
        assert_eq!(r.json["outcome"], "acquired", "{}", r.stderr);
        lease(&u, "get")
            .target(target)
            .flag("namespace", tenant)
            .ok("found", 0);
    }
}

#[test]
fn get_prints_a_line_for_people_with_output_text() {
    let s = ValkeyServer::start();
    let u = s.url();
    let j = acquire(&u, "db", "alice", "90s");
    let out = lease(&u, "get")
        .target("db")
        .flag("output", "text")
        .output();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("found: db held by alice with token 1, expires in 1m")
            && text.ends_with("Z)\n")
            && text.lines().count() == 1,
        "{text:?}"
    );
    let id = j["lease"]["lease_id"].as_str().unwrap();
    assert!(!text.contains(id), "the lease id is never shown");
    let (code, text) = as_text(lease(&u, "get").target("other"));
    assert_eq!(code, Some(1), "a refusal keeps its exit code");
    assert!(text.starts_with("not_found: "), "{text:?}");
}

#[test]
fn completions_help_headings_and_examples() {
    for shell in ["bash", "zsh", "fish"] {
        let out = targetlease(&["completion", shell]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(
            script.contains("acquire") && script.contains("valkey-url"),
            "{shell}"
        );
    }
    let out = targetlease(&["lease", "acquire", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for part in [
        "Connection:",
        "Logging:",
        "Examples:",
        "user@host:pid",
        "Output:",
        "[default: 30s]",
    ] {
        assert!(
            help.contains(part),
            "acquire --help lacks {part:?}:\n{help}"
        );
    }
}

/// `targetlease completion SHELL | head` (a reader that stops early) ends
/// quietly with 0: no panic, no backtrace.
#[test]
fn completion_into_a_closed_pipe_does_not_panic() {
    for shell in ["bash", "zsh", "fish"] {
        let mut child = targetlease(&["completion", shell])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Nobody reads: the script meets a broken pipe.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{shell}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{shell}: {stderr}");
    }
}
