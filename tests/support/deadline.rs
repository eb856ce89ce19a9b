//! Running the real binary with a deadline: a command that hangs fails the
//! test (and is killed) instead of hanging the suite.

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` to completion; panics (after killing it) if it runs longer than
/// `limit` plus a grace of 10s, and asserts it ended within `limit`.
pub fn output_within(mut cmd: Command, limit: Duration) -> (Output, Duration) {
    let started = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let out = wait_within(child, limit + Duration::from_secs(10));
    let took = started.elapsed();
    assert!(
        took <= limit,
        "took {took:?}, more than {limit:?}; stdout {} stderr {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, took)
}

/// Waits for `child`, killing it and panicking after `limit`.
pub fn wait_within(mut child: Child, limit: Duration) -> Output {
    // Drain the pipes on threads so a chatty child cannot block on a full pipe.
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let out_t = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.read_to_end(&mut buf);
        }
        buf
    });
    let err_t = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_end(&mut buf);
        }
        buf
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the command hung (over {limit:?}); stderr so far: {}",
                String::from_utf8_lossy(&err_t.join().unwrap_or_default())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out_t.join().unwrap_or_default(),
        stderr: err_t.join().unwrap_or_default(),
    }
}
