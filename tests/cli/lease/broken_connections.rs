//! A server that is unreachable, silent or loses a reply: every command ends within its deadlines and says what may have happened.

use super::*;

#[test]
fn an_unreachable_server_is_backend_unavailable_within_the_deadline() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    for command in [get_db(&url), acquire_db(&url, "1s")] {
        let started = Instant::now();
        let r = command.short_deadlines().res();
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
    // The library is loaded (the first connect loads it), then write
    // commands (the lease functions, a load) wait; connecting and finding
    // the library still work.
    get_db(&u).ok("not_found", 1);
    let paused_at = Instant::now();
    s.conn().cmd(&["CLIENT", "PAUSE", "5000", "WRITE"]);
    let acquire = lease(&u, "acquire")
        .target("db")
        .owner("alice")
        .ttl("30s")
        .request_id("req-unknown")
        .flag("timeout", "300ms");
    let r = acquire.ok("outcome_unknown", 3);
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
    let again = acquire.ok("acquired", 0);
    assert_eq!(again.json["lease"]["fencing_token"], 1);
    let fence = s.conn().cmd(&["HGET", "targetlease:{default:db}", "fence"]);
    assert_eq!(fence.text(), "1");
}

/// `command --timeout 1s --connect-timeout 1s`, which must end within `limit`.
fn within(command: &Lease, limit: Duration) -> (Res, Duration) {
    let command = command.clone().short_deadlines().command();
    let (out, took) = deadline::output_within(command, limit);
    (Res::parse(out), took)
}

/// `lease get` of target `db`.
fn get_db(url: &str) -> Lease {
    lease(url, "get").target("db")
}

/// `lease acquire` of target `db` by `o` for `ttl`.
fn acquire_db(url: &str, ttl: &str) -> Lease {
    lease(url, "acquire").target("db").owner("o").ttl(ttl)
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
    let url = silent.url();
    for command in [
        get_db(&url),
        acquire_db(&url, "10s"),
        lease(&url, "revoke").target("db"),
    ] {
        let args = command.args();
        let (r, took) = within(&command, Duration::from_secs(3));
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
    proxy.silence_from("FCALL_RO");
    let (r, took) = within(&get_db(&proxy.url()), Duration::from_secs(4));
    assert_eq!(r.json["outcome"], "backend_unavailable", "{}", r.stdout);
    assert_plain(&r);
    eprintln!("get with no reply: {took:?}");
    proxy.silence_from("FCALL");
    let acquire = acquire_db(&proxy.url(), "10s").request_id("req-silent");
    let (r, took) = within(&acquire, Duration::from_secs(4));
    assert_eq!(r.json["outcome"], "outcome_unknown", "{}", r.stdout);
    assert!(r.json["message"].as_str().unwrap().contains("req-silent"));
    assert_plain(&r);
    eprintln!("acquire with no reply: {took:?}");
}

#[test]
fn errors_name_a_plain_category_and_cause() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    let (r, _) = within(&get_db(&url), Duration::from_secs(3));
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
    proxy.cut_before_reply("FCALL");
    let revoke = lease(&proxy.url(), "revoke")
        .target("db")
        .request_id("rv-1");
    let (r, _) = within(&revoke, Duration::from_secs(4));
    assert_eq!(r.json["outcome"], "outcome_unknown", "{}", r.stdout);
    assert!(r.json["message"].as_str().unwrap().contains("rv-1"));
    assert_eq!(proxy.forwarded("FCALL"), 1, "sent once");
    // Bob takes the target; the retry of the lost revoke must not end his lease.
    let bob = acquire(&u, "db", "bob", "30s");
    let r = lease(&u, "revoke")
        .target("db")
        .request_id("rv-1")
        .ok("revoked", 0);
    assert!(
        r.json["message"].as_str().unwrap().contains("replayed"),
        "{}",
        r.stdout
    );
    let got = lease(&u, "get").target("db").ok("found", 0);
    assert_eq!(got.json["lease"]["owner"], "bob");
    assert_eq!(
        got.json["lease"]["fencing_token"],
        bob["lease"]["fencing_token"]
    );
}
