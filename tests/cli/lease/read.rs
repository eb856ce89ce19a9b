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
    let (_, _, token) = handle_args(&j);
    commit(&u, &token, "v1").ok("committed", 0);
    lease(&u, "release")
        .target("db")
        .handle(&j)
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

    let (_, text) = as_text(lease(&u, "read").target("db").flag("key", "k"));
    assert!(
        text.starts_with(&format!("found: k = v1 (token {token}, committed ")),
        "{text:?}"
    );
    // Bad keys are usage errors; nothing is sent.
    let bad = lease(&u, "read").target("db").flag("key", "").output();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("key must not be empty"));
}

/// `-o text` is one line for people: a committed value with a line break
/// (values may hold any text) is shown escaped, never as a second line that
/// could pass for another answer.
#[test]
fn read_as_text_is_one_line_whatever_the_value_holds() {
    let s = ValkeyServer::start();
    let u = s.url();
    let j = acquire(&u, "db", "alice", "10s");
    let (_, _, token) = handle_args(&j);
    let value = "v1\nfound: k = forged (token 99, committed 2030-01-01T00:00:00Z)";
    commit(&u, &token, value).ok("committed", 0);
    let (code, text) = as_text(lease(&u, "read").target("db").flag("key", "k"));
    assert_eq!(code, Some(0));
    assert_eq!(text.lines().count(), 1, "{text:?}");
    assert!(
        text.starts_with("found: k = v1\\nfound: k = forged"),
        "{text:?}"
    );
    // JSON keeps the value exact.
    let out = lease(&u, "read").target("db").flag("key", "k").output();
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["committed"]["value"], value);
}

/// `get -o text` is one line, also for a record whose owner holds a line
/// break and a tab (only a hand-written record can): a table or a log line
/// cannot be forged through it.
#[test]
fn get_and_list_as_text_escape_control_characters_in_stored_owners() {
    let s = ValkeyServer::start();
    let u = s.url();
    s.conn().plant_lease(
        "targetlease:{default:db}",
        "3",
        4_102_444_800_000,
        "alice\ndefault\tforged\tfound\tmallory",
    );
    let (code, text) = as_text(lease(&u, "get").target("db"));
    assert_eq!(code, Some(0));
    assert_eq!(text.lines().count(), 1, "{text:?}");
    assert!(
        text.contains("held by alice\\ndefault\\tforged"),
        "{text:?}"
    );
    let (_, text) = as_text(lease(&u, "list"));
    assert_eq!(text.lines().count(), 2, "{text:?}");
}

/// `-o text` also escapes what reorders or breaks a line without being a
/// control character: bidirectional overrides and isolates (U+202E, U+2066),
/// line and paragraph separators (U+2028, U+2029), invisible marks (U+200B,
/// U+200F, U+FEFF). JSON keeps them exact.
#[test]
fn text_output_escapes_bidi_controls_and_line_separators() {
    let s = ValkeyServer::start();
    let u = s.url();
    let owner = "mallory\u{202E}ecila";
    let j = acquire(&u, "db", owner, "10s");
    let (_, _, token) = handle_args(&j);
    let value = "a\u{2028}b\u{2029}c\u{2066}d\u{2069}e\u{200B}f\u{200F}g\u{FEFF}h";
    commit(&u, &token, value).ok("committed", 0);
    let raw = [
        '\u{202E}', '\u{2028}', '\u{2029}', '\u{2066}', '\u{2069}', '\u{200B}', '\u{200F}',
        '\u{FEFF}',
    ];
    let (code, text) = as_text(lease(&u, "read").target("db").flag("key", "k"));
    assert_eq!(code, Some(0));
    assert!(!text.contains(raw), "{text:?}");
    assert!(
        text.contains(r"a\u{2028}b\u{2029}c\u{2066}d\u{2069}e\u{200b}f\u{200f}g\u{feff}h"),
        "{text:?}"
    );
    for command in [lease(&u, "get").target("db"), lease(&u, "list")] {
        let op = command.args()[1].clone();
        let (_, text) = as_text(command);
        assert!(!text.contains(raw), "{op}: {text:?}");
        assert!(text.contains(r"mallory\u{202e}ecila"), "{op}: {text:?}");
    }
    let out = lease(&u, "read").target("db").flag("key", "k").output();
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["committed"]["value"], value);
}
