//! A password inside `--valkey-url` is refused by every command that talks
//! to Valkey, before anything connects, without showing the password; a
//! user name alone is accepted.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::support::cli::targetlease;

const CANARY: &str = "s3cret-url-canary";

/// A listener that counts the connections made to it (and closes them).
fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            if conn.is_ok() {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    (port, count)
}

/// Asserts that `out` is a refusal of a password in the URL (exit 2, naming
/// `--password-file`) that shows the password nowhere; its stderr and what
/// to show on failure (`what` names the command).
fn assert_password_refused(out: &std::process::Output, what: String) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let shown = format!("{what}: {stdout} {stderr}");
    assert_eq!(out.status.code(), Some(2), "{shown}");
    assert!(stderr.contains("--password-file"), "{shown}");
    assert!(stderr.contains("password inside the URL"), "{shown}");
    assert!(
        !stdout.contains(CANARY) && !stderr.contains(CANARY),
        "{shown}"
    );
    (stderr, shown)
}

/// Each command that takes a Valkey URL, with the URL and a short deadline.
fn commands(url: &str) -> Vec<Vec<String>> {
    let tail = |v: Vec<&str>| {
        v.into_iter()
            .chain([
                "--valkey-url",
                url,
                "--timeout",
                "1s",
                "--connect-timeout",
                "1s",
            ])
            .map(String::from)
            .collect::<Vec<_>>()
    };
    vec![
        tail(vec!["lease", "get", "--target", "db"]),
        tail(vec![
            "lease", "acquire", "--target", "db", "--owner", "o", "--ttl", "10s",
        ]),
        tail(vec!["lease", "list"]),
        tail(vec!["check"]),
        tail(vec![
            "run", "--target", "db", "--ttl", "10s", "--wait", "0s",
        ])
        .into_iter()
        .chain(["--", "true"].map(String::from))
        .collect(),
        tail(vec!["operator", "--admin-addr", "127.0.0.1:0"]),
    ]
}

/// `lease`, `run`, `check` and `operator` refuse a URL with a password
/// (exit 2) with a message naming `--password-file`; the password shows
/// nowhere, even at `RUST_LOG=trace`, and no connection is made. Given
/// through `TARGETLEASE_VALKEY_URL` it is refused the same way.
#[test]
fn a_password_inside_the_url_is_refused_before_anything_connects() {
    let (port, connections) = counting_listener();
    for url in [
        format!("redis://:{CANARY}@127.0.0.1:{port}"),
        format!("valkey://user:{CANARY}@127.0.0.1:{port}/0"),
        format!("redis-sentinel://u:{CANARY}@127.0.0.1:{port}?sentinelServiceName=m"),
    ] {
        for args in commands(&url) {
            // Once as a flag, once from the environment.
            let from_env: Vec<String> = {
                let i = args.iter().position(|a| a == "--valkey-url").unwrap();
                let mut v = args.clone();
                v.drain(i..i + 2);
                v
            };
            for (args, env) in [(&args, None), (&from_env, Some(&url))] {
                let mut cmd = targetlease(args);
                cmd.env("RUST_LOG", "trace");
                if let Some(url) = env {
                    cmd.env("TARGETLEASE_VALKEY_URL", url);
                }
                let out = cmd.output().unwrap();
                let (stderr, shown) = assert_password_refused(
                    &out,
                    format!("{args:?} (url from env: {})", env.is_some()),
                );
                assert!(stderr.contains("--valkey-url"), "{shown}");
            }
        }
    }
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "a command connected before refusing the URL"
    );
}

/// A user name in the URL is not a secret: `valkey://user@host` is used as
/// given (the command goes on to connect).
#[test]
fn a_user_name_alone_in_the_url_is_accepted() {
    let (port, connections) = counting_listener();
    let out = targetlease(&[
        "lease",
        "get",
        "--target",
        "db",
        "--timeout",
        "1s",
        "--connect-timeout",
        "1s",
        "--valkey-url",
        &format!("valkey://reader@127.0.0.1:{port}"),
    ])
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(2), "{stderr}");
    assert!(connections.load(Ordering::SeqCst) >= 1, "{stderr}");
}

/// The same for an etcd URL, given as `--store-url` or through
/// `TARGETLEASE_STORE_URL`; that variable is read before
/// `TARGETLEASE_VALKEY_URL`, which names a server that would be reached.
#[test]
fn a_password_inside_an_etcd_url_is_refused_before_anything_connects() {
    let (port, connections) = counting_listener();
    let (valkey_port, valkey_connections) = counting_listener();
    let url = format!("etcd://user:{CANARY}@127.0.0.1:{port}");
    for args in commands(&url) {
        let flag = args.iter().position(|a| a == "--valkey-url").unwrap();
        let mut store_flag = args.clone();
        store_flag[flag] = "--store-url".into();
        let mut from_env = args.clone();
        from_env.drain(flag..flag + 2);
        for (args, env) in [(&store_flag, false), (&from_env, true)] {
            let mut cmd = targetlease(args);
            cmd.env("RUST_LOG", "trace");
            if env {
                cmd.env("TARGETLEASE_STORE_URL", &url).env(
                    "TARGETLEASE_VALKEY_URL",
                    format!("redis://127.0.0.1:{valkey_port}"),
                );
            }
            let out = cmd.output().unwrap();
            assert_password_refused(&out, format!("{args:?} (url from env: {env})"));
        }
    }
    assert_eq!(
        connections.load(Ordering::SeqCst) + valkey_connections.load(Ordering::SeqCst),
        0,
        "a command connected before refusing the URL"
    );
}

/// Settings an etcd connection cannot use together are refused before
/// anything connects (exit 2), each with what to change: a password with
/// no user, a user with no password, TLS files with a URL without TLS
/// (`lease`, `run` and `check`).
#[test]
fn etcd_settings_that_do_not_go_together_are_refused_before_anything_connects() {
    let (port, connections) = counting_listener();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, "pw\n").unwrap();
    let file = file.to_str().unwrap();
    let cases: [(&str, &[&str], &str); 3] = [
        (
            "etcd",
            &["--password-file", file],
            "a password needs a user name",
        ),
        ("etcd", &["--username", "app"], "needs a password"),
        (
            "etcd",
            &["--tls-ca-file", file],
            "the URL does not use TLS (etcds://)",
        ),
    ];
    for (scheme, extra, said) in cases {
        let url = format!("{scheme}://127.0.0.1:{port}");
        // The operator reaches the Kubernetes API before the store.
        for mut args in commands(&url).into_iter().filter(|a| a[0] != "operator") {
            // Before `run`'s command, if any.
            let at = args.iter().position(|a| a == "--").unwrap_or(args.len());
            args.splice(at..at, extra.iter().map(|s| s.to_string()));
            let out = targetlease(&args).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let shown = format!("{args:?}: {stderr}");
            assert_eq!(out.status.code(), Some(2), "{shown}");
            assert!(stderr.contains(said), "{shown}");
        }
    }
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "a command connected before refusing its settings"
    );
}
