//! Pods: elections, pod-tied holders, the examples, and the token reaching its holder.

use super::*;

/// (leader label, token annotation) of web-leader's marks on a pod.
async fn leader_marks(env: &OperatorEnv, name: &str) -> (Option<String>, Option<String>) {
    let (label, token, _) = env.marks(name, "web-leader").await;
    (label, token)
}

#[tokio::test]
async fn leader_election_marks_one_ready_pod_and_fails_over_with_larger_tokens() {
    let env = OperatorEnv::start("election").await;
    for (i, name) in ["web-0", "web-1", "web-2"].into_iter().enumerate() {
        let _ = i;
        env.create_pod(name, &[("app", "web"), WEB_LEADER_CANDIDATE], true)
            .await;
        tokio::time::sleep(Duration::from_millis(1100)).await; // distinct creation times
    }
    let applied = apply_example(&env, "leader-election.yaml").await;
    assert!(
        applied
            .iter()
            .any(|(k, n)| k == "TargetLease" && n == "web-leader")
    );

    let tl = env
        .wait_for("web-leader", "led by web-0", SOON, |tl| {
            summary(tl) == (Some(Phase::Held), Some("web-0".into()), Some(1))
        })
        .await;
    let token = summary(&tl).2.unwrap().to_string();
    let marks = support::kube_env::eventually("web-0 marked", SOON, || async {
        let m = leader_marks(&env, "web-0").await;
        (m.0.is_some() && m.1.is_some()).then_some(m)
    })
    .await;
    assert_eq!(marks, (Some("true".into()), Some(token)));
    assert_eq!(
        leader_marks(&env, "web-1").await,
        (None, None),
        "followers carry no marks"
    );

    // The leader pod goes away: the lease moves to the next Ready pod, larger token.
    env.pods()
        .delete("web-0", &Default::default())
        .await
        .unwrap();
    env.wait_led_by("web-leader", "web-1", 2, SOON).await;

    // The leader stops being Ready: its marks go first, then the lease moves.
    env.set_ready("web-1", false).await;
    env.wait_for("web-leader", "led by web-2", SOON, |tl| {
        summary(tl) == (Some(Phase::Held), Some("web-2".into()), Some(3))
    })
    .await;
    assert_eq!(
        leader_marks(&env, "web-1").await,
        (None, None),
        "old leader unmarked"
    );
    // Marks follow the status that names the pod.
    support::kube_env::eventually("web-2 marked", SOON, || async {
        (leader_marks(&env, "web-2").await == (Some("true".into()), Some("3".into()))).then_some(())
    })
    .await;

    // No Ready candidate at all: Pending, and nobody is marked.
    env.set_ready("web-2", false).await;
    let pending = env
        .wait_reason("web-leader", "NoReadyCandidate", SOON)
        .await;
    assert_eq!(summary(&pending).0, Some(Phase::Pending));
    let held = condition(&pending, "Held").unwrap();
    assert_eq!(held.reason, "NoReadyCandidate");
    assert_eq!(leader_marks(&env, "web-2").await, (None, None));
}

#[tokio::test]
async fn the_job_lease_example_holds_one_and_queues_the_other() {
    let env = OperatorEnv::start("example-job").await;
    apply_example(&env, "job-lease.yaml").await;
    let first = env.wait_phase("orders-db-job-1", Phase::Held, SOON).await;
    assert_eq!(summary(&first).1.as_deref(), Some("migration-2026-11"));
    env.wait_phase("orders-db-job-2", Phase::Pending, SOON)
        .await;
    env.delete("orders-db-job-1").await;
    let second = env
        .wait_phase("orders-db-job-2", Phase::Held, Duration::from_secs(10))
        .await;
    assert!(summary(&second).2 > summary(&first).2);
}

#[tokio::test]
async fn a_holder_tied_to_a_pod_follows_its_readiness() {
    let env = OperatorEnv::start("pod-holder").await;
    env.create_pod(
        "worker",
        &[("app", "web"), ("tied.targetlease.dev/candidate", "true")],
        false,
    )
    .await;
    env.create("tied", lease_for("t").identity("worker").pod("worker"))
        .await;
    let pending = env.wait_reason("tied", "PodNotReady", SOON).await;
    assert_eq!(summary(&pending).0, Some(Phase::Pending));
    let held = condition(&pending, "Held").unwrap();
    assert_eq!(held.reason, "PodNotReady");
    env.set_ready("worker", true).await;
    env.wait_phase("tied", Phase::Held, SOON).await;
    env.pods()
        .delete("worker", &Default::default())
        .await
        .unwrap();
    // Held is withdrawn first (Pending, the release still to confirm), then
    // the lease is released.
    env.wait_for("tied", "Pending, its release confirmed", SOON, |tl| {
        tl.status.as_ref().is_some_and(|s| {
            s.phase == Some(Phase::Pending) && s.releasing_acquisition_id.is_none()
        })
    })
    .await;
    let store = env.store().await;
    let got = store.get(&Target::new(&env.ns, "t")).await.unwrap();
    assert_eq!(
        got.outcome,
        Outcome::NotFound,
        "the lease was released when its pod went away"
    );
}

/// `targetlease token` as the example's init container runs it: the Job's
/// ServiceAccount with read-only access to TargetLeases gets the token.
#[tokio::test]
async fn the_token_subcommand_hands_a_job_its_token_with_read_only_rights() {
    let env = OperatorEnv::start("token").await;
    // The RoleBinding names the ServiceAccount's namespace, as a user edits it.
    let text = support::operator_env::example("job-with-token.yaml")
        .replace("namespace: default", &format!("namespace: {}", env.ns));
    support::operator_env::apply_yaml(&env, &text, "job-with-token.yaml").await;
    let held = env.wait_phase("nightly-report", Phase::Held, SOON).await;
    let token = summary(&held).2.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = support::chart_identity::service_account_kubeconfig(
        env.cp,
        &env.ns,
        "nightly-report",
        &env.cp.server_url(),
        dir.path(),
    )
    .await;
    let file = dir.path().join("token");
    let token_cmd = |identity: &str, wait: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_targetlease"))
            .args(["token", "--lease", "nightly-report", "--identity", identity])
            .args(["--wait", wait, "--file"])
            .arg(&file)
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .output()
            .expect("run targetlease token")
    };
    let out = token_cmd("nightly-report", "20s");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["outcome"], "held");
    assert_eq!(printed["fencing_token"], token);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), token.to_string());
    // Not held for another identity: exit 1 once the wait is over, and an empty file.
    let out = token_cmd("someone-else", "1s");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "");
}

/// `targetlease token --follow` as a sidecar: the file always matches what
/// status publishes for this pod, and is empty while the lease is not held.
#[tokio::test]
async fn the_token_sidecar_keeps_its_file_true_to_status() {
    let env = OperatorEnv::start("token-follow").await;
    env.create_pod(
        "worker",
        &[
            ("app", "worker"),
            ("tied.targetlease.dev/candidate", "true"),
        ],
        true,
    )
    .await;
    env.create(
        "tied",
        lease_for("t")
            .identity("worker")
            .pod("worker")
            .durations("6s", "2s"),
    )
    .await;
    env.wait_phase("tied", Phase::Held, SOON).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    let mut sidecar = std::process::Command::new(env!("CARGO_BIN_EXE_targetlease"))
        .args([
            "token",
            "--lease",
            "tied",
            "--namespace",
            &env.ns,
            "--pod",
            "worker",
        ])
        .args(["--follow", "--file"])
        .arg(&file)
        .env("KUBECONFIG", env.cp.kubeconfig_path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the sidecar");
    let content = |want: &'static str| {
        let file = file.clone();
        async move { (std::fs::read_to_string(&file).ok()? == want).then_some(()) }
    };
    support::kube_env::eventually("token 1 in the file", SOON, || content("1")).await;
    env.set_ready("worker", false).await;
    support::kube_env::eventually("an empty file while not held", SOON, || content("")).await;
    env.set_ready("worker", true).await;
    support::kube_env::eventually("token 2 in the file", SOON, || content("2")).await;
    let _ = sidecar.kill();
    let _ = sidecar.wait();
}

/// `targetlease token --pod-uid` (POD_UID from the downward API): the token
/// goes only to the incarnation of the pod that status names. A pod
/// recreated under the same name gets nothing until the operator has tied a
/// new lease to it.
#[tokio::test]
async fn the_token_subcommand_refuses_another_incarnation_of_its_pod() {
    let env = OperatorEnv::start("token-uid").await;
    env.create_pod(
        "worker",
        &[
            ("app", "worker"),
            ("tied.targetlease.dev/candidate", "true"),
        ],
        true,
    )
    .await;
    env.create("tied", lease_for("t").identity("worker").pod("worker"))
        .await;
    let held = env.wait_phase("tied", Phase::Held, SOON).await;
    let status = held.status.unwrap();
    let uid = status.holder_pod_uid.clone().expect("holderPodUid");
    let token_cmd = |pod_uid: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_targetlease"))
            .args(["token", "--lease", "tied", "--namespace", &env.ns])
            .args(["--pod", "worker", "--wait", "1s"])
            .env("POD_UID", pod_uid)
            .env("KUBECONFIG", env.cp.kubeconfig_path())
            .env_remove("POD_NAME")
            .output()
            .expect("run targetlease token")
    };
    let out = token_cmd(&uid);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["fencing_token"], status.fencing_token.unwrap());

    let out = token_cmd("the-uid-of-a-pod-recreated-under-this-name");
    assert_eq!(out.status.code(), Some(1), "not this incarnation's token");
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["outcome"], "not_held");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("another incarnation"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
