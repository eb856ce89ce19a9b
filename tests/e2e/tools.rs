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

/// `v1.37` of `Kubernetes v1.37.2` / `Client Version: v1.37.2`.
fn minor(bin: &str, args: &[&str]) -> String {
    let out = Command::new(tool(bin)).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let at = text
        .find("v1.")
        .unwrap_or_else(|| panic!("{bin} {args:?}: {text}"));
    let version = &text[at..];
    let end = version[3..]
        .find(|c: char| !c.is_ascii_digit())
        .map_or(version.len(), |i| i + 3);
    version[..end].to_string()
}

#[test]
fn the_tests_kubectl_is_the_api_servers_minor_version() {
    let server = minor("kube-apiserver", &["--version"]);
    let kubectl = minor("kubectl", &["version", "--client"]);
    assert_eq!(
        kubectl, server,
        "kubectl {kubectl} against kube-apiserver {server}"
    );
}
