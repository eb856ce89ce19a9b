//! The operator end to end: the real `targetlease operator` binary against a
//! real kube-apiserver + etcd and a real valkey-server.

mod support {
    pub mod chart_identity;
    pub mod kube_env;
    pub mod operator_env;
    pub mod resp;
    pub mod valkey_server;
}

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::operator_env::{OperatorEnv, apply_example, summary};
use targetlease::crd::Phase;
use targetlease::store::{AcquireRequest, LeaseStore, Outcome, ReleaseRequest, Target};

const SOON: Duration = Duration::from_secs(20);

fn holder_spec(target: &str, identity: &str) -> serde_json::Value {
    json!({ "target": target, "holder": { "identity": identity } })
}

#[tokio::test]
async fn applied_lease_is_held_with_a_token_from_valkey() {
    let env = OperatorEnv::start("held").await;
    env.create("job-a", holder_spec("db-migration", "job-a"))
        .await;
    let tl = env.wait_phase("job-a", Phase::Held, SOON).await;
    let st = tl.status.clone().unwrap();
    assert_eq!(st.holder.as_deref(), Some("job-a"));
    assert_eq!(st.fencing_token, Some(1));
    assert!(st.acquired_at.is_some() && st.expires_at.is_some());
    assert_eq!(st.observed_generation, tl.metadata.generation);
    assert!(
        tl.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"targetlease.dev/release".to_string())
    );
    let held = st.conditions.iter().find(|c| c.type_ == "Held").unwrap();
    assert_eq!(held.status, "True");

    // Valkey agrees, and the published expiry is no later than Valkey's.
    let store = env.store().await;
    let got = store
        .get(&Target::new(&env.ns, "db-migration"))
        .await
        .unwrap();
    assert_eq!(got.outcome, Outcome::Found);
    let lease = got.lease.unwrap();
    assert_eq!(lease.owner, "job-a");
    assert_eq!(lease.fencing_token, 1);
    let published = st.expires_at.unwrap().0.as_millisecond() as u64;
    assert!(published <= lease.expires_at_ms);
}

#[tokio::test]
async fn deleting_the_resource_releases_the_lease() {
    let env = OperatorEnv::start("release").await;
    env.create("job-a", holder_spec("t", "job-a")).await;
    env.wait_phase("job-a", Phase::Held, SOON).await;
    env.delete("job-a").await;
    env.wait_gone("job-a", SOON).await;
    let store = env.store().await;
    let got = store.get(&Target::new(&env.ns, "t")).await.unwrap();
    assert_eq!(
        got.outcome,
        Outcome::NotFound,
        "finalizer released the lease in Valkey"
    );
}

#[tokio::test]
async fn two_leases_on_one_target_hand_off_in_creation_order() {
    let env = OperatorEnv::start("handoff").await;
    env.create("first", holder_spec("shared", "first")).await;
    env.wait_phase("first", Phase::Held, SOON).await;
    env.create("second", holder_spec("shared", "second")).await;
    env.create("third", holder_spec("shared", "third")).await;
    let second = env.wait_phase("second", Phase::Pending, SOON).await;
    env.wait_phase("third", Phase::Pending, SOON).await;
    assert_eq!(
        summary(&env.api().get("first").await.unwrap()).0,
        Some(Phase::Held)
    );
    assert_eq!(second.status.unwrap().holder, None);

    // The default lease lives 90s: getting it within seconds proves the waiter
    // was woken by the release, not by expiry or polling.
    env.delete("first").await;
    let second = env
        .wait_phase("second", Phase::Held, Duration::from_secs(10))
        .await;
    assert_eq!(
        summary(&second),
        (Some(Phase::Held), Some("second".into()), Some(2))
    );
    let third = env.api().get("third").await.unwrap();
    assert_eq!(
        summary(&third).0,
        Some(Phase::Pending),
        "third waits behind second"
    );

    env.delete("second").await;
    let third = env
        .wait_phase("third", Phase::Held, Duration::from_secs(10))
        .await;
    assert_eq!(summary(&third).2, Some(3));
}

#[tokio::test]
async fn a_waiter_gets_the_target_when_an_outside_holder_lets_go() {
    let env = OperatorEnv::start("outside").await;
    let store = env.store().await;
    let target = Target::new(&env.ns, "external");
    let outside = store
        .acquire(&AcquireRequest::new(
            target.clone(),
            "cron",
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    let lease = outside.lease.unwrap();
    env.create("waiter", holder_spec("external", "waiter"))
        .await;
    let pending = env.wait_reason("waiter", "TargetHeld", SOON).await;
    assert_eq!(summary(&pending).0, Some(Phase::Pending));
    let held = pending
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Held")
        .unwrap();
    assert_eq!(held.reason, "TargetHeld");
    assert!(held.message.contains("cron"), "{}", held.message);

    // The outside holder releases long before its 60s expiry: the waiter is woken.
    let released = store
        .release(&ReleaseRequest::new(
            target.clone(),
            lease.handle().unwrap(),
        ))
        .await
        .unwrap();
    assert_eq!(released.outcome, Outcome::Released);
    let tl = env
        .wait_phase("waiter", Phase::Held, Duration::from_secs(10))
        .await;
    assert_eq!(summary(&tl).2, Some(2));
}

#[tokio::test]
async fn a_waiter_retries_when_an_outside_lease_expires() {
    let env = OperatorEnv::start("outside-expiry").await;
    let store = env.store().await;
    let target = Target::new(&env.ns, "external");
    let outside = store
        .acquire(&AcquireRequest::new(
            target.clone(),
            "cron",
            Duration::from_secs(4),
        ))
        .await
        .unwrap();
    assert_eq!(outside.outcome, Outcome::Acquired);
    env.create("next", holder_spec("external", "next")).await;
    env.wait_phase("next", Phase::Pending, SOON).await;
    // Expiry publishes nothing; the waiter retries right after the holder's expiry.
    let tl = env
        .wait_phase("next", Phase::Held, Duration::from_secs(10))
        .await;
    assert_eq!(summary(&tl).2, Some(2));
}

#[tokio::test]
async fn invalid_specs_are_refused_by_the_api_server() {
    let env = OperatorEnv::start("invalid").await;
    let api = env.api();
    let cases = [
        (
            json!({ "target": "t" }),
            "exactly one of spec.holder or spec.candidates",
        ),
        (
            json!({ "target": "t", "holder": {"identity": "a"}, "candidates": {"podSelector": {}} }),
            "exactly one of spec.holder or spec.candidates",
        ),
        (
            json!({ "target": "", "holder": {"identity": "a"} }),
            "spec.target",
        ),
        (
            json!({ "target": "t", "holder": {"identity": "a"}, "leaseDuration": "0s" }),
            "between 1s and 24h",
        ),
        (
            json!({ "target": "t", "holder": {"identity": "a"}, "leaseDuration": "25h" }),
            "between 1s and 24h",
        ),
        (
            json!({ "target": "t", "holder": {"identity": "a"}, "leaseDuration": "1.5s" }),
            "spec.leaseDuration",
        ),
        (
            json!({ "target": "t", "holder": {"identity": "a"}, "leaseDuration": "10s", "renewInterval": "10s" }),
            "renewInterval must be at most half",
        ),
        (
            json!({ "target": "t", "holder": {"identity": "a"}, "leaseDuration": "10s", "maxLifetime": "5s" }),
            "maxLifetime must be at least",
        ),
        (
            json!({ "target": "t", "holder": {"identity": "a"}, "leaseDuration": "10s", "renewInterval": "6s" }),
            "renewInterval must be at most half",
        ),
        (
            json!({ "target": "t", "candidates": {"podSelector": {}} }),
            "podSelector must not be empty",
        ),
        (
            json!({ "target": "a\u{1}b", "holder": {"identity": "a"} }),
            "spec.target",
        ),
        (
            json!({ "target": "t", "holder": {"identity": "a\u{85}b"} }),
            "spec.holder.identity",
        ),
        (
            // 129 characters, 258 bytes: the store counts bytes, so admission does too.
            json!({ "target": "é".repeat(129), "holder": {"identity": "a"} }),
            "at most 256 bytes",
        ),
    ];
    for (i, (spec, expected)) in cases.into_iter().enumerate() {
        let obj = json!({
            "apiVersion": "targetlease.dev/v1alpha1",
            "kind": "TargetLease",
            "metadata": { "name": format!("bad-{i}") },
            "spec": spec,
        });
        // Created as JSON: an apply patch is read as YAML, which folds U+0085 into a space.
        let obj: targetlease::crd::TargetLease = serde_json::from_value(obj).unwrap();
        let err = api
            .create(&Default::default(), &obj)
            .await
            .expect_err(&format!("case {i} must be refused"));
        let text = err.to_string();
        assert!(text.contains(expected), "case {i}: {text}");
    }

    // The name prefixes the pod mark keys, so it is bounded.
    let long = "n".repeat(238);
    let obj = json!({
        "apiVersion": "targetlease.dev/v1alpha1",
        "kind": "TargetLease",
        "metadata": { "name": long },
        "spec": { "target": "t", "holder": {"identity": "a"} },
    });
    let err = api
        .patch(&long, &PatchParams::apply("tests"), &Patch::Apply(&obj))
        .await
        .expect_err("a 238-character name must be refused");
    assert!(err.to_string().contains("at most 237 characters"), "{err}");

    // The target is immutable.
    env.create("ok", holder_spec("t", "a")).await;
    let change = json!({ "spec": { "target": "other" } });
    let err = api
        .patch("ok", &PatchParams::default(), &Patch::Merge(&change))
        .await
        .expect_err("changing the target must be refused");
    assert!(
        err.to_string().contains("spec.target is immutable"),
        "{err}"
    );
}

#[tokio::test]
async fn a_restarted_operator_re_adopts_leases_without_new_tokens_or_status_writes() {
    let mut env = OperatorEnv::start("restart").await;
    env.create(
        "job",
        json!({ "target": "t", "holder": {"identity": "job"}, "leaseDuration": "30s", "renewInterval": "10s" }),
    )
    .await;
    let before = env.wait_phase("job", Phase::Held, SOON).await;
    let store = env.store().await;
    let target = Target::new(&env.ns, "t");
    let valkey_before = store.get(&target).await.unwrap().lease.unwrap();

    env.kill_operator(0);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    env.start_operator();
    // The new process renews at once (it has no memory of the last renewal).
    let renewed = support::kube_env::eventually("the new operator to renew", SOON, || {
        let store = &store;
        let target = &target;
        let floor = valkey_before.expires_at_ms;
        async move {
            let l = store.get(target).await.ok()?.lease?;
            (l.expires_at_ms > floor).then_some(l)
        }
    })
    .await;
    assert_eq!(
        renewed.fencing_token, valkey_before.fencing_token,
        "no new token"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = env.api().get("job").await.unwrap();
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "re-adoption wrote no status"
    );
    assert_eq!(summary(&after), summary(&before));
}

#[tokio::test]
async fn tokens_keep_increasing_after_valkey_forgets_everything() {
    let env = OperatorEnv::start("flush").await;
    env.create(
        "job",
        json!({ "target": "t", "holder": {"identity": "job"}, "leaseDuration": "6s", "renewInterval": "1s" }),
    )
    .await;
    let held = env.wait_phase("job", Phase::Held, SOON).await;
    assert_eq!(summary(&held).2, Some(1));

    env.valkey.conn().cmd(&["FLUSHALL"]);
    // The next renewal finds nothing; the operator reacquires above the published token.
    let again = env
        .wait_for("job", "Held with token 2", SOON, |tl| {
            summary(tl) == (Some(Phase::Held), Some("job".into()), Some(2))
        })
        .await;
    assert_eq!(summary(&again).2, Some(2));

    // A deleted lease leaves its token behind in the floor ConfigMap.
    env.delete("job").await;
    env.wait_gone("job", SOON).await;
    env.valkey.conn().cmd(&["FLUSHALL"]);
    env.create("next", holder_spec("t", "next")).await;
    let next = env.wait_phase("next", Phase::Held, SOON).await;
    assert_eq!(
        summary(&next).2,
        Some(3),
        "token above every token published before"
    );
}

#[tokio::test]
async fn valkey_down_sets_a_condition_and_recovers() {
    let mut env = OperatorEnv::start("down").await;
    env.create(
        "job",
        json!({ "target": "t", "holder": {"identity": "job"}, "leaseDuration": "6s", "renewInterval": "1s" }),
    )
    .await;
    env.wait_phase("job", Phase::Held, SOON).await;
    env.valkey.kill();
    let down = env
        .wait_for("job", "BackendAvailable=False", SOON, |tl| {
            tl.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "BackendAvailable" && c.status == "False")
            })
        })
        .await;
    assert_ne!(summary(&down).0, Some(Phase::Error));
    env.valkey.restart();
    // The restarted server lost everything (no persistence): a new lease, a larger token.
    let back = env
        .wait_for(
            "job",
            "Held again with BackendAvailable=True",
            Duration::from_secs(40),
            |tl| {
                tl.status.as_ref().is_some_and(|s| {
                    s.phase == Some(Phase::Held)
                        && s.fencing_token == Some(2)
                        && s.conditions
                            .iter()
                            .any(|c| c.type_ == "BackendAvailable" && c.status == "True")
                })
            },
        )
        .await;
    assert_eq!(summary(&back).1.as_deref(), Some("job"));
}

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
        env.create_pod(name, &[("app", "web")], true).await;
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
    env.wait_for("web-leader", "led by web-1", SOON, |tl| {
        summary(tl) == (Some(Phase::Held), Some("web-1".into()), Some(2))
    })
    .await;
    support::kube_env::eventually("web-1 marked", SOON, || async {
        (leader_marks(&env, "web-1").await == (Some("true".into()), Some("2".into()))).then_some(())
    })
    .await;

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
    let held = pending
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Held")
        .unwrap();
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
    env.create_pod("worker", &[("app", "web")], false).await;
    env.create(
        "tied",
        json!({ "target": "t", "holder": { "identity": "worker", "podName": "worker" } }),
    )
    .await;
    let pending = env.wait_reason("tied", "PodNotReady", SOON).await;
    assert_eq!(summary(&pending).0, Some(Phase::Pending));
    let held = pending
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Held")
        .unwrap();
    assert_eq!(held.reason, "PodNotReady");
    env.set_ready("worker", true).await;
    env.wait_phase("tied", Phase::Held, SOON).await;
    env.pods()
        .delete("worker", &Default::default())
        .await
        .unwrap();
    env.wait_phase("tied", Phase::Pending, SOON).await;
    let store = env.store().await;
    let got = store.get(&Target::new(&env.ns, "t")).await.unwrap();
    assert_eq!(
        got.outcome,
        Outcome::NotFound,
        "the lease was released when its pod went away"
    );
}

fn kubectl(env: &OperatorEnv, args: &[&str]) -> String {
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(env.cp.kubeconfig_path())
        .args(args)
        .output()
        .expect("kubectl is on the machine");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn kubectl_shows_the_columns_explains_every_field_and_lists_events() {
    let env = OperatorEnv::start("kubectl").await;
    env.create("job", holder_spec("reports", "nightly")).await;
    env.wait_phase("job", Phase::Held, SOON).await;

    let table = kubectl(&env, &["get", "tl", "-n", &env.ns]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "TARGET", "HOLDER", "TOKEN", "PHASE", "AGE"]
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..5], ["job", "reports", "nightly", "1", "Held"]);

    let explain = kubectl(&env, &["explain", "targetlease.spec"]);
    for field in [
        "target",
        "holder",
        "candidates",
        "leaseDuration",
        "renewInterval",
        "maxLifetime",
    ] {
        assert!(
            explain.contains(field),
            "kubectl explain lacks {field}:\n{explain}"
        );
    }
    assert!(explain.contains("Immutable"), "{explain}");
    let status = kubectl(&env, &["explain", "targetlease.status.fencingToken"]);
    assert!(status.contains("strictly greater"), "{status}");

    let events = kubectl(&env, &["get", "events", "-n", &env.ns, "-o", "wide"]);
    assert!(
        events
            .lines()
            .any(|l| l.contains("Acquired") && l.contains("targetlease/job")),
        "no Acquired event:\n{events}"
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
    let held = env.wait_phase("orders-db-report", Phase::Held, SOON).await;
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
            .args([
                "token",
                "--lease",
                "orders-db-report",
                "--identity",
                identity,
            ])
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
    env.create_pod("worker", &[("app", "worker")], true).await;
    env.create(
        "tied",
        json!({ "target": "t", "holder": { "identity": "worker", "podName": "worker" },
                "leaseDuration": "6s", "renewInterval": "2s" }),
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
