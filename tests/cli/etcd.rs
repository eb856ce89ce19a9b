//! `lease …`, `lease list` and `check` with `--store-url etcd://…`: the
//! same commands and the same JSON as with Valkey, against a real 3-member
//! etcd cluster. (`run` is in `run/etcd.rs`.)

use serde_json::Value;

use crate::support::cli::{Lease, lease, targetlease};
use crate::support::etcd_cluster::EtcdCluster;

/// `lease <op> --valkey-url <url>`: the store flag under its older name
/// takes an etcd URL too (`list` and `check` below use `--store-url`).
fn on(url: &str, op: &str) -> Lease {
    lease(url, op)
}

#[test]
fn lease_commands_list_and_check_work_against_etcd() {
    let cluster = EtcdCluster::start();
    let url = cluster.url();
    let acquired = on(&url, "acquire")
        .target("db")
        .owner("alice")
        .ttl("30s")
        .ok("acquired", 0);
    assert_eq!(acquired.token(), 1);
    let held = on(&url, "acquire")
        .target("db")
        .owner("bob")
        .ttl("30s")
        .ok("held", 1);
    assert_eq!(held.json["lease"]["owner"], "alice");
    assert!(
        held.json["lease"].get("lease_id").is_none(),
        "{}",
        held.stdout
    );

    on(&url, "commit")
        .target("db")
        .token(1)
        .with(&["--key", "k", "--value", "v1"])
        .ok("committed", 0);
    let read = on(&url, "read").target("db").with(&["--key", "k"]).output();
    assert_eq!(read.status.code(), Some(0), "{read:?}");
    let read: Value = serde_json::from_slice(&read.stdout).unwrap();
    assert_eq!(read["committed"]["value"], "v1", "{read}");
    assert_eq!(read["committed"]["fencing_token"], 1, "{read}");
    on(&url, "renew")
        .target("db")
        .handle(&acquired.json)
        .ttl("30s")
        .ok("renewed", 0);

    let out = targetlease(&["lease", "list", "--store-url", &url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let first: Value = serde_json::from_str(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .expect("one entry"),
    )
    .unwrap();
    assert_eq!(
        (first["target"].as_str(), first["outcome"].as_str()),
        (Some("db"), Some("found")),
        "{first}"
    );

    on(&url, "release")
        .target("db")
        .handle(&acquired.json)
        .ok("released", 0);
    on(&url, "get").target("db").ok("not_found", 1);
    let next = on(&url, "acquire")
        .target("db")
        .owner("bob")
        .ttl("30s")
        .ok("acquired", 0);
    assert_eq!(next.token(), 2, "tokens only grow");

    let out = targetlease(&["check", "--store-url", &url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["checks"][0]["name"], "reachability", "{report}");

    // Valkey's durability setting means nothing to etcd: refused up front.
    let out = targetlease(&[
        "lease",
        "get",
        "--target",
        "db",
        "--store-url",
        &url,
        "--durability",
        "aof",
    ])
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
