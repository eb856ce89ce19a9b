//! One set of habits across commands: `-o json|text|yaml` (and
//! `TARGETLEASE_OUTPUT`) everywhere, the URL schemes Valkey's own clients
//! document, `--version` with the build, file errors that name the file.

use std::process::Output;

use serde_json::Value;

use crate::support::cli::{bin, lease, run, targetlease};
use crate::support::valkey_server::ValkeyServer;

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn yaml(text: &str) -> Value {
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("not YAML ({e}): {text}"))
}

#[test]
fn lease_commands_print_json_text_or_yaml_with_one_flag() {
    let s = ValkeyServer::start();
    let u = s.url();
    let out = lease(&u, "acquire")
        .target("db")
        .owner("alice")
        .flag("output", "yaml")
        .output();
    assert_eq!(out.status.code(), Some(0));
    let acquired = yaml(&stdout(&out));
    assert_eq!(acquired["outcome"], "acquired");
    assert_eq!(acquired["lease"]["fencing_token"], 1);
    assert_eq!(acquired["lease"]["lease_id"].as_str().unwrap().len(), 32);

    let text = lease(&u, "acquire")
        .target("db")
        .with(&["-o", "text"])
        .output();
    assert_eq!(text.status.code(), Some(1), "a refusal keeps its code");
    assert!(
        stdout(&text).starts_with("held: db held by alice with token 1"),
        "{}",
        stdout(&text)
    );
    // The variable does what the flag does; the flag wins.
    let mut get = lease(&u, "get").target("db").command();
    get.env("TARGETLEASE_OUTPUT", "yaml");
    let got = yaml(&stdout(&get.output().unwrap()));
    assert_eq!(got["outcome"], "found");
    assert!(got["lease"].get("lease_id").is_none(), "{got:?}");
    let mut get = lease(&u, "get")
        .target("db")
        .with(&["-o", "json"])
        .command();
    get.env("TARGETLEASE_OUTPUT", "yaml");
    let line: Value = serde_json::from_str(&stdout(&get.output().unwrap())).unwrap();
    assert_eq!(line["outcome"], "found");

    let listed = lease(&u, "list").with(&["-o", "yaml"]).output();
    let listed = yaml(&stdout(&listed));
    assert_eq!(listed[0]["target"], "db", "{listed:?}");
    assert_eq!(listed[0]["outcome"], "found", "{listed:?}");
}

#[test]
fn check_takes_the_same_output_flag_and_human_still_means_text() {
    let s = ValkeyServer::start();
    let check = |args: &[&str]| {
        let mut all = vec!["check", "--valkey-url"];
        let url = s.url();
        all.push(&url);
        all.extend(args);
        stdout(&targetlease(&all).output().unwrap())
    };
    let as_yaml = yaml(&check(&["-o", "yaml"]));
    assert_eq!(as_yaml["checks"][0]["name"], "reachability", "{as_yaml:?}");
    let text = check(&["-o", "text"]);
    assert!(text.contains("reachability"), "{text}");
    assert_eq!(
        text.lines().count(),
        check(&["--human"]).lines().count(),
        "--human is -o text"
    );
    // With -o (or its variable) it is a contradiction: refused, not one
    // silently winning.
    let url = s.url();
    let refused = |mut c: std::process::Command| {
        let out = c.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("'--human' cannot be used with"),
            "{out:?}"
        );
        assert!(out.stdout.is_empty(), "{out:?}");
    };
    for format in ["json", "yaml", "text"] {
        refused(targetlease(&[
            "check",
            "--valkey-url",
            &url,
            "--human",
            "-o",
            format,
        ]));
    }
    let mut from_env = targetlease(&["check", "--valkey-url", &url, "--human"]);
    from_env.env("TARGETLEASE_OUTPUT", "json");
    refused(from_env);
}

#[test]
fn run_reports_as_text_json_or_yaml_on_stderr() {
    let s = ValkeyServer::start();
    let u = s.url();
    let out = run(&u, "db", "alice", "10s")
        .with(&["-o", "text"])
        .exec(&["true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim_end(),
        "targetlease run: command exited with 0; lease released (db, token 1, owner alice); exit 0"
    );
    let out = run(&u, "db", "alice", "10s")
        .with(&["-o", "yaml"])
        .exec(&["sh", "-c", "exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let summary = yaml(&String::from_utf8_lossy(&out.stderr));
    assert_eq!(summary["outcome"], "released");
    assert_eq!(summary["exit_code"], 3);
    assert_eq!(summary["command_exit_code"], 3);
    assert_eq!(summary["lease"]["fencing_token"], 2);
}

#[test]
fn valkey_url_schemes_work_like_the_redis_ones() {
    let s = ValkeyServer::start();
    let valkey = s.url().replacen("redis://", "valkey://", 1);
    assert!(valkey.starts_with("valkey://"), "{valkey}");
    lease(&valkey, "acquire")
        .target("db")
        .owner("alice")
        .ok("acquired", 0);
    lease(&s.url(), "get").target("db").ok("found", 0);
    // valkeys:// means TLS: against this plaintext server the handshake
    // fails (backend trouble, 3), the URL itself is accepted (not 2).
    let valkeys = s.url().replacen("redis://", "valkeys://", 1);
    let r = lease(&valkeys, "get").target("db").short_deadlines().res();
    assert_eq!(r.code, 3, "{}", r.stdout);
    assert_eq!(r.json["outcome"], "backend_unavailable", "{}", r.stdout);
}

#[test]
fn version_names_the_release_and_how_it_was_built() {
    let out = targetlease(&["--version"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let line = stdout(&out);
    let rest = line
        .trim_end()
        .strip_prefix(&format!("targetlease {} (", env!("CARGO_PKG_VERSION")))
        .unwrap_or_else(|| panic!("{line:?}"));
    let built = rest.strip_suffix(')').unwrap_or_else(|| panic!("{line:?}"));
    assert!(
        built == "dev build"
            || built
                .strip_prefix("commit ")
                .is_some_and(|c| c.len() >= 7 && c.chars().all(|h| h.is_ascii_hexdigit())),
        "{line:?}"
    );
    assert!(std::path::Path::new(bin()).exists());
}

/// Every image build the documents give (README quick start, docs/*.md,
/// the Dockerfile's own comment) passes the commit, so the image's
/// `targetlease --version` names it: the build context has no `.git`.
#[test]
fn every_documented_image_build_passes_the_commit() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![repo.join("README.md"), repo.join("Dockerfile")];
    for doc in std::fs::read_dir(repo.join("docs")).unwrap() {
        let path = doc.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    let mut builds = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        // Commands as a shell reads them: continuation lines joined, a
        // Dockerfile comment's `#` dropped.
        let joined = text
            .lines()
            .map(|l| l.trim_start().trim_start_matches('#').trim())
            .collect::<Vec<_>>()
            .join("\n")
            .replace("\\\n", " ");
        for line in joined.lines() {
            let Some(at) = line
                .find("docker build ")
                .or(line.find("docker buildx build "))
            else {
                continue;
            };
            if line[..at].ends_with('`') {
                continue; // prose naming the command, not a command
            }
            builds += 1;
            assert!(
                line.contains("--build-arg TARGETLEASE_COMMIT="),
                "{}: {line}",
                file.display()
            );
        }
    }
    assert!(
        builds >= 4,
        "the README, install.md (twice) and the Dockerfile"
    );
}

/// Promise (docs/valkey.md): Valkey 9.0 or newer. Every Valkey image the
/// docs tell a user to run is one the store accepts.
#[test]
fn every_valkey_image_in_the_docs_is_one_the_store_accepts() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![repo.join("README.md")];
    for dir in ["docs", "examples", "charts/targetlease"] {
        for entry in std::fs::read_dir(repo.join(dir)).unwrap().flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "md" || e == "yaml") {
                files.push(path);
            }
        }
    }
    let mut seen = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (at, _) in text.match_indices("valkey/valkey:") {
            let tag: String = text[at + "valkey/valkey:".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-')
                .collect();
            seen += 1;
            let major: u32 = tag
                .split('.')
                .next()
                .and_then(|m| m.parse().ok())
                .unwrap_or_else(|| {
                    panic!("{}: valkey/valkey:{tag} names no version", file.display())
                });
            assert!(
                major >= 9,
                "{}: valkey/valkey:{tag} is older than 9.0, which the store refuses",
                file.display()
            );
        }
    }
    assert!(seen >= 2, "the README and install.md start a Valkey");
}

/// Promise (docs/cli.md, Getting it): `targetlease completion bash|zsh|fish`
/// prints a completion script for that shell.
#[test]
fn completion_scripts_for_each_shell_name_the_command() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef targetlease"),
        ("fish", "complete -c targetlease"),
    ] {
        let out = targetlease(&["completion", shell]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let text = stdout(&out);
        assert!(text.contains(marker), "{shell}: no {marker:?} in\n{text}");
        assert!(
            text.contains("acquire"),
            "{shell}: the subcommands are in it"
        );
    }
    let out = targetlease(&["completion", "tcsh"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

/// Promise (docs/cli.md): output that cannot be written (a full disk) is
/// said on stderr and exits 74, so it is never taken for output written.
#[test]
fn output_to_a_full_disk_exits_74() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = targetlease(&["completion", "bash"])
        .stdout(full)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(74));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot write"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn file_errors_name_the_file_and_why() {
    let s = ValkeyServer::start();
    let missing = "/nonexistent/targetlease-password";
    let out = lease(&s.url(), "get")
        .target("db")
        .flag("password-file", missing)
        .output();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot read password file {missing}: No such file or directory"
        )),
        "{stderr}"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = lease(&s.url(), "get")
        .target("db")
        .flag("password-file", dir.path().display())
        .output();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&dir.path().display().to_string()) && stderr.contains("directory"),
        "{stderr}"
    );
    // Each file flag names its own kind of file.
    let out = lease(&s.url(), "get")
        .target("db")
        .flag("sentinel-password-file", missing)
        .output();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot read Sentinel password file {missing}: No such file or directory"
        )),
        "{stderr}"
    );
    let key = "/nonexistent/targetlease-lease-id-key";
    let out = targetlease(&["operator", "--lease-id-key-file", key])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot read lease id key file {key}: No such file or directory"
        )),
        "{stderr}"
    );
}

/// A reader that stops early (`targetlease … | head -0`): no panic (exit
/// 101), not a word on stderr, and the exit code still tells the outcome.
#[test]
fn a_closed_stdout_is_a_quiet_exit_with_the_usual_code() {
    let s = ValkeyServer::start();
    let u = s.url();
    let into_closed_pipe = |mut c: std::process::Command| {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        c.stdout(writer);
        c.output().unwrap()
    };
    // Read-only commands print the same whether or not stdout is read: the
    // exit code must match the one of a run whose output is read.
    let acquired = lease(&u, "acquire").target("db").owner("alice").command();
    let held = lease(&u, "acquire")
        .target("db")
        .with(&["-o", "text"])
        .command();
    for (what, command, code) in [
        ("acquire", acquired, 0),
        ("acquire -o text (held)", held, 1),
    ] {
        let closed = into_closed_pipe(command);
        let stderr = String::from_utf8_lossy(&closed.stderr);
        assert_eq!(stderr, "", "{what}");
        assert_eq!(closed.status.code(), Some(code), "{what}");
    }
    let read_only: [&[&str]; 4] = [
        &[
            "lease",
            "get",
            "--valkey-url",
            &u,
            "--target",
            "db",
            "-o",
            "yaml",
        ],
        &["lease", "list", "--valkey-url", &u],
        &["crd"],
        &["check", "--valkey-url", &u, "-o", "text"],
    ];
    for args in read_only {
        let what = args.join(" ");
        let read = targetlease(args).output().unwrap();
        assert!(!read.stdout.is_empty(), "{what} prints something");
        let closed = into_closed_pipe(targetlease(args));
        let stderr = String::from_utf8_lossy(&closed.stderr);
        assert_eq!(stderr, "", "{what}");
        assert_eq!(closed.status.code(), read.status.code(), "{what}");
    }
}
