//! `lease read`: a committed value read back with its token, as JSON or text.

use super::*;

#[test]
fn read_prints_the_committed_value_with_its_token_and_needs_no_lease() {
    let s = ValkeyServer::start();
    let u = s.url();
    let nothing = lease(&u, "read")
        .target("db")
        .flag("key", "k")
        .ok("not_found", 1);
    assert!(nothing.json["lease"].is_null());
    assert!(
        nothing.json.get("committed").is_none(),
        "{}",
        nothing.stdout
    );

    let j = acquire(&u, "db", "alice", "10s");
    let (_, _, token) = holder_args(&j);
    lease(&u, "commit")
        .target("db")
        .token(&token)
        .flag("key", "k")
        .flag("value", "v1")
        .ok("committed", 0);
    lease(&u, "release")
        .target("db")
        .holder(&j)
        .ok("released", 0);

    let out = lease(&u, "read").target("db").flag("key", "k").output();
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let json: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(json["outcome"], "found");
    assert!(json["lease"].is_null());
    let c = &json["committed"];
    assert_eq!(
        lease_keys(c),
        set(&["key", "value", "fencing_token", "committed_at_ms"])
    );
    assert_eq!(
        (c["key"].as_str(), c["value"].as_str()),
        (Some("k"), Some("v1"))
    );
    assert_eq!(c["fencing_token"].to_string(), token);
    let committed = c["committed_at_ms"].as_u64().unwrap();
    assert!(committed <= json["server_time_ms"].as_u64().unwrap());

    let text = lease(&u, "read")
        .target("db")
        .flag("key", "k")
        .flag("output", "text")
        .output();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.starts_with(&format!("found: k = v1 (token {token}, committed ")),
        "{text:?}"
    );
    // Bad keys are usage errors; nothing is sent.
    let bad = lease(&u, "read").target("db").flag("key", "").output();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("key must not be empty"));
}
