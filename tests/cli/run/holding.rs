//! Holding while the child runs: renewal, and a lost, revoked or possibly granted lease is never reported as success.

use super::*;

#[test]
fn the_lease_is_renewed_while_the_child_outlives_its_ttl() {
    let s = ValkeyServer::start();
    let u = s.url();
    let child = spawn(run(&u, "db", "alice", "600ms").exec(&["sleep", "2"]));
    std::thread::sleep(Duration::from_millis(1500));
    let j = get(&u, "db");
    assert_eq!(j["outcome"], "found", "lease not renewed: {j}");
    assert_eq!(j["lease"]["owner"], "alice");
    let out = wait_within(child, Duration::from_secs(10));
    assert_exit(&out, 0);
    assert_eq!(summary(&out)["lease_lost"], false);
    assert_eq!(get(&u, "db")["outcome"], "not_found");
}

#[test]
fn a_revoked_lease_terminates_the_child_and_run_fails() {
    let s = ValkeyServer::start();
    let u = s.url();
    let child = spawn(run(&u, "db", "alice", "1s").exec(&["sleep", "30"]));
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(get(&u, "db")["outcome"], "found");
    let revoked_at = Instant::now();
    revoke(&u, "db");
    let out = wait_within(child, Duration::from_secs(10));
    assert!(
        revoked_at.elapsed() < Duration::from_secs(5),
        "{:?}",
        revoked_at.elapsed()
    );
    // The lost code, whatever CMD's own (it was stopped by SIGTERM).
    let j = ended(&out, LOST);
    assert_eq!(j["lease_lost"], true);
    assert_eq!(j["command_exit_code"], 128 + 15, "{j}");
    assert!(
        ["expired", "not_owner", "not_found"].contains(&j["outcome"].as_str().unwrap()),
        "{j}"
    );
}

#[test]
fn a_child_that_exits_0_after_losing_the_lease_still_fails() {
    let s = ValkeyServer::start();
    let u = s.url();
    let started = Scratch::new("started");
    let child = spawn(run(&u, "db", "alice", "1s").sh(&looping("exit 0", &started)));
    started.wait(Duration::from_secs(10));
    revoke(&u, "db");
    let out = wait_within(child, Duration::from_secs(10));
    let j = ended(&out, LOST);
    assert_eq!(j["lease_lost"], true);
    assert_eq!(j["command_exit_code"], 0, "{j}");
}

#[test]
fn losing_the_backend_past_the_lease_expiry_terminates_the_child() {
    let mut s = ValkeyServer::start();
    let u = s.url();
    let child = spawn(
        run(&u, "db", "alice", "1s")
            .with(&["--timeout", "300ms"])
            .exec(&["sleep", "30"]),
    );
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(get(&u, "db")["outcome"], "found");
    let killed_at = Instant::now();
    s.kill();
    let out = wait_within(child, Duration::from_secs(15));
    // Renewals keep failing until the local expiry estimate (at most the 1s ttl) passes.
    let took = killed_at.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let j = ended(&out, LOST);
    assert_eq!(j["lease_lost"], true);
    assert!(
        ["backend_unavailable", "outcome_unknown"].contains(&j["outcome"].as_str().unwrap()),
        "{j}"
    );
}

#[test]
fn a_lease_that_ended_unnoticed_before_the_child_exited_still_fails_the_run() {
    let s = ValkeyServer::start();
    let u = s.url();
    // The child revokes its own lease through the exported environment
    // (the connection only because it asks for it), then exits 0 long
    // before the first renewal (at ttl/3 = 20s) could notice.
    let script = format!("{} lease revoke > /dev/null && exit 0", bin());
    let started = Instant::now();
    let out = run(&u, "db", "alice", "60s")
        .with(&["--export-connection"])
        .sh(&script)
        .output()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    let j = ended(&out, LOST);
    assert_eq!(j["lease_lost"], true, "{j}");
    assert_eq!(get(&u, "db")["outcome"], "not_found");
}

#[test]
fn a_grant_that_may_have_happened_is_never_reported_as_nothing_happened() {
    let s = ValkeyServer::start();
    let proxy = fault_proxy::FaultProxy::start(&s.addr());
    let ran = Scratch::new("ran");
    // The first acquire runs and its reply is lost; every retry is refused
    // before running, as by a replica after a failover.
    proxy.cut_before_reply("FCALL");
    proxy.refuse(
        "FCALL",
        "READONLY You can't write against a read only replica.",
        100,
    );
    let cmd = run(&proxy.url(), "db", "a", "30s")
        .wait("1s")
        .short_deadlines()
        .exec(&ran.touch());
    let (out, _) = deadline::output_within(cmd, Duration::from_secs(8));
    let j = ended(&out, FAILED);
    assert_eq!(j["outcome"], "outcome_unknown", "{j}");
    assert!(!ran.exists());
    // It did acquire: the lease exists (and expires after its ttl).
    assert_eq!(get(&s.url(), "db")["outcome"], "found");
}
