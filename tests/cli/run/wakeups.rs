//! Promise (docs/cli.md, `run`; docs/valkey.md; docs/consistency.md): a
//! waiting `run` is woken by the store's release notice (Valkey pub/sub, an
//! etcd Watch) and acquires within a small bound of the release, far under
//! its polling interval (up to 1s); a waiter that cannot subscribe polls,
//! says so once, and still acquires.

use super::*;
use crate::support::etcd_cluster::EtcdCluster;

/// Far under the 1s a polling waiter sleeps between attempts once it has
/// waited a while, with room for a loaded 2-core machine.
const BOUND_MS: u64 = 200;

/// One waiter on a held target: bob holds `db`, alice's `run` waits for it
/// `pause`, bob releases. Returns how long after the release (by the
/// store's clock, the release's decision to alice's acquire) alice got the
/// lease, and alice's log. `flags` are alice's only.
fn one_wake(url: &str, flags: &[&str], pause: Duration) -> (u64, String) {
    let held = lease(url, "acquire")
        .target("db")
        .owner("bob")
        .ttl("60s")
        .ok("acquired", 0)
        .json;
    let mut cmd = run(url, "db", "alice", "10s")
        .with(flags)
        .wait("30s")
        .sh("sleep 1");
    cmd.env("RUST_LOG", "targetlease=debug");
    let child = spawn(cmd);
    std::thread::sleep(pause);
    let released = lease(url, "release")
        .target("db")
        .handle(&held)
        .ok("released", 0)
        .json;
    let released_ms = released["server_time_ms"].as_u64().expect("release time");
    let until = Instant::now() + Duration::from_secs(10);
    let acquired_ms = loop {
        let now = lease(url, "get").target("db").res().json;
        if now["lease"]["owner"] == "alice" {
            break now["lease"]["acquired_at_ms"]
                .as_u64()
                .expect("acquired_at_ms");
        }
        assert!(Instant::now() < until, "alice never got db: {now}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = wait_within(child, Duration::from_secs(15));
    assert_exit(&out, 0);
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    (acquired_ms.saturating_sub(released_ms), log)
}

/// Three waiters in turn, each released after a different pause (so a
/// polling waiter could not be lucky three times): every one is woken by
/// its subscription and acquires within [`BOUND_MS`].
fn wakes_within_the_bound(url: &str, flags: &[&str]) {
    for pause_ms in [1700, 2100, 2600] {
        let (wake, log) = one_wake(url, flags, Duration::from_millis(pause_ms));
        eprintln!("released after {pause_ms} ms of waiting: acquired {wake} ms later");
        assert!(
            log.contains("waiting for a release notification"),
            "no subscription:\n{log}"
        );
        assert!(
            log.contains("woken by a release notification"),
            "the release did not wake it:\n{log}"
        );
        assert!(
            wake < BOUND_MS,
            "acquired {wake} ms after the release (bound {BOUND_MS} ms):\n{log}"
        );
    }
}

#[test]
fn a_release_wakes_a_waiting_run_on_valkey_within_a_small_bound() {
    let s = ValkeyServer::start();
    wakes_within_the_bound(&s.url(), &[]);
}

#[test]
fn a_release_wakes_a_waiting_run_on_etcd_within_a_small_bound() {
    let cluster = EtcdCluster::start();
    wakes_within_the_bound(&cluster.url(), &[]);
}

/// A Valkey user without the channel (`resetchannels`) cannot subscribe: the
/// waiter warns once that it polls, and acquires after the release anyway.
#[test]
fn a_waiter_refused_the_subscription_polls_and_still_acquires() {
    let s = ValkeyServer::start();
    let u = s.url();
    let mut admin = s.conn();
    admin.cmd(&[
        "ACL",
        "SETUSER",
        "waiter",
        "on",
        ">waiter-pw",
        "~*",
        "resetchannels",
        "+@all",
    ]);
    let pw = Scratch::new("password");
    std::fs::write(pw.path(), "waiter-pw\n").unwrap();
    let as_waiter = [
        "--username",
        "waiter",
        "--password-file",
        pw.path().to_str().unwrap(),
    ];
    let (wake, log) = one_wake(&u, &as_waiter, Duration::from_millis(1700));
    eprintln!("polling waiter: acquired {wake} ms after the release");
    assert_eq!(
        log.matches("no release notifications; polling").count(),
        1,
        "says once that it polls:\n{log}"
    );
    assert!(log.contains("NOPERM"), "names the refusal:\n{log}");
    assert!(
        !log.contains("woken by a release notification"),
        "cannot have been woken by a notice:\n{log}"
    );
}
