//! With `RUST_LOG=trace`, the real binary logs neither the password, nor
//! another owner's lease id, nor lease metadata, whatever happens.

use crate::support::valkey_server;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use targetlease::store::valkey::{Secret, ValkeyConfig, ValkeyStore};
use targetlease::store::{AcquireRequest, LeaseStore, Target};
use valkey_server::ValkeyServer;

const PASSWORD: &str = "redaction-Pw-77x1";
const WRONG: &str = "redaction-Wrong-22q9";
const META: &str = "meta-secret-Qv3";

struct Run {
    stdout: String,
    stderr: String,
}

fn run(args: &[&str], url: &str, password_file: &Path) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_targetlease"))
        .args(args)
        .args(["--valkey-url", url, "--username", "targetlease"])
        .arg("--password-file")
        .arg(password_file)
        .env("RUST_LOG", "trace")
        .output()
        .expect("run targetlease");
    Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test]
async fn trace_logs_hold_no_secrets() {
    let server = ValkeyServer::start();
    let rule = include_str!("../../docs/valkey.md")
        .lines()
        .find(|l| l.starts_with("ACL SETUSER targetlease "))
        .expect("documented rule")
        .replace(">CHANGE-ME", &format!(">{PASSWORD}"));
    server
        .conn()
        .cmd(&rule.split_whitespace().collect::<Vec<_>>());

    // Alice holds the target, with metadata; her lease id is her capability.
    let store = ValkeyStore::connect(&ValkeyConfig {
        url: server.url(),
        username: Some("targetlease".into()),
        password: Some(Secret::new(PASSWORD)),
        ..ValkeyConfig::default()
    })
    .await
    .unwrap();
    let mut req = AcquireRequest::new(
        Target::new("default", "t"),
        "alice",
        Duration::from_secs(60),
    );
    let mut meta = serde_json::Map::new();
    meta.insert("note".into(), META.into());
    req.metadata = Some(meta);
    let alice_id = store
        .acquire(&req)
        .await
        .unwrap()
        .lease
        .unwrap()
        .lease_id
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    let bad = dir.path().join("bad");
    std::fs::write(&good, format!("{PASSWORD}\n")).unwrap();
    std::fs::write(&bad, WRONG).unwrap();
    let url = server.url();
    let runs = [
        run(
            &[
                "lease", "acquire", "--target", "t", "--owner", "bob", "--ttl", "10s",
            ],
            &url,
            &good,
        ),
        run(&["lease", "get", "--target", "t"], &url, &good),
        run(&["check"], &url, &good),
        run(&["lease", "get", "--target", "t"], &url, &bad),
        run(&["check"], &url, &bad),
    ];
    assert!(
        runs[0].stderr.contains("lease script ran"),
        "trace logging is on (else this test proves nothing): {}",
        runs[0].stderr
    );
    assert!(runs[3].stdout.contains("WRONGPASS") || runs[3].stderr.contains("WRONGPASS"));
    for (i, r) in runs.iter().enumerate() {
        for secret in [PASSWORD, WRONG, alice_id.as_str()] {
            assert!(
                !r.stderr.contains(secret) && !r.stdout.contains(secret),
                "run {i} shows a secret:\nstdout: {}\nstderr: {}",
                r.stdout,
                r.stderr
            );
        }
        assert!(
            !r.stderr.contains(META),
            "run {i} logs lease metadata: {}",
            r.stderr
        );
    }
}
