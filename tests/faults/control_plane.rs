//! Control-plane faults on the test kube-apiserver + etcd started by
//! `scripts/controlplane.sh` (their pids, ports and command lines are in its
//! directory): restart kube-apiserver with the same flags, optionally with
//! etcd compacted past every watch's revision in between (through etcd's
//! JSON gateway), which forces every watch to relist.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::kube_env::start_apiserver_again;

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}/{file}: {e}", dir.display()))
        .trim()
        .to_string()
}

fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name in parentheses; a zombie has exited.
    let state = stat.rsplit(") ").next().and_then(|r| r.chars().next());
    !stat.is_empty() && !matches!(state, Some('Z' | 'X'))
}

/// Stops kube-apiserver (SIGTERM, SIGKILL after 10 s), starts it again with
/// the same command line, and waits until it serves again.
pub fn restart_apiserver(dir: &Path) {
    let argv = stop_apiserver(dir);
    start_apiserver_again(dir, &argv);
}

/// Stops kube-apiserver with etcd's history compacted past every revision a
/// watch has seen: a write straight to etcd moves the revision on, and the
/// compaction removes everything before it. Every watch then resumes from a
/// compacted revision and must relist. Returns the compacted revision.
pub fn restart_apiserver_past_compaction(dir: &Path) -> u64 {
    let argv = stop_apiserver(dir);
    let port = read(dir, "etcd.port");
    // key "/faults/tick" and value "x", base64.
    etcd_post(
        &port,
        "/v3/kv/put",
        r#"{"key":"L2ZhdWx0cy90aWNr","value":"eA=="}"#,
    );
    let rev = compact_etcd(dir);
    start_apiserver_again(dir, &argv);
    rev
}

/// Stops kube-apiserver; returns its command line.
fn stop_apiserver(dir: &Path) -> Vec<String> {
    let pid: i32 = read(dir, "kube-apiserver.pid")
        .parse()
        .expect("apiserver pid");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("apiserver command line");
    let argv: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let signal = |sig: &str| {
        let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
    };
    signal("-TERM");
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if alive(pid) {
        signal("-KILL");
    }
    while alive(pid) {
        std::thread::sleep(Duration::from_millis(50));
    }
    argv
}

/// One POST to etcd's JSON gateway; the response body.
fn etcd_post(port: &str, path: &str, body: &str) -> String {
    let mut conn = TcpStream::connect(format!("127.0.0.1:{port}")).expect("connect to etcd");
    conn.set_read_timeout(Some(Duration::from_secs(30))).ok();
    write!(
        conn,
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write to etcd");
    let mut text = String::new();
    conn.read_to_string(&mut text).expect("read from etcd");
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// Compacts etcd's history up to its current revision; returns that revision.
fn compact_etcd(dir: &Path) -> u64 {
    let port = read(dir, "etcd.port");
    // A range read of any key reports the current revision in its header ("AA==" is "\0").
    let status = etcd_post(&port, "/v3/kv/range", r#"{"key":"AA=="}"#);
    let v: serde_json::Value = serde_json::from_str(&status).expect("etcd range reply");
    let rev: u64 = v["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .expect("etcd revision");
    let reply = etcd_post(
        &port,
        "/v3/kv/compaction",
        &format!(r#"{{"revision":"{rev}","physical":true}}"#),
    );
    assert!(
        !reply.contains("\"error\""),
        "etcd compaction at {rev} failed: {reply}"
    );
    rev
}
