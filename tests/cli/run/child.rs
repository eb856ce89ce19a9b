//! What the child gets and what run returns: the token in its environment, its exit code, signals, a missing command, bad arguments.
//! The child's isolation (its own process group, dying with `run`, no store
//! credentials) is in `isolation.rs`.

use super::*;

#[test]
fn the_child_gets_the_token_its_exit_code_is_returned_and_the_lease_released() {
    let s = ValkeyServer::start();
    let u = s.url();
    let file = Scratch::new("env");
    let script = format!(
        "echo \"$TARGETLEASE_FENCING_TOKEN|$TARGETLEASE_TARGET|$TARGETLEASE_NAMESPACE|$TARGETLEASE_OWNER|$TARGETLEASE_EXPIRES_AT|${{TARGETLEASE_LEASE_ID-unset}}\" > {}; echo child-stdout; exit 7",
        file.path().display()
    );
    let out = run(&u, "db", "alice", "10s")
        .with(&["--namespace", "team-a"])
        .sh(&script)
        .output()
        .unwrap();
    assert_exit(&out, 7);
    // stdout is the child's alone.
    assert_eq!(String::from_utf8_lossy(&out.stdout), "child-stdout\n");
    let text = file.read();
    let parts: Vec<&str> = text.trim_end().split('|').collect();
    assert_eq!(&parts[..4], ["1", "db", "team-a", "alice"], "{text}");
    let expires = humantime::parse_rfc3339(parts[4]).expect("TARGETLEASE_EXPIRES_AT is RFC 3339");
    let left = expires
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    assert!(left <= Duration::from_secs(11), "{text}");
    // The capability to renew or release is opt-in.
    assert_eq!(parts[5], "unset", "{text}");
    let j = summary(&out);
    assert_eq!(j["outcome"], "released");
    assert_eq!(j["lease_lost"], false);
    assert_eq!(j["command_exit_code"], 7);
    assert_eq!(j["lease"]["fencing_token"], 1);
    assert!(
        j["lease"].get("lease_id").is_none(),
        "stderr must not carry the lease id"
    );
    lease(&u, "get")
        .target("db")
        .flag("namespace", "team-a")
        .ok("not_found", 1);

    // Success, and a second run gets a larger token; asked for, the lease id.
    let out = run(&u, "db", "alice", "10s")
        .with(&["--namespace", "team-a", "--export-lease-id"])
        .sh("test \"$TARGETLEASE_FENCING_TOKEN\" = 2 && test ${#TARGETLEASE_LEASE_ID} = 32")
        .output()
        .unwrap();
    assert_exit(&out, 0);
}

#[test]
fn a_child_killed_by_a_signal_gives_128_plus_the_signal() {
    let s = ValkeyServer::start();
    let out = run(&s.url(), "db", "alice", "10s")
        .sh("kill -KILL $$")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(128 + 9));
    assert_eq!(get(&s.url(), "db")["outcome"], "not_found");
}

#[test]
fn a_missing_command_exits_127_and_releases() {
    let s = ValkeyServer::start();
    let out = run(&s.url(), "db", "alice", "10s")
        .exec(&["/nonexistent/targetlease-cmd"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    assert_eq!(summary(&out)["outcome"], "released");
    assert_eq!(get(&s.url(), "db")["outcome"], "not_found");
}

#[test]
fn a_child_ignoring_sigterm_is_killed_after_the_grace_period() {
    let s = ValkeyServer::start();
    let u = s.url();
    let started = Scratch::new("started");
    let child = spawn(
        run(&u, "db", "alice", "1s")
            .with(&["--kill-grace", "700ms"])
            .sh(&looping("", &started)),
    );
    started.wait(Duration::from_secs(10));
    let revoked_at = Instant::now();
    revoke(&u, "db");
    let out = wait_within(child, Duration::from_secs(10));
    let took = revoked_at.elapsed();
    let j = ended(&out, LOST);
    assert!(took >= Duration::from_millis(700), "killed after {took:?}");
    assert_eq!(j["lease_lost"], true);
    assert_eq!(j["command_exit_code"], 128 + 9, "{j}");
}

#[test]
fn sigterm_to_run_is_forwarded_to_the_child_and_the_lease_released() {
    let s = ValkeyServer::start();
    let u = s.url();
    let started = Scratch::new("started");
    let got = Scratch::new("got");
    let on_term = format!("echo term > {}; exit 5", got.path().display());
    let child = spawn(run(&u, "db", "alice", "10s").sh(&looping(&on_term, &started)));
    started.wait(Duration::from_secs(10));
    sigterm(&child);
    let out = wait_within(child, Duration::from_secs(10));
    assert_exit(&out, 5);
    assert_eq!(got.read().trim(), "term");
    assert_eq!(summary(&out)["outcome"], "released");
    assert_eq!(get(&u, "db")["outcome"], "not_found");
}

#[test]
fn sigterm_before_the_command_starts_ends_run_at_once() {
    let silent = fault_proxy::FaultProxy::silent();
    let ran = Scratch::new("ran");
    let child = spawn(
        run(&silent.url(), "db", "a", "10s")
            .wait("60s")
            .short_deadlines()
            .exec(&ran.touch()),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let sent = Instant::now();
    sigterm(&child);
    let out = wait_within(child, Duration::from_secs(2));
    eprintln!("run exited {:?} after SIGTERM", sent.elapsed());
    assert!(sent.elapsed() < Duration::from_secs(2));
    assert_exit(&out, 128 + 15);
    assert_eq!(summary(&out)["lease_lost"], false);
    assert!(!ran.exists(), "the command ran after SIGTERM");
}

#[test]
fn sigterm_during_the_final_release_ends_run_at_once() {
    let s = ValkeyServer::start();
    let proxy = fault_proxy::FaultProxy::start(&s.addr());
    let started = Scratch::new("started");
    let script = format!("echo up > {}; sleep 1", started.path().display());
    let child = spawn(
        run(&proxy.url(), "db", "a", "10s")
            .wait("0s")
            .short_deadlines()
            .sh(&script),
    );
    started.wait(Duration::from_secs(10));
    // The release will get no answer; run would retry it for several seconds.
    proxy.silence_from("FCALL");
    std::thread::sleep(Duration::from_millis(1500));
    let sent = Instant::now();
    sigterm(&child);
    let out = wait_within(child, Duration::from_secs(2));
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "{:?}",
        sent.elapsed()
    );
    let j = ended(&out, 0);
    assert_eq!(j["outcome"], "outcome_unknown", "{j}");
    assert_eq!(j["lease_lost"], false, "{j}");
}

#[test]
fn bad_arguments_exit_2_and_backend_trouble_exits_125_without_running_anything() {
    let s = ValkeyServer::start();
    let u = s.url();
    let ran = Scratch::new("ran");
    let touch = ran.touch();
    for (mut cmd, needle) in [
        (
            tl(
                &u,
                &["run", "--target", "db", "--owner", "a", "--ttl", "1s"],
            ),
            "<CMD>",
        ),
        (run(&u, "db", "a", "0s").exec(&touch), "ttl"),
        (run(&u, "", "a", "1s").exec(&touch), "target"),
        (run(&u, "db", "", "1s").exec(&touch), "owner"),
        (
            run(&u, "db", "a", "1s")
                .with(&["--metadata", "7"])
                .exec(&touch),
            "JSON object",
        ),
    ] {
        let args = format!("{cmd:?}");
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args}: {stderr}");
        assert!(stderr.contains(needle), "{args}: {stderr}");
        assert!(out.stdout.is_empty());
    }
    assert_eq!(s.conn().cmd(&["DBSIZE"]).int(), 0);

    let closed = format!("redis://127.0.0.1:{}", free_port());
    let out = run(&closed, "db", "a", "1s")
        .with(&["--connect-timeout", "1s", "--wait", "0s"])
        .exec(&touch)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(FAILED));
    assert_eq!(summary(&out)["outcome"], "backend_unavailable");
    assert!(!ran.exists(), "the command ran without the lease");
}
