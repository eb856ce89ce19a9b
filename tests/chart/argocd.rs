//! `contrib/argocd/health.lua`, run by `lua-health`: gopher-lua, the Lua
//! engine Argo CD embeds, set up as Argo CD sets it up for a custom health
//! check (tests/controlplane/luahealth). The shipped fixtures, then every
//! combination of phase, Held condition and BackendAvailable condition.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::helm::repo;

fn lua_health() -> PathBuf {
    crate::support::tools::tool("lua-health")
}

fn script() -> PathBuf {
    repo().join("contrib/argocd/health.lua")
}

fn run(tests: &Path) -> String {
    let out = Command::new(lua_health())
        .arg("-script")
        .arg(script())
        .arg("-tests")
        .arg(tests)
        .output()
        .expect("run lua-health");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "health.lua failed its fixtures ({}):\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_shipped_fixtures_pass_in_argo_cds_lua_engine() {
    let out = run(&repo().join("contrib/argocd/health_test.yaml"));
    assert!(out.contains(" 0 failed"), "{out}");
    assert!(
        out.contains("fencing token 9007199254740993"),
        "the token above 2^53 printed exactly:\n{out}"
    );
}

fn condition(kind: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({ "type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-11-01T10:00:00Z" })
}

/// What Argo CD must show for each phase, holder and backend.
fn expected(phase: Option<&str>, held: Option<&str>, backend: Option<&str>) -> &'static str {
    match (phase, held, backend) {
        (_, _, Some("False")) => "Degraded",
        (None, _, _) => "Progressing",
        (Some("Held"), Some("Unknown"), _) => "Degraded",
        (Some("Held"), _, _) => "Healthy",
        (Some("Pending" | "Released"), _, _) => "Progressing",
        _ => "Degraded",
    }
}

#[test]
fn every_phase_and_condition_combination_gets_the_right_health_and_a_message() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("testdata")).unwrap();
    let phases = [
        None,
        Some("Pending"),
        Some("Held"),
        Some("Released"),
        Some("Lost"),
        Some("Error"),
        Some("Unknown"),
        Some("Frozen"),
    ];
    let states = [None, Some("True"), Some("False"), Some("Unknown")];
    let mut tests = Vec::new();
    let token: u64 = (1 << 53) + 1;
    for phase in phases {
        for held in states {
            for backend in [None, Some("True"), Some("False")] {
                let mut conditions = Vec::new();
                if let Some(h) = held {
                    let message = format!("held by job-a with fencing token {token}");
                    conditions.push(condition(
                        "Held",
                        h,
                        "Acquired",
                        if h == "True" { &message } else { "" },
                    ));
                }
                if let Some(b) = backend {
                    conditions.push(condition("BackendAvailable", b, "BackendUnavailable", ""));
                }
                let mut status = json!({ "fencingToken": token, "observedGeneration": 1, "conditions": conditions });
                if let Some(p) = phase {
                    status["phase"] = json!(p);
                }
                let obj = json!({
                    "apiVersion": "targetlease.dev/v1alpha1", "kind": "TargetLease",
                    "metadata": { "name": "t", "namespace": "apps", "generation": 1 },
                    "spec": { "target": "t" }, "status": status,
                });
                let file = format!(
                    "testdata/{}-{}-{}.yaml",
                    phase.unwrap_or("none"),
                    held.unwrap_or("none"),
                    backend.unwrap_or("none")
                );
                std::fs::write(dir.path().join(&file), serde_yaml::to_string(&obj).unwrap())
                    .unwrap();
                let mut health = json!({ "status": expected(phase, held, backend) });
                if phase == Some("Held") && held == Some("True") && backend != Some("False") {
                    health["message"] =
                        json!(format!("Held: held by job-a with fencing token {token}"));
                }
                tests.push(json!({ "inputPath": file, "healthStatus": health }));
            }
        }
    }
    let file = dir.path().join("health_test.yaml");
    std::fs::write(
        &file,
        serde_yaml::to_string(&json!({ "tests": tests })).unwrap(),
    )
    .unwrap();
    let out = run(&file);
    assert!(
        out.contains(&format!("{} tests, 0 failed", tests.len())),
        "{out}"
    );
}

#[test]
fn the_install_guide_points_at_the_shipped_check_instead_of_copying_it() {
    let doc = std::fs::read_to_string(repo().join("docs/install.md")).unwrap();
    assert!(doc.contains("contrib/argocd/health.lua"));
    assert!(
        !doc.contains("hs.status ="),
        "docs/install.md carries its own copy of the check"
    );
}
