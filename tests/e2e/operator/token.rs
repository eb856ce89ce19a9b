//! `targetlease token`'s answers: a present token read once (`--wait 0s`),
//! a TargetLease that does not exist or may not be read answered as such
//! (exit 4, never `not_held`), and the token file written so that a link
//! planted in its directory cannot redirect it.

use std::process::Output;

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::PostParams;

use super::*;

fn token(kubeconfig: &std::path::Path, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_targetlease"))
        .arg("token")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE")
        .env_remove("TARGETLEASE_WAIT")
        .env_remove("TARGETLEASE_NAMESPACE")
        .output()
        .expect("run targetlease token")
}

fn printed(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "token printed no JSON ({e}): {} / {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[tokio::test]
async fn wait_0s_reads_once_and_prints_a_token_that_is_there() {
    let env = OperatorEnv::start("token-once").await;
    env.create("report", lease_for("reports").identity("nightly"))
        .await;
    let held = env.wait_phase("report", Phase::Held, SOON).await;
    let want = summary(&held).2.unwrap();
    let kubeconfig = env.cp.kubeconfig_path();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    // A link planted at a predictable temporary name (`<file>.tmp`): never followed.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join("token.tmp")).unwrap();
    for once in [&["--wait", "0s"][..], &["-n"]] {
        let started = std::time::Instant::now();
        let mut args = vec!["--lease", "report", "--identity", "nightly", "--namespace"];
        args.extend([env.ns.as_str(), "--file", file.to_str().unwrap()]);
        args.extend(once);
        let out = token(kubeconfig, &args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{once:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(started.elapsed() < Duration::from_secs(5), "{once:?}");
        let p = printed(&out);
        assert_eq!(p["outcome"], "held", "{p}");
        assert_eq!(p["fencing_token"], want, "{p}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), want.to_string());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    }
    // Text for people, the same answer.
    let out = token(
        kubeconfig,
        &[
            "--lease",
            "report",
            "--identity",
            "nightly",
            "--namespace",
            &env.ns,
            "-n",
            "-o",
            "text",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!(
            "held: TargetLease {}/report held by nightly with fencing token {want}",
            env.ns
        )),
        "{text}"
    );
    // Held, but for someone else: not_held, exit 1.
    let out = token(
        kubeconfig,
        &[
            "--lease",
            "report",
            "--identity",
            "someone-else",
            "--namespace",
            &env.ns,
            "-n",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(printed(&out)["outcome"], "not_held");
}

#[tokio::test]
async fn a_targetlease_that_is_missing_or_unreadable_is_its_own_answer() {
    let env = OperatorEnv::start("token-absent").await;
    let kubeconfig = env.cp.kubeconfig_path();
    let ask = |wait: &'static str| {
        token(
            kubeconfig,
            &[
                "--lease",
                "no-such-lease",
                "--identity",
                "nightly",
                "--namespace",
                &env.ns,
                "--wait",
                wait,
            ],
        )
    };
    let out = ask("0s");
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(printed(&out)["outcome"], "not_found");
    // Waiting does not turn it into not_held: it may still be created.
    let started = std::time::Instant::now();
    let out = ask("2s");
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(printed(&out)["outcome"], "not_found");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no such TargetLease"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A ServiceAccount with no rights on TargetLeases: forbidden, exit 4.
    env.create("report", lease_for("reports").identity("nightly"))
        .await;
    env.wait_phase("report", Phase::Held, SOON).await;
    let sas: Api<ServiceAccount> = Api::namespaced(env.cp.client(), &env.ns);
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "no-rights"}})).unwrap();
    sas.create(&PostParams::default(), &sa).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let as_sa = support::chart_identity::service_account_kubeconfig(
        env.cp,
        &env.ns,
        "no-rights",
        &env.cp.server_url(),
        dir.path(),
    )
    .await;
    let out = token(
        &as_sa,
        &["--lease", "report", "--identity", "nightly", "-n"],
    );
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = printed(&out);
    assert_eq!(p["outcome"], "forbidden", "{p}");
    assert_eq!(
        p["namespace"],
        env.ns.as_str(),
        "the kubeconfig's namespace"
    );
}
