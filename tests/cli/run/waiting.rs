//! Waiting for a held target, a silent server or a server not up yet, within the --wait budget.

use super::*;

#[test]
fn a_held_target_without_wait_exits_1_and_runs_nothing() {
    let s = ValkeyServer::start();
    let u = s.url();
    hold(&u, "db", "bob");
    let dir = tempfile::tempdir().unwrap();
    let file = tmp_file(&dir, "ran");
    let started = Instant::now();
    let out = run(&u, "db", "alice", "10s")
        .exec(&["touch", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(out.stdout.is_empty());
    let j = summary(&out);
    assert_eq!(j["outcome"], "held");
    assert_eq!(j["lease"]["owner"], "bob");
    assert!(!file.exists(), "the command ran without the lease");
}

#[test]
fn waits_for_a_held_target_and_gives_up_after_wait() {
    let s = ValkeyServer::start();
    let u = s.url();
    hold(&u, "db", "bob");
    let dir = tempfile::tempdir().unwrap();
    let file = tmp_file(&dir, "ran");
    let started = Instant::now();
    let out = run(&u, "db", "alice", "10s")
        .with(&["--wait", "1500ms"])
        .exec(&["touch", file.to_str().unwrap()])
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_exit(&out, 1);
    assert!(
        took >= Duration::from_millis(1400),
        "gave up after {took:?}"
    );
    assert!(took < Duration::from_secs(6), "gave up after {took:?}");
    assert_eq!(summary(&out)["outcome"], "held");
    assert!(!file.exists());
    assert_eq!(get(&u, "db")["lease"]["owner"], "bob");
}

#[test]
fn waits_for_a_held_target_and_runs_once_it_is_released() {
    let s = ValkeyServer::start();
    let u = s.url();
    let held = hold(&u, "db", "bob");
    let dir = tempfile::tempdir().unwrap();
    let file = tmp_file(&dir, "token");
    let script = format!("echo $TARGETLEASE_FENCING_TOKEN > {}", file.display());
    let started = Instant::now();
    let mut child = spawn(
        run(&u, "db", "alice", "10s")
            .with(&["--wait", "20s"])
            .sh(&script),
    );
    std::thread::sleep(Duration::from_millis(1200));
    assert!(!file.exists(), "ran while the target was held");
    let l = &held["lease"];
    let (code, rel) = lease_json(
        &u,
        &[
            "release",
            "--target",
            "db",
            "--owner",
            "bob",
            "--lease-id",
            l["lease_id"].as_str().unwrap(),
            "--token",
            &l["fencing_token"].to_string(),
        ],
    );
    assert_eq!(code, 0, "{rel}");
    let out = wait_child(&mut child, Duration::from_secs(10));
    assert_exit(&out, 0);
    assert!(started.elapsed() >= Duration::from_millis(1200));
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), "2");
    assert_eq!(get(&u, "db")["outcome"], "not_found");
}

#[test]
fn wait_against_a_silent_server_gives_up_within_its_budget() {
    let silent = fault_proxy::FaultProxy::silent();
    let dir = tempfile::tempdir().unwrap();
    let file = tmp_file(&dir, "ran");
    let mut extra = vec!["--wait", "2s"];
    extra.extend_from_slice(&QUICK);
    let cmd = run(&silent.url(), "db", "a", "10s")
        .with(&extra)
        .exec(&["touch", file.to_str().unwrap()]);
    // The wait, plus one connect attempt that started just before it ended.
    let (out, took) = deadline::output_within(cmd, Duration::from_secs(5));
    let j = ended(&out, 3);
    assert_eq!(j["outcome"], "backend_unavailable", "{j}");
    assert!(!j["message"].as_str().unwrap().contains("Os {"), "{j}");
    assert!(!file.exists(), "the command ran without the lease");
    eprintln!("run --wait 2s against a silent server: {took:?}");
}

#[test]
fn wait_retries_a_server_that_is_not_up_yet() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let file = tmp_file(&dir, "ran");
    // Refused connections are retried until the wait ends, not given up at once.
    let mut extra = vec!["--wait", "2s"];
    extra.extend_from_slice(&QUICK);
    let cmd = run(&url, "db", "a", "10s")
        .with(&extra)
        .exec(&["touch", file.to_str().unwrap()]);
    let (out, took) = deadline::output_within(cmd, Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(summary(&out)["outcome"], "backend_unavailable");
    assert!(
        took >= Duration::from_millis(1800),
        "gave up after {took:?}"
    );

    // A server that comes up during the wait is used.
    let mut extra = vec!["--wait", "20s"];
    extra.extend_from_slice(&QUICK);
    let child = spawn(
        run(&url, "db", "a", "10s")
            .with(&extra)
            .exec(&["touch", file.to_str().unwrap()]),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let _server = ValkeyServer::start_on(port, &[]);
    let out = deadline::wait_within(child, Duration::from_secs(20));
    assert_exit(&out, 0);
    assert!(file.exists());
}
