//! The one rule for finding tools (`scripts/lib/tools.sh`,
//! `tests/support/tools.rs`): after `scripts/setup.sh`, every tool the rule
//! lists is in the tools directory, and the kubectl there speaks the API
//! server's minor version — whatever kubectl the machine has on PATH.

use std::path::PathBuf;
use std::process::Command;

use crate::support::tools::{tool, tools_dir};

fn rule() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/lib/tools.sh")
}

#[test]
fn every_tool_the_rule_lists_is_in_the_tools_directory() {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source '{}'; echo \"${{#TOOLS_ALL[@]}}\"; missing_tools",
            rule().display()
        ))
        .env("TARGETLEASE_TOOLS_DIR", tools_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines();
    let listed: usize = lines.next().unwrap().parse().unwrap();
    assert!(listed >= 25, "the rule lists {listed} tools");
    let missing: Vec<&str> = lines.collect();
    assert!(
        missing.is_empty(),
        "missing from {}: {missing:?} (scripts/setup.sh must put them there)",
        tools_dir().display()
    );
}

/// `v1.37.2` of `Kubernetes v1.37.2` / `Client Version: v1.37.2`: the
/// version stamped into the binary when it was built.
fn stamped(bin: &str, args: &[&str]) -> String {
    let out = Command::new(tool(bin)).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let at = text
        .find("v1.")
        .unwrap_or_else(|| panic!("{bin} {args:?}: {text}"));
    text[at..]
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-'))
        .next()
        .unwrap()
        .to_string()
}

/// `v1.37` of `v1.37.2`.
fn minor(version: &str) -> String {
    version.splitn(3, '.').take(2).collect::<Vec<_>>().join(".")
}

/// The `k8s.io/kubernetes` release really compiled into Go binary `bin`, from
/// the build information Go embeds (what `go version -m` prints: `mod` when
/// the main package is Kubernetes' own, `dep` when it is a dependency).
fn compiled(bin: &str) -> String {
    let data = std::fs::read(tool(bin)).unwrap();
    let text = String::from_utf8_lossy(&data);
    ["\nmod\tk8s.io/kubernetes\t", "\ndep\tk8s.io/kubernetes\t"]
        .iter()
        .find_map(|key| {
            let at = text.find(key)? + key.len();
            text[at..].split(['\t', '\n']).next().map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("no k8s.io/kubernetes in {bin}'s Go build information"))
}

/// The `k8s.io/kubernetes` release Go module `dir` (under
/// tests/controlplane) requires.
fn required(dir: &str) -> String {
    let go_mod = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/controlplane")
        .join(dir)
        .join("go.mod");
    let text = std::fs::read_to_string(&go_mod).unwrap();
    text.lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            let first = words.next()?;
            let module = if first == "require" {
                words.next()?
            } else {
                first
            };
            (module == "k8s.io/kubernetes").then(|| words.next().map(str::to_owned))?
        })
        .unwrap_or_else(|| panic!("{} requires no k8s.io/kubernetes", go_mod.display()))
}

/// Each binary says the release it was built from (its own module's, not
/// another's), and kubectl's minor is the API server's: kubectl supports
/// one minor of skew, and a kubectl of another release would change what
/// the tests see.
#[test]
fn the_tests_kubectl_is_the_api_servers_minor_version() {
    for (bin, args, module) in [
        ("kube-apiserver", &["--version"][..], "."),
        ("kubectl", &["version", "--client"][..], "kubectl"),
    ] {
        let (stamped, compiled, required) = (stamped(bin, args), compiled(bin), required(module));
        assert_eq!(
            (&stamped, &compiled),
            (&required, &required),
            "{bin}: stamped {stamped}, compiled from k8s.io/kubernetes {compiled}, and \
             tests/controlplane/{module}/go.mod requires {required} (FORCE=1 \
             scripts/build-controlplane.sh rebuilds it)"
        );
    }
    let server = minor(&stamped("kube-apiserver", &["--version"]));
    let kubectl = minor(&stamped("kubectl", &["version", "--client"]));
    assert_eq!(
        kubectl, server,
        "kubectl {kubectl} against kube-apiserver {server}"
    );
}

/// Where scripts and tests may name a tool's path on the system, each with
/// its reason: (file, tool, why).
const SYSTEM_PATH_EXCEPTIONS: &[(&str, &str, &str)] = &[
    (
        "scripts/setup.sh",
        "*",
        "it links the packaged tools from where their packages put them into the tools directory",
    ),
    (
        "scripts/node.sh",
        "busybox",
        "the busybox path it names is inside the image's root filesystem, where it copies the tools directory's busybox",
    ),
];

/// The names the rule covers (`TOOLS_ALL`), and the packaged names behind
/// them (`stunnel4`, PostgreSQL's programs).
fn covered_tools() -> Vec<String> {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source '{}'; printf '%s\\n' \"${{TOOLS_ALL[@]}}\"",
            rule().display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    names.extend(["stunnel4", "pg_ctl", "initdb", "psql", "postgres"].map(String::from));
    names
}

/// Whether `line` has `prefix` + `tool` as a whole word.
fn names(line: &str, prefix: &str, tool: &str) -> bool {
    let needle = format!("{prefix}{tool}");
    line.match_indices(&needle).any(|(at, _)| {
        line[at + needle.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || "-_.".contains(c)))
    })
}

/// Every way `line` of a file with extension `ext` finds `tool` other than
/// through the tools directory.
fn lucky_finds(line: &str, ext: &str, tool: &str) -> Vec<String> {
    let mut found = Vec::new();
    let q = '"';
    let lookups: &[&str] = match ext {
        "rs" => &["Command::new(\""],
        "py" => &["[\"", "['", "which(\""],
        _ => &["command -v ", "which ", "type -P ", "type -p ", "hash "],
    };
    for prefix in lookups {
        if names(line, prefix, tool) {
            let close = if ext == "rs" {
                format!("{q})")
            } else {
                String::new()
            };
            found.push(format!("{prefix}{tool}{close} (found on PATH)"));
        }
    }
    for dir in ["/bin/", "/sbin/"] {
        if names(line, dir, tool) {
            found.push(format!("…{dir}{tool} (a system path)"));
        }
    }
    // Where Debian puts them (spelled in two pieces, so this file does not name them).
    for (owner, dir) in [
        ("postgresql", ["/usr/lib/", "postgresql/"]),
        ("libfaketimeMT.so.1", ["/", "faketime/"]),
    ] {
        let dir = dir.concat();
        if tool == owner && line.contains(&dir) {
            found.push(format!("{dir} (a system path)"));
        }
    }
    found
}

/// No script or test finds a tool the rule covers by luck: through PATH
/// (`command -v`, `which`, a bare `Command::new("kubectl")`) or at a fixed
/// system path, rather than in the tools directory (`tool` in
/// scripts/lib/tools.sh and tests/support/tools.rs). Comments are not
/// looked at; the exceptions above say why each is one.
#[test]
fn no_script_or_test_finds_a_tool_by_luck() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("git")
        .arg("-C")
        .arg(&repo)
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .args(["scripts", "tests", ".ci", "build"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tools = covered_tools();
    let mut bad = Vec::new();
    let mut scanned = 0;
    for file in String::from_utf8_lossy(&out.stdout).lines() {
        let ext = file.rsplit_once('.').map_or("", |(_, e)| e);
        let script = matches!(ext, "sh" | "py" | "rs")
            || (ext.is_empty() && !file.starts_with("tests/"))
            || file.starts_with(".ci/");
        let Ok(text) = std::fs::read_to_string(repo.join(file)) else {
            continue;
        };
        if !script {
            continue;
        }
        scanned += 1;
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with('#') || code.starts_with("//") {
                continue;
            }
            for tool in &tools {
                let excepted = SYSTEM_PATH_EXCEPTIONS
                    .iter()
                    .any(|(f, t, _)| *f == file && (*t == "*" || t == tool));
                for how in lucky_finds(line, ext, tool) {
                    if !(excepted && how.ends_with("(a system path)")) {
                        bad.push(format!("{file}:{}: {how}: {}", n + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(scanned > 100, "only {scanned} scripts and tests scanned");
    assert!(
        bad.is_empty(),
        "tools found by luck (take them from the tools directory: `tool NAME` in scripts, \
         support::tools::tool in tests):\n{}",
        bad.join("\n")
    );
}

/// Cargo's `protoc` (the etcd client's build compiles etcd's protos) follows
/// the rule too: `.cargo/config.toml` points `PROTOC` at `build/protoc`,
/// which runs the tools directory's `protoc` and, without one there, fails
/// loudly instead of taking one from PATH.
#[test]
fn cargo_takes_protoc_from_the_tools_directory() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = std::fs::read_to_string(repo.join(".cargo/config.toml")).unwrap();
    assert!(
        config
            .lines()
            .any(|l| l.trim() == r#"PROTOC = { value = "build/protoc", relative = true }"#),
        ".cargo/config.toml must set PROTOC to build/protoc:\n{config}"
    );
    let wrapper = repo.join("build/protoc");
    let out = Command::new(&wrapper)
        .arg("--version")
        .env("TARGETLEASE_TOOLS_DIR", tools_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with("libprotoc "),
        "build/protoc --version with {}: {out:?}",
        tools_dir().display()
    );
    // An empty tools directory, and a working protoc first on PATH: the
    // wrapper must refuse, not find that one.
    let empty = tempfile::tempdir().unwrap();
    let on_path = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(tool("protoc"), on_path.path().join("protoc")).unwrap();
    let mut path = vec![on_path.path().to_path_buf()];
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let out = Command::new(&wrapper)
        .arg("--version")
        .env("TARGETLEASE_TOOLS_DIR", empty.path())
        .env("PATH", std::env::join_paths(path).unwrap())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("missing") && stderr.contains("scripts/setup.sh"),
        "{stderr}"
    );
}
