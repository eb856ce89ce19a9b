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

/// Raises the `NOSPACE` alarm on the member the client reaches (as etcd
/// does when a database reaches its quota), or (`on` false) clears every
/// alarm raised.
fn nospace_alarm(cluster: &EtcdCluster, on: bool) {
    use etcd_client::{AlarmAction, AlarmOptions, AlarmType, Client};
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = Client::connect(cluster.endpoints(), None)
            .await
            .expect("connect to etcd");
        let members = if on {
            let status = c.status().await.expect("member status");
            vec![status.header().expect("a header").member_id()]
        } else {
            let raised = c.alarm(AlarmAction::Get, AlarmType::None, None).await;
            let raised = raised.expect("alarms");
            raised.alarms().iter().map(|a| a.member_id()).collect()
        };
        let action = if on {
            AlarmAction::Activate
        } else {
            AlarmAction::Deactivate
        };
        for id in members {
            let mut member = AlarmOptions::new();
            member.with_member(id);
            c.alarm(action, AlarmType::Nospace, Some(member))
                .await
                .expect("alarm");
        }
    });
}

fn check_report(url: &str) -> (Option<i32>, Value) {
    let out = targetlease(&["check", "--store-url", url])
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), report)
}

fn space_of(report: &Value) -> &Value {
    report["checks"]
        .as_array()
        .and_then(|checks| checks.iter().find(|c| c["name"] == "space"))
        .unwrap_or_else(|| panic!("no space check: {report}"))
}

#[test]
fn check_fails_while_etcd_refuses_writes_for_lack_of_space() {
    let cluster = EtcdCluster::start();
    let url = cluster.url();
    let (code, report) = check_report(&url);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(space_of(&report)["status"], "ok", "{report}");

    nospace_alarm(&cluster, true);
    // etcd refuses the write, definitely.
    on(&url, "acquire")
        .target("db")
        .owner("alice")
        .ttl("30s")
        .ok("backend_unavailable", 3);
    let (code, report) = check_report(&url);
    assert_eq!(code, Some(1), "{report}");
    let space = space_of(&report);
    assert_eq!(space["status"], "fail", "{report}");
    assert!(
        space["detail"]
            .as_str()
            .unwrap()
            .contains("NOSPACE on member"),
        "{report}"
    );

    nospace_alarm(&cluster, false);
    let (code, report) = check_report(&url);
    assert_eq!(code, Some(0), "{report}");
    on(&url, "acquire")
        .target("db")
        .owner("alice")
        .ttl("30s")
        .ok("acquired", 0);
}
