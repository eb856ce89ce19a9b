//! The chart's RBAC with `operator.watchNamespace`, on a real API server:
//! namespaced, each Role where it must be, and enough for the operator.

use kube::api::Api;
use serde_json::json;

use crate::cluster::{SOON, install_identity_watching, service_account_kubeconfig};
use crate::support::kube_env::{ControlPlane, eventually};
use crate::support::operator_env::summary;

/// `kubectl auth can-i VERB RESOURCE` as `user`, with `scope` (`-n NS` or
/// `--all-namespaces`), against the real API server: "yes" or "no".
fn can_i(cp: &ControlPlane, user: &str, verb: &str, resource: &str, scope: &[&str]) -> bool {
    let out = std::process::Command::new(crate::support::tools::tool("kubectl"))
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args(["auth", "can-i", verb, resource, "--as", user])
        .args(scope)
        .output()
        .expect("kubectl auth can-i");
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        answer == "yes" || answer == "no",
        "kubectl auth can-i {verb} {resource} {scope:?}: {answer:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    answer == "yes"
}

/// With `operator.watchNamespace`, the chart's RBAC gives the operator what it
/// needs in the watched namespace (and the release namespace) and nothing
/// anywhere else: no cluster-wide pod access, no pods, Secrets or
/// TargetLeases of other namespaces. The release is installed in a namespace
/// of its own, so each Role must land in the right one: the operator, with
/// only this RBAC, holds a lease of the watched namespace and writes its
/// floor in the release namespace.
#[tokio::test]
async fn an_operator_watching_one_namespace_has_no_cluster_wide_permission() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use targetlease::operator::crd::Phase;

    let mut env =
        crate::support::operator_env::OperatorEnv::start_without_operator("chart-scoped").await;
    let cp = env.cp;
    let ns = env.ns.clone();
    let home = cp.namespace("chart-home").await;
    let elsewhere = cp.namespace("chart-elsewhere").await;
    let release = install_identity_watching(cp, &format!("{home}-r"), &home, &ns).await;
    let user = format!("system:serviceaccount:{home}:{}", release.service_account);

    // Each Role and RoleBinding where it must be: the workloads' in the
    // watched namespace, bound to the ServiceAccount of the release
    // namespace; the floors', leader election's and key's in the release
    // namespace.
    let in_ns = |kind: &str, of: &str| -> Vec<String> {
        release
            .rendered
            .0
            .iter()
            .filter(|d| d["kind"] == kind && d["metadata"]["namespace"] == of)
            .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let workloads = in_ns("Role", &ns);
    let own = in_ns("Role", &home);
    assert_eq!(
        (workloads.len(), own.len()),
        (1, 1),
        "{workloads:?} {own:?}"
    );
    assert_eq!(in_ns("RoleBinding", &ns), workloads);
    assert_eq!(in_ns("RoleBinding", &home), own);
    let roles = |n: &str| Api::<Role>::namespaced(cp.client(), n);
    let bindings = |n: &str| Api::<RoleBinding>::namespaced(cp.client(), n);
    let role = roles(&ns)
        .get(&workloads[0])
        .await
        .expect("workloads Role in the watched namespace");
    assert!(
        role.rules.unwrap().iter().any(|r| r
            .resources
            .as_ref()
            .is_some_and(|x| x.contains(&"pods".to_string()))),
        "the watched namespace's Role grants pods"
    );
    assert!(roles(&home).get_opt(&workloads[0]).await.unwrap().is_none());
    let binding = bindings(&ns)
        .get(&workloads[0])
        .await
        .expect("its RoleBinding");
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(
        (subject.name.as_str(), subject.namespace.as_deref()),
        (release.service_account.as_str(), Some(home.as_str()))
    );
    roles(&home)
        .get(&own[0])
        .await
        .expect("the release's Role in its namespace");
    bindings(&home).get(&own[0]).await.expect("its RoleBinding");
    assert!(roles(&ns).get_opt(&own[0]).await.unwrap().is_none());

    let here = ["-n", ns.as_str()];
    let at_home = ["-n", home.as_str()];
    let there = ["-n", elsewhere.as_str()];
    let everywhere = ["--all-namespaces"];
    eventually("the chart's RBAC to be in force", SOON, || async {
        can_i(cp, &user, "list", "pods", &here).then_some(())
    })
    .await;
    for (verb, resource) in [
        ("list", "pods"),
        ("watch", "pods"),
        ("patch", "pods"),
        ("list", "targetleases.targetlease.dev"),
        ("patch", "targetleases.targetlease.dev/status"),
        ("create", "events.events.k8s.io"),
    ] {
        assert!(
            can_i(cp, &user, verb, resource, &here),
            "{verb} {resource} in {ns}"
        );
        for (scope, name) in [(&there, &elsewhere), (&at_home, &home)] {
            assert!(
                !can_i(cp, &user, verb, resource, scope),
                "{verb} {resource} in {name}"
            );
        }
        assert!(
            !can_i(cp, &user, verb, resource, &everywhere),
            "{verb} {resource} cluster-wide"
        );
    }
    for (verb, resource) in [("get", "secrets"), ("list", "configmaps"), ("get", "pods")] {
        assert!(
            !can_i(cp, &user, verb, resource, &there),
            "{verb} {resource} in {elsewhere}"
        );
    }
    assert!(can_i(cp, &user, "create", "configmaps", &at_home));
    assert!(!can_i(cp, &user, "create", "configmaps", &here));

    // The operator works with exactly this: a lease of the watched namespace
    // is held, and its deletion leaves its floor in the release namespace.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig =
        service_account_kubeconfig(cp, &home, &release.service_account, dir.path()).await;
    let chart_args: Vec<String> = release
        .rendered
        .args()
        .into_iter()
        .filter(|a| {
            a.starts_with("--floor-configmap")
                || a == "--leader-election"
                || a.starts_with("--leader-election-lease")
        })
        .collect();
    assert_eq!(chart_args.len(), 3, "{chart_args:?}");
    let floors = chart_args
        .iter()
        .find_map(|a| a.strip_prefix("--floor-configmap="))
        .expect("the floor ConfigMaps' name")
        .to_string();
    env.release_namespace = Some(home.clone());
    env.run_operators_as(kubeconfig);
    let extra: Vec<&str> = chart_args.iter().map(String::as_str).collect();
    env.start_operator_with(&extra);
    env.create(
        "job",
        json!({ "target": "db", "holder": { "identity": "job" } }),
    )
    .await;
    let held = env.wait_phase("job", Phase::Held, SOON).await;
    assert_eq!(summary(&held).2, Some(1), "{:?}", env.operator_log(0));
    env.delete("job").await;
    env.wait_gone("job", SOON).await;
    let floor = format!("{floors}.{ns}");
    let cm = Api::<ConfigMap>::namespaced(cp.client(), &home)
        .get(&floor)
        .await
        .unwrap_or_else(|e| panic!("the floor {floor} in {home}: {e}"));
    let key = targetlease::operator::floor::floor_key(&ns, "db");
    let data = cm.data.unwrap_or_default();
    assert_eq!(
        targetlease::operator::floor::ledger::floor_in(&data, &key),
        1,
        "{data:?}"
    );
}
