//! `lease list`: every record of a namespace (or all), each read like get;
//! expired and corrupt records show as such, lease ids never; every primary
//! of a Cluster is scanned.

use super::*;
use crate::support::cluster::Cluster;

/// The JSON lines `lease list` printed (exit 0).
fn listed(url: &str, more: &[&str]) -> Vec<Value> {
    let out = lease(url, "list").with(more).output();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

/// (namespace, target, outcome), as [`names`] reads them.
fn row(ns: &str, t: &str, o: &str) -> (String, String, String) {
    (ns.to_owned(), t.to_owned(), o.to_owned())
}

fn names(entries: &[Value]) -> Vec<(String, String, String)> {
    entries
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap().to_owned();
            (s("namespace"), s("target"), s("outcome"))
        })
        .collect()
}

#[test]
fn list_shows_live_and_corrupt_records_without_lease_ids_and_skips_ended_ones() {
    let s = ValkeyServer::start();
    let u = s.url();
    let live = acquire(&u, "db-1", "alice", "60s");
    lease(&u, "acquire")
        .target("db-2")
        .owner("bob")
        .flag("namespace", "team-b")
        .ok("acquired", 0);
    acquire(&u, "cache", "carol", "60s");
    // A record whose lease has ended but which is still there (only a hand
    // edit keeps one past its expiry), and a corrupt one.
    s.conn()
        .plant_lease("targetlease:{default:db-3}", "1", 2, "dave");
    s.conn()
        .cmd(&["HSET", "targetlease:{default:db-4}", "lease", "garbage"]);

    let entries = listed(&u, &["--target-prefix", "db-"]);
    assert_eq!(
        names(&entries),
        [
            row("default", "db-1", "found"),
            row("default", "db-4", "corrupt_state"),
        ]
    );
    let first = &entries[0]["lease"];
    assert_eq!(first["fencing_token"], live["lease"]["fencing_token"]);
    assert_eq!(
        lease_keys(first),
        set(&PUBLIC_FIELDS),
        "no lease id: {first}"
    );
    for e in &entries[1..] {
        assert!(e["lease"].is_null(), "{e}");
    }
    let id = live["lease"]["lease_id"].as_str().unwrap();
    let all = listed(&u, &["--all-namespaces"]);
    assert_eq!(all.len(), 4, "{all:?}");
    assert!(names(&all).contains(&row("team-b", "db-2", "found")));
    assert!(!serde_json::to_string(&all).unwrap().contains(id));

    let (_, text) = as_text(lease(&u, "list").switch("all-namespaces"));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "NAMESPACE\tTARGET\tSTATE\tOWNER\tTOKEN\tEXPIRES IN"
    );
    assert_eq!(lines.len(), 5, "{text}");
    assert!(
        lines[1].starts_with("default\tcache\tfound\tcarol\t"),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("default\tdb-4\tcorrupt_state\t-\t-\t-"))
    );
    assert!(listed(&u, &["--namespace", "nobody"]).is_empty());
}

#[test]
fn list_scans_every_primary_of_a_cluster() {
    let c = Cluster::start();
    let u = c.url();
    let names_wanted: Vec<String> = (0..24).map(|i| format!("t{i}")).collect();
    for n in &names_wanted {
        acquire(&u, n, "alice", "60s");
    }
    let mut nodes_holding = std::collections::HashSet::new();
    for n in &names_wanted {
        let key = format!("targetlease:{{default:{n}}}");
        nodes_holding.insert(format!("{:?}", c.conn_for(&key).cmd(&["CLUSTER", "MYID"])));
    }
    assert!(
        nodes_holding.len() >= 2,
        "the targets spread over the primaries"
    );
    let entries = listed(&u, &[]);
    let mut got: Vec<String> = names(&entries).into_iter().map(|(_, t, _)| t).collect();
    let mut wanted = names_wanted.clone();
    got.sort();
    wanted.sort();
    assert_eq!(got, wanted);
    assert!(entries.iter().all(|e| e["outcome"] == "found"));
}

#[test]
fn list_against_a_silent_server_ends_within_its_deadline() {
    let silent = fault_proxy::FaultProxy::silent();
    let (out, took) = deadline::output_within(
        lease(&silent.url(), "list").short_deadlines().command(),
        Duration::from_secs(8),
    );
    assert_eq!(out.status.code(), Some(3));
    let r = Res::parse(out);
    assert_eq!(r.json["outcome"], "backend_unavailable", "{}", r.stdout);
    assert!(took < Duration::from_secs(8));
}

/// Keys under the prefix that no valid request can write (an empty, an
/// over-long or a control-character name) are records this version does not
/// understand: each is listed as `corrupt_state`, and the rest of the listing
/// is still printed (exit 0), never a usage error after connecting.
#[test]
fn list_shows_records_under_invalid_names_as_corrupt_and_lists_the_rest() {
    let s = ValkeyServer::start();
    let u = s.url();
    acquire(&u, "db-1", "alice", "60s");
    let long = "x".repeat(300);
    let bad_keys = [
        "targetlease:{default:}".to_owned(),
        format!("targetlease:{{default:{long}}}"),
        "targetlease:{default:bad\u{1}}".to_owned(),
        "targetlease:{:db-1}".to_owned(),
    ];
    for k in &bad_keys {
        s.conn().cmd(&["HSET", k, "lease", "1:"]);
    }
    let entries = listed(&u, &[]);
    assert_eq!(
        names(&entries),
        [
            row("default", "", "corrupt_state"),
            row("default", "bad\u{1}", "corrupt_state"),
            row("default", "db-1", "found"),
            row("default", &long, "corrupt_state"),
        ]
    );
    let all = listed(&u, &["-A"]);
    assert_eq!(all.len(), 5, "{all:?}");
    assert_eq!(names(&all)[0], row("", "db-1", "corrupt_state"));
}

/// `-o text` prints one row per record: a name with a line break or a tab
/// (only a foreign or corrupt key can carry one) cannot forge a row, such as
/// a live lease that does not exist.
#[test]
fn list_as_text_cannot_be_forged_by_a_name_with_a_line_break() {
    let s = ValkeyServer::start();
    let u = s.url();
    s.conn().cmd(&[
        "SET",
        "targetlease:{default:x\ndefault\tforged\tfound\tmallory\t7\t99.0s}",
        "garbage",
    ]);
    let (code, text) = as_text(lease(&u, "list"));
    assert_eq!(code, Some(0));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "a header and one row: {text}");
    assert!(
        !lines.iter().any(|l| l.contains("\tforged\tfound")),
        "{text}"
    );
}

/// A key under the prefix that `escape` cannot have produced (a raw `:` in
/// the target) is not a lease record of the target it seems to name: the
/// list never reports a state it did not read from that key.
#[test]
fn list_ignores_keys_that_are_not_in_canonical_form() {
    let s = ValkeyServer::start();
    let u = s.url();
    s.conn()
        .cmd(&["SET", "targetlease:{default:a:b}", "garbage"]);
    s.conn()
        .cmd(&["SET", "targetlease:{default:c{d}", "garbage"]);
    let entries = listed(&u, &["-A"]);
    assert!(
        names(&entries).is_empty(),
        "foreign keys are not records: {entries:?}"
    );
}

/// An ACL user without `+scan` (the least-privilege rule of docs/valkey.md)
/// gets one `backend_unavailable` envelope, exit 3, whose message says in
/// plain words that SCAN was refused and why.
#[test]
fn list_refused_scan_exits_3_and_names_the_cause() {
    let s = ValkeyServer::start();
    let u = s.url();
    acquire(&u, "db", "alice", "60s");
    let proxy = fault_proxy::FaultProxy::start(&s.addr());
    proxy.refuse(
        "SCAN",
        "NOPERM User lease has no permissions to run the 'scan' command",
        1,
    );
    let out = lease(&proxy.url(), "list").output();
    assert_eq!(out.status.code(), Some(3));
    let r = Res::parse(out);
    assert_eq!(r.json["outcome"], "backend_unavailable", "{}", r.stdout);
    let msg = r.json["message"].as_str().unwrap();
    assert!(msg.contains("NOPERM") && msg.contains("SCAN"), "{msg}");
    assert!(
        !msg.contains("Error("),
        "plain words, not a debug dump: {msg}"
    );
}

/// docs/cli.md (Deadlines) bounds `lease list` (its listing gets a budget of
/// its own, beyond the one call of every other `lease …` command): against
/// a server that answers every reply late, it ends (exit 3) within the
/// documented `--connect-timeout` + 5 × `--timeout` + 1s.
#[test]
fn list_against_a_slow_server_ends_within_the_documented_deadline() {
    let s = ValkeyServer::start();
    let u = s.url();
    for i in 0..20 {
        acquire(&u, &format!("t{i}"), "alice", "60s");
    }
    let proxy = fault_proxy::FaultProxy::start(&s.addr());
    let list = || {
        // connect-timeout 3s, timeout 1s: documented bound 3s + 5 × 1s + 1s.
        deadline::output_within(
            lease(&proxy.url(), "list")
                .flag("timeout", "1s")
                .flag("connect-timeout", "3s")
                .command(),
            Duration::from_secs(9),
        )
    };
    // Every reply 700 ms late: the reads go out together, so the listing
    // completes (read one after another they would take 20 × 700 ms).
    proxy.set(fault_proxy::Fault::Delay(Duration::from_millis(700)));
    let (out, took) = list();
    assert_eq!(out.status.code(), Some(0), "took {took:?}");
    let lines = String::from_utf8(out.stdout).unwrap().lines().count();
    assert_eq!(lines, 20, "every record listed");
    // Replies later than --timeout: backend trouble, still within the bound.
    proxy.set(fault_proxy::Fault::Delay(Duration::from_millis(1500)));
    let (out, took) = list();
    assert_eq!(out.status.code(), Some(3), "took {took:?}");
    let r = Res::parse(out);
    assert_eq!(r.json["outcome"], "backend_unavailable", "{}", r.stdout);
}
