//! `targetlease run … -- CMD`, on the real binary against a real `valkey-server`:
//! the child's environment and exit code, waiting for a held target, renewal,
//! stopping the child when the lease is lost, signal forwarding, release.

#[path = "support/deadline.rs"]
mod deadline;
#[path = "support/fault_proxy.rs"]
mod fault_proxy;
#[path = "support/resp.rs"]
mod resp;
#[path = "support/valkey_server.rs"]
mod valkey_server;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use valkey_server::{ValkeyServer, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_targetlease");

fn tl(url: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TARGETLEASE_") {
            cmd.env_remove(k);
        }
    }
    cmd.env_remove("RUST_LOG")
        .env("TARGETLEASE_VALKEY_URL", url)
        .args(args);
    cmd
}

/// `targetlease run --target T --owner O --ttl TTL <extra> -- <cmd>`.
fn run_cmd(
    url: &str,
    target: &str,
    owner: &str,
    ttl: &str,
    extra: &[&str],
    cmd: &[&str],
) -> Command {
    let mut args = vec!["run", "--target", target, "--owner", owner, "--ttl", ttl];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(cmd);
    tl(url, &args)
}

fn lease_json(url: &str, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["lease"];
    all.extend_from_slice(args);
    let out = tl(url, &all).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "not JSON: {stdout} / {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap(), json)
}

fn get(url: &str, target: &str) -> Value {
    lease_json(url, &["get", "--target", target]).1
}

/// The JSON summary `run` writes as its last stderr line.
fn summary(out: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or("");
    let j: Value = serde_json::from_str(last)
        .unwrap_or_else(|_| panic!("last stderr line is not JSON: {stderr}"));
    for field in [
        "outcome",
        "lease",
        "server_time_ms",
        "message",
        "exit_code",
        "lease_lost",
    ] {
        assert!(j.get(field).is_some(), "summary lacks {field}: {last}");
    }
    assert_eq!(
        j["exit_code"].as_i64(),
        out.status.code().map(i64::from),
        "{last}"
    );
    j
}

fn wait_for_file(path: &Path, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} did not appear within {within:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_child(child: &mut Child, within: Duration) -> Output {
    let deadline = Instant::now() + within;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("targetlease run did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = Output {
        status: child.wait().unwrap(),
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    use std::io::Read;
    if let Some(mut s) = child.stdout.take() {
        s.read_to_end(&mut out.stdout).unwrap();
    }
    if let Some(mut s) = child.stderr.take() {
        s.read_to_end(&mut out.stderr).unwrap();
    }
    out
}

fn spawn(mut cmd: Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn tmp_file(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

#[test]
fn the_child_gets_the_token_its_exit_code_is_returned_and_the_lease_released() {
    let s = ValkeyServer::start();
    let u = s.url();
    let dir = tempfile::tempdir().unwrap();
    let file = tmp_file(&dir, "env");
    let script = format!(
        "echo \"$TARGETLEASE_FENCING_TOKEN|$TARGETLEASE_LEASE_ID|$TARGETLEASE_TARGET|$TARGETLEASE_NAMESPACE|$TARGETLEASE_OWNER\" > {}; echo child-stdout; exit 7",
        file.display()
    );
    let out = run_cmd(
        &u,
        "db",
        "alice",
        "10s",
        &["--namespace", "team-a"],
        &["sh", "-c", &script],
    )
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // stdout is the child's alone.
    assert_eq!(String::from_utf8_lossy(&out.stdout), "child-stdout\n");
    let text = std::fs::read_to_string(&file).unwrap();
    let parts: Vec<&str> = text.trim_end().split('|').collect();
    assert_eq!(parts[0], "1");
    assert_eq!(parts[1].len(), 36, "lease id: {text}");
    assert_eq!(&parts[2..], ["db", "team-a", "alice"]);
    let j = summary(&out);
    assert_eq!(j["outcome"], "released");
    assert_eq!(j["lease_lost"], false);
    assert_eq!(j["lease"]["fencing_token"], 1);
    assert!(
        j["lease"].get("lease_id").is_none(),
        "stderr must not carry the lease id"
    );
    let got = lease_json(&u, &["get", "--target", "db", "--namespace", "team-a"]);
    assert_eq!(got.1["outcome"], "not_found");

    // Success, and a second run gets a larger token.
    let out = run_cmd(
        &u,
        "db",
        "alice",
        "10s",
        &["--namespace", "team-a"],
        &["sh", "-c", "test \"$TARGETLEASE_FENCING_TOKEN\" = 2"],
    )
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_child_killed_by_a_signal_gives_128_plus_the_signal() {
    let s = ValkeyServer::start();
    let out = run_cmd(
        &s.url(),
        "db",
        "alice",
        "10s",
        &[],
        &["sh", "-c", "kill -KILL $$"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(128 + 9));
    assert_eq!(get(&s.url(), "db")["outcome"], "not_found");
}

#[test]
fn a_missing_command_exits_127_and_releases() {
    let s = ValkeyServer::start();
    let out = run_cmd(
        &s.url(),
        "db",
        "alice",
        "10s",
        &[],
        &["/nonexistent/targetlease-cmd"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(127));
    assert_eq!(summary(&out)["outcome"], "released");
    assert_eq!(get(&s.url(), "db")["outcome"], "not_found");
}

fn hold(url: &str, target: &str, owner: &str) -> Value {
    let (code, j) = lease_json(
        url,
        &[
            "acquire", "--target", target, "--owner", owner, "--ttl", "60s",
        ],
    );
    assert_eq!(code, 0, "{j}");
    j
}

#[test]
fn a_held_target_without_wait_exits_1_and_runs_nothing() {
    let s = ValkeyServer::start();
    let u = s.url();
    hold(&u, "db", "bob");
    let dir = tempfile::tempdir().unwrap();
    let file = tmp_file(&dir, "ran");
    let started = Instant::now();
    let out = run_cmd(
        &u,
        "db",
        "alice",
        "10s",
        &[],
        &["touch", file.to_str().unwrap()],
    )
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
    let out = run_cmd(
        &u,
        "db",
        "alice",
        "10s",
        &["--wait", "1500ms"],
        &["touch", file.to_str().unwrap()],
    )
    .output()
    .unwrap();
    let took = started.elapsed();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    let mut child = spawn(run_cmd(
        &u,
        "db",
        "alice",
        "10s",
        &["--wait", "20s"],
        &["sh", "-c", &script],
    ));
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
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() >= Duration::from_millis(1200));
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), "2");
    assert_eq!(get(&u, "db")["outcome"], "not_found");
}

#[test]
fn the_lease_is_renewed_while_the_child_outlives_its_ttl() {
    let s = ValkeyServer::start();
    let u = s.url();
    let mut child = spawn(run_cmd(&u, "db", "alice", "600ms", &[], &["sleep", "2"]));
    std::thread::sleep(Duration::from_millis(1500));
    let j = get(&u, "db");
    assert_eq!(j["outcome"], "found", "lease not renewed: {j}");
    assert_eq!(j["lease"]["owner"], "alice");
    let out = wait_child(&mut child, Duration::from_secs(10));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(summary(&out)["lease_lost"], false);
    assert_eq!(get(&u, "db")["outcome"], "not_found");
}

fn revoke(url: &str, target: &str) {
    let (code, j) = lease_json(url, &["revoke", "--target", target, "--reason", "test"]);
    assert_eq!(code, 0, "{j}");
}

#[test]
fn a_revoked_lease_terminates_the_child_and_run_fails() {
    let s = ValkeyServer::start();
    let u = s.url();
    let mut child = spawn(run_cmd(&u, "db", "alice", "1s", &[], &["sleep", "30"]));
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(get(&u, "db")["outcome"], "found");
    let revoked_at = Instant::now();
    revoke(&u, "db");
    let out = wait_child(&mut child, Duration::from_secs(10));
    assert!(
        revoked_at.elapsed() < Duration::from_secs(5),
        "{:?}",
        revoked_at.elapsed()
    );
    assert_eq!(
        out.status.code(),
        Some(128 + 15),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = summary(&out);
    assert_eq!(j["lease_lost"], true);
    assert!(
        ["expired", "not_owner", "not_found"].contains(&j["outcome"].as_str().unwrap()),
        "{j}"
    );
}

#[test]
fn a_child_that_exits_0_after_losing_the_lease_still_fails() {
    let s = ValkeyServer::start();
    let u = s.url();
    let dir = tempfile::tempdir().unwrap();
    let started = tmp_file(&dir, "started");
    let script = format!(
        "trap 'exit 0' TERM; echo up > {}; while :; do sleep 0.1; done",
        started.display()
    );
    let mut child = spawn(run_cmd(
        &u,
        "db",
        "alice",
        "1s",
        &[],
        &["sh", "-c", &script],
    ));
    wait_for_file(&started, Duration::from_secs(10));
    revoke(&u, "db");
    let out = wait_child(&mut child, Duration::from_secs(10));
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(summary(&out)["lease_lost"], true);
}

#[test]
fn a_child_ignoring_sigterm_is_killed_after_the_grace_period() {
    let s = ValkeyServer::start();
    let u = s.url();
    let dir = tempfile::tempdir().unwrap();
    let started = tmp_file(&dir, "started");
    let script = format!(
        "trap '' TERM; echo up > {}; while :; do sleep 0.1; done",
        started.display()
    );
    let mut child = spawn(run_cmd(
        &u,
        "db",
        "alice",
        "1s",
        &["--kill-grace", "700ms"],
        &["sh", "-c", &script],
    ));
    wait_for_file(&started, Duration::from_secs(10));
    let revoked_at = Instant::now();
    revoke(&u, "db");
    let out = wait_child(&mut child, Duration::from_secs(10));
    let took = revoked_at.elapsed();
    assert_eq!(
        out.status.code(),
        Some(128 + 9),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(took >= Duration::from_millis(700), "killed after {took:?}");
    assert_eq!(summary(&out)["lease_lost"], true);
}

#[test]
fn losing_the_backend_past_the_lease_expiry_terminates_the_child() {
    let mut s = ValkeyServer::start();
    let u = s.url();
    let mut child = spawn(run_cmd(
        &u,
        "db",
        "alice",
        "1s",
        &["--timeout", "300ms"],
        &["sleep", "30"],
    ));
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(get(&u, "db")["outcome"], "found");
    let killed_at = Instant::now();
    s.kill();
    let out = wait_child(&mut child, Duration::from_secs(15));
    // Renewals keep failing until the local expiry estimate (at most the 1s ttl) passes.
    let took = killed_at.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(
        out.status.code(),
        Some(128 + 15),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = summary(&out);
    assert_eq!(j["lease_lost"], true);
    assert!(
        ["backend_unavailable", "outcome_unknown"].contains(&j["outcome"].as_str().unwrap()),
        "{j}"
    );
}

#[test]
fn sigterm_to_run_is_forwarded_to_the_child_and_the_lease_released() {
    let s = ValkeyServer::start();
    let u = s.url();
    let dir = tempfile::tempdir().unwrap();
    let started = tmp_file(&dir, "started");
    let got = tmp_file(&dir, "got");
    let script = format!(
        "trap 'echo term > {}; exit 5' TERM; echo up > {}; while :; do sleep 0.1; done",
        got.display(),
        started.display()
    );
    let mut child = spawn(run_cmd(
        &u,
        "db",
        "alice",
        "10s",
        &[],
        &["sh", "-c", &script],
    ));
    wait_for_file(&started, Duration::from_secs(10));
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = wait_child(&mut child, Duration::from_secs(10));
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&got).unwrap().trim(), "term");
    assert_eq!(summary(&out)["outcome"], "released");
    assert_eq!(get(&u, "db")["outcome"], "not_found");
}

#[test]
fn bad_arguments_exit_2_and_backend_trouble_exits_3_without_running_anything() {
    let s = ValkeyServer::start();
    let u = s.url();
    let dir = tempfile::tempdir().unwrap();
    let file = tmp_file(&dir, "ran");
    let touch = ["touch", file.to_str().unwrap()];
    for (args, needle) in [
        (
            vec!["run", "--target", "db", "--owner", "a", "--ttl", "1s"],
            "<CMD>",
        ),
        (
            vec![
                "run", "--target", "db", "--owner", "a", "--ttl", "0s", "--", touch[0], touch[1],
            ],
            "ttl",
        ),
        (
            vec![
                "run", "--target", "", "--owner", "a", "--ttl", "1s", "--", touch[0], touch[1],
            ],
            "target",
        ),
        (
            vec![
                "run", "--target", "db", "--ttl", "1s", "--", touch[0], touch[1],
            ],
            "--owner",
        ),
        (
            vec![
                "run",
                "--target",
                "db",
                "--owner",
                "a",
                "--ttl",
                "1s",
                "--metadata",
                "7",
                "--",
                touch[0],
                touch[1],
            ],
            "JSON object",
        ),
    ] {
        let out = tl(&u, &args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty());
    }
    assert_eq!(s.conn().cmd(&["DBSIZE"]).int(), 0);

    let closed = format!("redis://127.0.0.1:{}", free_port());
    let out = run_cmd(
        &closed,
        "db",
        "a",
        "1s",
        &["--connect-timeout", "1s"],
        &touch,
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(summary(&out)["outcome"], "backend_unavailable");
    assert!(!file.exists(), "the command ran without the lease");
}

#[test]
fn a_lease_that_ended_unnoticed_before_the_child_exited_still_fails_the_run() {
    let s = ValkeyServer::start();
    let u = s.url();
    // The child revokes its own lease through the exported environment, then
    // exits 0 long before the first renewal (at ttl/3 = 20s) could notice.
    let script = format!("{BIN} lease revoke > /dev/null && exit 0");
    let started = Instant::now();
    let out = run_cmd(&u, "db", "alice", "60s", &[], &["sh", "-c", &script])
        .output()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = summary(&out);
    assert_eq!(j["lease_lost"], true, "{j}");
    assert_eq!(get(&u, "db")["outcome"], "not_found");
}

const QUICK: [&str; 4] = ["--timeout", "1s", "--connect-timeout", "1s"];

#[test]
fn wait_against_a_silent_server_gives_up_within_its_budget() {
    let silent = fault_proxy::FaultProxy::silent();
    let dir = tempfile::tempdir().unwrap();
    let file = tmp_file(&dir, "ran");
    let mut extra = vec!["--wait", "2s"];
    extra.extend_from_slice(&QUICK);
    let cmd = run_cmd(
        &silent.url(),
        "db",
        "a",
        "10s",
        &extra,
        &["touch", file.to_str().unwrap()],
    );
    // The wait, plus one connect attempt that started just before it ended.
    let (out, took) = deadline::output_within(cmd, Duration::from_secs(5));
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = summary(&out);
    assert_eq!(j["outcome"], "backend_unavailable", "{j}");
    assert!(!j["message"].as_str().unwrap().contains("Os {"), "{j}");
    assert!(!file.exists(), "the command ran without the lease");
    eprintln!("run --wait 2s against a silent server: {took:?}");
}

#[test]
fn sigterm_before_the_command_starts_ends_run_at_once() {
    let silent = fault_proxy::FaultProxy::silent();
    let dir = tempfile::tempdir().unwrap();
    let file = tmp_file(&dir, "ran");
    let mut extra = vec!["--wait", "60s"];
    extra.extend_from_slice(&QUICK);
    let child = spawn(run_cmd(
        &silent.url(),
        "db",
        "a",
        "10s",
        &extra,
        &["touch", file.to_str().unwrap()],
    ));
    std::thread::sleep(Duration::from_millis(1500));
    let sent = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = deadline::wait_within(child, Duration::from_secs(2));
    eprintln!("run exited {:?} after SIGTERM", sent.elapsed());
    assert!(sent.elapsed() < Duration::from_secs(2));
    assert_eq!(
        out.status.code(),
        Some(128 + 15),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(summary(&out)["lease_lost"], false);
    assert!(!file.exists(), "the command ran after SIGTERM");
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
    let cmd = run_cmd(
        &url,
        "db",
        "a",
        "10s",
        &extra,
        &["touch", file.to_str().unwrap()],
    );
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
    let child = spawn(run_cmd(
        &url,
        "db",
        "a",
        "10s",
        &extra,
        &["touch", file.to_str().unwrap()],
    ));
    std::thread::sleep(Duration::from_millis(1500));
    let _server = ValkeyServer::start_on(port, &[]);
    let out = deadline::wait_within(child, Duration::from_secs(20));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(file.exists());
}

#[test]
fn sigterm_during_the_final_release_ends_run_at_once() {
    let s = ValkeyServer::start();
    let proxy = fault_proxy::FaultProxy::start(&s.addr());
    let dir = tempfile::tempdir().unwrap();
    let started = tmp_file(&dir, "started");
    let script = format!("echo up > {}; sleep 1", started.display());
    let mut extra = vec!["--wait", "0s"];
    extra.extend_from_slice(&QUICK);
    let child = spawn(run_cmd(
        &proxy.url(),
        "db",
        "a",
        "10s",
        &extra,
        &["sh", "-c", &script],
    ));
    wait_for_file(&started, Duration::from_secs(10));
    // The release will get no answer; run would retry it for several seconds.
    proxy.silence_from("EVALSHA");
    std::thread::sleep(Duration::from_millis(1500));
    let sent = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = deadline::wait_within(child, Duration::from_secs(2));
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = summary(&out);
    assert_eq!(j["outcome"], "outcome_unknown", "{j}");
    assert_eq!(j["lease_lost"], false, "{j}");
}

#[test]
fn a_grant_that_may_have_happened_is_never_reported_as_nothing_happened() {
    let s = ValkeyServer::start();
    let proxy = fault_proxy::FaultProxy::start(&s.addr());
    let dir = tempfile::tempdir().unwrap();
    let file = tmp_file(&dir, "ran");
    // The first acquire runs and its reply is lost; every retry is refused
    // before running, as by a replica after a failover.
    proxy.cut_before_reply("EVALSHA");
    proxy.refuse(
        "EVALSHA",
        "READONLY You can't write against a read only replica.",
        100,
    );
    let mut extra = vec!["--wait", "1s"];
    extra.extend_from_slice(&QUICK);
    let cmd = run_cmd(
        &proxy.url(),
        "db",
        "a",
        "30s",
        &extra,
        &["touch", file.to_str().unwrap()],
    );
    let (out, _) = deadline::output_within(cmd, Duration::from_secs(8));
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = summary(&out);
    assert_eq!(j["outcome"], "outcome_unknown", "{j}");
    assert!(!file.exists());
    // It did acquire: the lease exists (and expires after its ttl).
    assert_eq!(get(&s.url(), "db")["outcome"], "found");
}
