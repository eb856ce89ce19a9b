//! Waiting for a held target, a silent server or a server not up yet, within the --wait budget.

use super::*;

/// A server on which bob holds `db` for 60s: the server, its URL, bob's lease.
fn bob_holds_db() -> (ValkeyServer, String, Value) {
    let s = ValkeyServer::start();
    let u = s.url();
    let held = lease(&u, "acquire")
        .target("db")
        .owner("bob")
        .ttl("60s")
        .ok("acquired", 0)
        .json;
    (s, u, held)
}

#[test]
fn a_held_target_with_nonblock_exits_busy_at_once_and_runs_nothing() {
    let (_s, u, _) = bob_holds_db();
    let ran = Scratch::new("ran");
    for flags in [&["-n"][..], &["--nonblock"], &["--wait", "0s"]] {
        let started = Instant::now();
        let out = run(&u, "db", "alice", "10s")
            .with(flags)
            .exec(&ran.touch())
            .output()
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(3), "{flags:?}");
        assert!(out.stdout.is_empty());
        let j = ended(&out, BUSY);
        assert_eq!(j["outcome"], "held");
        assert_eq!(j["lease"]["owner"], "bob");
        assert_eq!(j["command_exit_code"], Value::Null);
        assert!(!ran.exists(), "the command ran without the lease");
    }
    // -n wins over a wait given in the environment.
    let out = run(&u, "db", "alice", "10s")
        .with(&["-n"])
        .exec(&ran.touch())
        .env("TARGETLEASE_WAIT", "30s")
        .output()
        .unwrap();
    assert_exit(&out, BUSY);
}

#[test]
fn by_default_run_waits_for_a_held_target_and_then_runs() {
    let (_s, u, held) = bob_holds_db();
    let file = Scratch::new("token");
    let script = format!(
        "echo $TARGETLEASE_FENCING_TOKEN > {}",
        file.path().display()
    );
    // No --wait: the documented default (1m) applies.
    let cmd = run(&u, "db", "alice", "10s").sh(&script);
    released_while_waiting(&u, &held, cmd, &file, Duration::from_millis(1500));
    assert_eq!(file.read().trim(), "2");
    // And it is what --help shows for `run` and `token` alike.
    for command in ["run", "token"] {
        let help = crate::support::cli::targetlease(&[command, "--help"])
            .env_remove("TARGETLEASE_WAIT")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&help.stdout).into_owned();
        let wait = help
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("--wait"))
            .take_while(|l| !l.trim_start().starts_with("-n") || l.contains("--wait"))
            .collect::<Vec<_>>()
            .join(" ");
        assert!(wait.contains("[default: 1m]"), "{command} --help: {wait}");
    }
}

/// Runs `cmd` (a `run` whose CMD writes `file`), checks it waits `pause`
/// without running, releases bob's lease, and returns its output once it
/// exited 0.
fn released_while_waiting(
    u: &str,
    held: &Value,
    cmd: Command,
    file: &Scratch,
    pause: Duration,
) -> Output {
    let child = spawn(cmd);
    std::thread::sleep(pause);
    assert!(!file.exists(), "ran while the target was held");
    lease(u, "release")
        .target("db")
        .handle(held)
        .ok("released", 0);
    let out = wait_within(child, Duration::from_secs(10));
    assert_exit(&out, 0);
    out
}

/// Promise (docs/cli.md, `run`): a waiting `run` is woken by the release
/// notification (Valkey pub/sub), not by its next poll; polling is only the
/// fallback.
#[test]
fn a_release_wakes_a_waiting_run_through_its_subscription() {
    let (_s, u, held) = bob_holds_db();
    let file = Scratch::new("woken");
    let script = format!("echo ran > {}", file.path().display());
    let mut cmd = run(&u, "db", "alice", "10s").wait("30s").sh(&script);
    cmd.env("RUST_LOG", "targetlease=debug");
    // Long enough for the polls to have backed off to their longest pause.
    let out = released_while_waiting(&u, &held, cmd, &file, Duration::from_secs(3));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("waiting for a release notification"),
        "no subscription:\n{log}"
    );
    assert!(
        log.contains("woken by a release notification"),
        "the release did not wake it:\n{log}"
    );
}

#[test]
fn waits_for_a_held_target_and_gives_up_after_wait() {
    let (_s, u, _) = bob_holds_db();
    let ran = Scratch::new("ran");
    let started = Instant::now();
    let out = run(&u, "db", "alice", "10s")
        .wait("1500ms")
        .exec(&ran.touch())
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_exit(&out, BUSY);
    assert!(
        took >= Duration::from_millis(1400),
        "gave up after {took:?}"
    );
    assert!(took < Duration::from_secs(6), "gave up after {took:?}");
    assert_eq!(summary(&out)["outcome"], "held");
    assert!(!ran.exists());
    assert_eq!(get(&u, "db")["lease"]["owner"], "bob");
}

#[test]
fn waits_for_a_held_target_and_runs_once_it_is_released() {
    let (_s, u, held) = bob_holds_db();
    let file = Scratch::new("token");
    let script = format!(
        "echo $TARGETLEASE_FENCING_TOKEN > {}",
        file.path().display()
    );
    let started = Instant::now();
    let child = spawn(run(&u, "db", "alice", "10s").wait("20s").sh(&script));
    std::thread::sleep(Duration::from_millis(1200));
    assert!(!file.exists(), "ran while the target was held");
    lease(&u, "release")
        .target("db")
        .handle(&held)
        .ok("released", 0);
    let out = wait_within(child, Duration::from_secs(10));
    assert_exit(&out, 0);
    assert!(started.elapsed() >= Duration::from_millis(1200));
    assert_eq!(file.read().trim(), "2");
    assert_eq!(get(&u, "db")["outcome"], "not_found");
}

#[test]
fn wait_against_a_silent_server_gives_up_within_its_budget() {
    let silent = fault_proxy::FaultProxy::silent();
    let ran = Scratch::new("ran");
    let cmd = run(&silent.url(), "db", "a", "10s")
        .wait("2s")
        .short_deadlines()
        .exec(&ran.touch());
    // The wait, plus one connect attempt that started just before it ended.
    let (out, took) = deadline::output_within(cmd, Duration::from_secs(5));
    let j = ended(&out, FAILED);
    assert_eq!(j["outcome"], "backend_unavailable", "{j}");
    assert!(!j["message"].as_str().unwrap().contains("Os {"), "{j}");
    assert!(!ran.exists(), "the command ran without the lease");
    eprintln!("run --wait 2s against a silent server: {took:?}");
}

#[test]
fn wait_retries_a_server_that_is_not_up_yet() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let ran = Scratch::new("ran");
    // Refused connections are retried until the wait ends, not given up at once.
    let cmd = run(&url, "db", "a", "10s")
        .wait("2s")
        .short_deadlines()
        .exec(&ran.touch());
    let (out, took) = deadline::output_within(cmd, Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(FAILED));
    assert_eq!(summary(&out)["outcome"], "backend_unavailable");
    assert!(
        took >= Duration::from_millis(1800),
        "gave up after {took:?}"
    );

    // A server that comes up during the wait is used.
    let child = spawn(
        run(&url, "db", "a", "10s")
            .wait("20s")
            .short_deadlines()
            .exec(&ran.touch()),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let _server = ValkeyServer::start_on(port, &[]);
    let out = wait_within(child, Duration::from_secs(20));
    assert_exit(&out, 0);
    assert!(ran.exists());
}
