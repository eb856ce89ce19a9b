//! What keeps the child from acting without the lease, or with more than
//! its token: it runs in a process group of its own that dies the moment
//! `run` does (even by SIGKILL), nothing it started outlives the release,
//! and its environment names neither the store nor its credentials.

use super::*;

/// Whether process `pid` is gone (or a zombie: dead, not yet reaped).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

/// Waits until every pid is gone; how long it took, or `None` past `within`.
fn all_gone(pids: &[u32], within: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < within {
        if pids.iter().all(|p| gone(*p)) {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// `sh` that starts a background `sleep`, writes both pids, and waits.
fn shell_with_a_background_child(pids: &Scratch, then: &str) -> String {
    format!(
        "sleep 600 & echo \"$$ $!\" > {}; {then}",
        pids.path().display()
    )
}

fn read_pids(pids: &Scratch) -> Vec<u32> {
    pids.wait(Duration::from_secs(10))
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

#[test]
fn sigkill_of_run_stops_the_child_and_all_it_started_at_once_and_the_lease_is_not_reused_meanwhile()
{
    let s = ValkeyServer::start();
    let u = s.url();
    let pids = Scratch::new("pids");
    let mut child =
        spawn(run(&u, "db", "alice", "3s").sh(&shell_with_a_background_child(&pids, "sleep 600")));
    let pids = read_pids(&pids);
    assert!(pids.iter().all(|p| !gone(*p)), "the command runs");
    let held = get(&u, "db");
    assert_eq!(held["lease"]["owner"], "alice", "{held}");

    child.kill().unwrap(); // SIGKILL: no handler in `run` runs.
    let took = all_gone(&pids, Duration::from_secs(2)).unwrap_or_else(|| {
        panic!("the command's processes {pids:?} outlived a SIGKILLed run by 2s")
    });
    eprintln!("SIGKILL of run -> its command's whole group gone: {took:?}");
    let _ = child.wait();
    assert!(took < Duration::from_secs(1), "{took:?}");

    // Nobody released it: the lease lives on, unused, until its own expiry,
    // and only then can anyone else acquire the target.
    let still = get(&u, "db");
    assert_eq!(still["outcome"], "found", "{still}");
    assert_eq!(still["lease"]["fencing_token"], 1, "{still}");
    let expired_at = held["lease"]["expires_at_ms"].as_u64().unwrap();
    let next = lease(&u, "acquire").target("db").owner("bob").ttl("10s");
    let deadline = Instant::now() + Duration::from_secs(10);
    let bob = loop {
        let r = next.res();
        if r.json["outcome"] == "acquired" {
            break r.json;
        }
        assert_eq!(r.json["lease"]["owner"], "alice", "{}", r.stdout);
        assert!(Instant::now() < deadline, "never acquired: {}", r.stdout);
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(bob["lease"]["fencing_token"], 2, "{bob}");
    assert!(
        bob["lease"]["acquired_at_ms"].as_u64().unwrap() >= expired_at,
        "acquired before alice's lease expired: {bob}"
    );
}

#[test]
fn what_the_command_leaves_in_its_group_is_stopped_before_the_release() {
    let s = ValkeyServer::start();
    let u = s.url();
    let pids = Scratch::new("pids");
    let out = run(&u, "db", "alice", "10s")
        .with(&["--kill-grace", "2s"])
        .sh(&shell_with_a_background_child(&pids, "exit 0"))
        .output()
        .unwrap();
    let j = ended(&out, 0);
    let pids = read_pids(&pids);
    assert!(pids.iter().all(|p| gone(*p)), "{pids:?} outlived run");
    assert_eq!(j["outcome"], "released", "{j}");
    assert!(
        j["message"].as_str().unwrap().contains("left in its group"),
        "{j}"
    );
}

/// CMD exits and leaves a process that ignores SIGTERM; `run` is SIGKILLed
/// while it gives that process its `--kill-grace`: the process goes at once
/// (the supervisor stays until everything CMD started is gone, and takes
/// the group with it when `run` dies).
#[test]
fn what_the_command_left_dies_with_run_killed_during_the_kill_grace() {
    let s = ValkeyServer::start();
    let u = s.url();
    let cmd = Scratch::new("cmd");
    let pids = Scratch::new("pids");
    // CMD exits once the process it leaves ignores SIGTERM and said so.
    let script = format!(
        "echo $$ > {c}; sh -c 'trap \"\" TERM; sleep 600 & echo \"$$ $!\" > {p}; wait' & \
         while [ ! -s {p} ]; do sleep 0.05; done; exit 0",
        c = cmd.path().display(),
        p = pids.path().display()
    );
    let mut child = spawn(
        run(&u, "db", "alice", "10s")
            .with(&["--kill-grace", "60s"])
            .sh(&script),
    );
    let cmd: u32 = cmd.wait(Duration::from_secs(10)).trim().parse().unwrap();
    let pids = read_pids(&pids);
    let finished = all_gone(&[cmd], Duration::from_secs(10)).is_some();
    // What CMD left ignores SIGTERM: `run` is in the grace period now.
    std::thread::sleep(Duration::from_millis(300));
    assert!(finished, "CMD exited");
    assert!(pids.iter().all(|p| !gone(*p)), "what CMD left runs on");
    assert!(
        child.try_wait().unwrap().is_none(),
        "run waits out the grace"
    );

    child.kill().unwrap();
    let took = all_gone(&pids, Duration::from_secs(2));
    let _ = child.wait();
    if took.is_none() {
        for p in &pids {
            let _ = Command::new("kill")
                .args(["-KILL", &p.to_string()])
                .status();
        }
    }
    let took = took.unwrap_or_else(|| {
        panic!("what the command left ({pids:?}) outlived a SIGKILLed run by 2s")
    });
    eprintln!("SIGKILL of run during the kill grace -> what CMD left gone: {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
}

/// CMD SIGKILLs the supervisor between it and `run`, and it and what it
/// started ignore SIGTERM: nothing would stop them if `run` died during a
/// `--kill-grace` now, so `run` gives none: they are SIGKILLed at once.
#[test]
fn a_command_that_kills_its_supervisor_is_stopped_at_once() {
    let s = ValkeyServer::start();
    let u = s.url();
    let pids = Scratch::new("pids");
    let script = format!(
        "trap '' TERM; sleep 600 & echo \"$$ $!\" > {p}; kill -KILL $PPID; wait",
        p = pids.path().display()
    );
    let started = Instant::now();
    let mut child = spawn(
        run(&u, "db", "alice", "10s")
            .with(&["--kill-grace", "60s"])
            .sh(&script),
    );
    let pids = read_pids(&pids);
    let took = all_gone(&pids, Duration::from_secs(5));
    if took.is_none() {
        for p in &pids {
            let _ = Command::new("kill")
                .args(["-KILL", &p.to_string()])
                .status();
        }
    }
    let _ = child.wait();
    let took = took.unwrap_or_else(|| {
        panic!("the command ({pids:?}) outlived its killed supervisor by 5s (a 60s grace)")
    });
    eprintln!("supervisor killed by CMD -> CMD's group gone: {took:?}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

/// What left CMD's group on purpose (`setsid`) is beyond reach: `run`
/// neither waits its `--kill-grace` for it nor says it stopped it.
#[test]
fn a_process_that_left_the_group_does_not_hold_up_the_release() {
    let s = ValkeyServer::start();
    let u = s.url();
    let pid = Scratch::new("pid");
    let p = pid.path().display();
    let script = format!(
        "setsid sh -c 'echo $$ > {p}; exec sleep 600' </dev/null >/dev/null 2>&1 & \
         while [ ! -s {p} ]; do sleep 0.05; done; exit 0"
    );
    let started = Instant::now();
    let out = run(&u, "db", "alice", "10s")
        .with(&["--kill-grace", "30s"])
        .sh(&script)
        .output()
        .unwrap();
    let took = started.elapsed();
    let daemon: u32 = pid.read().trim().parse().unwrap();
    let alive = !gone(daemon);
    let _ = Command::new("kill")
        .args(["-KILL", &daemon.to_string()])
        .status();
    let j = ended(&out, 0);
    assert!(alive, "the process that left the group is beyond reach");
    assert!(
        took < Duration::from_secs(10),
        "run waited for it: {took:?}"
    );
    assert_eq!(j["outcome"], "released", "{j}");
    assert!(
        !j["message"].as_str().unwrap().contains("left in its group"),
        "{j}"
    );
}

#[test]
fn a_lost_lease_stops_everything_the_command_started() {
    let s = ValkeyServer::start();
    let u = s.url();
    let pids = Scratch::new("pids");
    let child = spawn(
        run(&u, "db", "alice", "1s")
            .with(&["--kill-grace", "5s"])
            .sh(&shell_with_a_background_child(&pids, "wait")),
    );
    let pids = read_pids(&pids);
    revoke(&u, "db");
    let out = wait_within(child, Duration::from_secs(10));
    let j = ended(&out, LOST);
    assert!(pids.iter().all(|p| gone(*p)), "{pids:?} outlived the lease");
    // SIGTERM reached the group: the shell ended by it, before the grace ran out.
    assert_eq!(j["command_exit_code"], 128 + 15, "{j}");
}

#[test]
fn the_child_environment_names_neither_the_store_nor_its_credentials() {
    let password = "pw-that-must-stay-put";
    let s = ValkeyServer::start_with(&["--requirepass", password]);
    let u = s.url();
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("valkey-password");
    std::fs::write(&password_file, format!("{password}\n")).unwrap();
    let password_path = password_file.to_str().unwrap();
    let seen = Scratch::new("env");
    let dump = format!("env > {}", seen.path().display());
    let out = run(&u, "db", "alice", "10s")
        .with(&["--key-prefix", "tenant-x"])
        .sh(&dump)
        .env("TARGETLEASE_PASSWORD_FILE", password_path)
        .env("TARGETLEASE_USERNAME", "default")
        .env("KEEP_ME", "1")
        .output()
        .unwrap();
    assert_exit(&out, 0);
    let env = seen.read();
    for secret in [password, password_path, &u, &s.addr(), "tenant-x"] {
        assert!(!env.contains(secret), "the child saw {secret:?}:\n{env}");
    }
    let ours: Vec<&str> = env
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .filter(|k| k.starts_with("TARGETLEASE_"))
        .collect();
    let mut sorted = ours.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [
            "TARGETLEASE_EXPIRES_AT",
            "TARGETLEASE_FENCING_TOKEN",
            "TARGETLEASE_NAMESPACE",
            "TARGETLEASE_OWNER",
            "TARGETLEASE_TARGET"
        ],
        "{env}"
    );
    assert!(env.lines().any(|l| l == "KEEP_ME=1"), "{env}");

    // Asked for, the connection reaches the child as settings and file
    // paths (never the password itself), enough to write with its token.
    let commit = format!(
        "env > {}; {} lease commit --key k --value from-the-child",
        seen.path().display(),
        bin()
    );
    let out = run(&u, "db", "alice", "10s")
        .with(&["--key-prefix", "tenant-x", "--export-connection"])
        .sh(&commit)
        .env("TARGETLEASE_PASSWORD_FILE", password_path)
        .output()
        .unwrap();
    assert_exit(&out, 0);
    let committed: Value = serde_json::from_slice(&out.stdout).expect("commit printed JSON");
    assert_eq!(committed["outcome"], "committed", "{committed}");
    let env = seen.read();
    assert!(!env.contains(password), "{env}");
    for var in [
        format!("TARGETLEASE_STORE_URL={u}"),
        format!("TARGETLEASE_VALKEY_URL={u}"),
        format!("TARGETLEASE_PASSWORD_FILE={password_path}"),
        "TARGETLEASE_KEY_PREFIX=tenant-x".to_string(),
    ] {
        assert!(env.lines().any(|l| l == var), "{var} missing:\n{env}");
    }
}

/// Runs `targetlease run …` on a new terminal (python3's `pty`): sends
/// `input` once `wait_for` shows, then Ctrl-C once `then_for` shows.
/// Returns what the terminal showed and `run`'s exit code.
fn on_a_terminal(url: &str, cmd: &str, script: &[(&str, &str)]) -> (String, i32) {
    let driver = r#"
import json, os, pty, select, sys, time
args = json.loads(sys.argv[1]); steps = json.loads(sys.argv[2])
pid, fd = pty.fork()
if pid == 0:
    os.execvpe(args[0], args, dict(os.environ))
seen = b""
def read(deadline):
    global seen
    while time.time() < deadline:
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                return False
            if not chunk:
                return False
            seen += chunk
            return True
    return True
for wait_for, send in steps:
    deadline = time.time() + 10
    while wait_for.encode() not in seen and time.time() < deadline:
        if not read(deadline):
            break
    os.write(fd, send.encode().decode('unicode_escape').encode())
deadline = time.time() + 10
done = 0
while time.time() < deadline and not done:
    open_ = read(deadline)
    done, status = os.waitpid(pid, os.WNOHANG)
    if not open_ and not done:
        time.sleep(0.05)
if not done:
    os.kill(pid, 9)
    done, status = os.waitpid(pid, 0)
read(time.time() + 0.3)
print(json.dumps({"seen": seen.decode("utf-8", "replace"), "code": os.waitstatus_to_exitcode(status)}))
"#;
    let args = vec![
        bin().to_string(),
        "run".into(),
        "--target".into(),
        "tty".into(),
        "--owner".into(),
        "alice".into(),
        "--valkey-url".into(),
        url.into(),
        "--".into(),
        "sh".into(),
        "-c".into(),
        cmd.into(),
    ];
    let steps: Vec<[&str; 2]> = script.iter().map(|(w, s)| [*w, *s]).collect();
    let out = Command::new("python3")
        .args(["-c", driver])
        .arg(serde_json::to_string(&args).unwrap())
        .arg(serde_json::to_string(&steps).unwrap())
        .env_remove("TARGETLEASE_OUTPUT")
        .output()
        .expect("python3 runs the terminal driver");
    let j: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "driver output ({e}): {} / {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (
        j["seen"].as_str().unwrap().to_string(),
        j["code"].as_i64().unwrap() as i32,
    )
}

#[test]
fn on_a_terminal_the_command_reads_it_and_ctrl_c_reaches_it_once() {
    let s = ValkeyServer::start();
    let cmd = "echo ready; read line; echo \"got $line\"; \
               trap 'echo interrupted; exit 9' INT; echo waiting; \
               while :; do sleep 0.1; done";
    let (seen, code) = on_a_terminal(
        &s.url(),
        cmd,
        &[("ready", "hello\\n"), ("waiting", "\\x03")],
    );
    // A CMD in a background group would have been stopped by its read.
    assert!(seen.contains("got hello"), "{seen}");
    assert_eq!(seen.matches("interrupted").count(), 1, "{seen}");
    assert_eq!(code, 9, "{seen}");
    // On a terminal, run reports in a line for people.
    assert!(
        seen.contains("targetlease run: command exited with 9; lease released (tty, token 1, owner alice); exit 9"),
        "{seen}"
    );
    assert_eq!(get(&s.url(), "tty")["outcome"], "not_found");
}
