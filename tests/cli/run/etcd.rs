//! `run --store-url etcd://…` behaves to the user as it does with Valkey:
//! the child gets the token and its exit code is returned, a held target
//! makes `-n` give up, the lease is released at the end, and tokens grow.

use super::*;
use crate::support::etcd_cluster::EtcdCluster;

/// A Valkey URL nothing listens on: given through the environment, it is
/// overridden by `--store-url`, so a run that works used the flag.
const NOWHERE: &str = "redis://127.0.0.1:1";

#[test]
fn run_against_etcd_fences_waits_and_releases_like_valkey() {
    let cluster = EtcdCluster::start();
    let url = cluster.url();
    let on_etcd = |owner: &str| run(NOWHERE, "db", owner, "10s").with(&["--store-url", &url]);

    let out = on_etcd("alice")
        .sh("echo \"token=$TARGETLEASE_FENCING_TOKEN\"; exit 7")
        .output()
        .unwrap();
    assert_exit(&out, 7);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "token=1\n");
    let j = summary(&out);
    assert_eq!(j["outcome"], "released", "{j}");
    assert_eq!(j["lease"]["fencing_token"], 1, "{j}");
    assert_eq!(j["command_exit_code"], 7, "{j}");

    // Bob holds it while his command runs; a non-blocking run gives up.
    let bob = on_etcd("bob")
        .sh("sleep 4")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // (`get` passes `--valkey-url`: the same flag under its older name.)
    let until = Instant::now() + Duration::from_secs(10);
    while get(&url, "db")["lease"]["owner"] != "bob" {
        assert!(Instant::now() < until, "bob never held db");
        std::thread::sleep(Duration::from_millis(100));
    }
    let held = get(&url, "db");
    assert_eq!(held["outcome"], "found", "{held}");
    assert_eq!(held["lease"]["fencing_token"], 2, "{held}");
    let out = on_etcd("carol").with(&["-n"]).sh("true").output().unwrap();
    assert_eq!(ended(&out, BUSY)["outcome"], "held");

    let bob_out = wait_within(bob, Duration::from_secs(30));
    assert_exit(&bob_out, 0);
    assert_eq!(summary(&bob_out)["outcome"], "released");
    assert_eq!(
        get(&url, "db")["outcome"],
        "not_found",
        "released at the end"
    );
    // With --export-connection the child reaches the same etcd (not the
    // Valkey URL in its environment) and commits with its token.
    let out = on_etcd("carol")
        .with(&["--export-connection"])
        .sh(&format!(
            "echo $TARGETLEASE_FENCING_TOKEN; echo \"$TARGETLEASE_STORE_URL\"; \
             {} lease commit --key k --value from-the-child",
            bin()
        ))
        .output()
        .unwrap();
    assert_exit(&out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.first(), Some(&"3"), "tokens only grow: {stdout}");
    assert_eq!(lines.get(1), Some(&url.as_str()), "{stdout}");
    let committed: Value = serde_json::from_str(lines.get(2).expect("commit output")).unwrap();
    assert_eq!(committed["outcome"], "committed", "{committed}");
    let read = tl(&url, &["lease", "read", "--target", "db", "--key", "k"])
        .output()
        .unwrap();
    assert_exit(&read, 0);
    let read: Value = serde_json::from_slice(&read.stdout).unwrap();
    assert_eq!(read["committed"]["value"], "from-the-child", "{read}");
    assert_eq!(read["committed"]["fencing_token"], 3, "{read}");
}
