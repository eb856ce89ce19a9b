//! `helm template`: the rules that keep two controllers from running at once
//! (replicas, election, rollout strategy), the status-write admission policy
//! under plain `helm template`, and two releases side by side.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::helm::*;

#[test]
fn several_replicas_need_leader_election() {
    // The schema refuses it first ...
    refused(
        &["--set", "leaderElection.enabled=false"],
        "at '/replicaCount': maximum: got 2, want 1",
    );
    refused(
        &["--set", "leaderElection.enabled=false,replicaCount=3"],
        "/replicaCount",
    );
    // ... and the template says why, for tools that skip the schema.
    refused(
        &[
            "--set",
            "leaderElection.enabled=false",
            "--skip-schema-validation",
        ],
        "replicaCount=2 needs leaderElection.enabled=true",
    );

    let single = template(
        "tl",
        "tl-system",
        &["--set", "leaderElection.enabled=false,replicaCount=1"],
    );
    let deploy = single.get("Deployment");
    assert_eq!(deploy["spec"]["replicas"], 1);
    assert_eq!(
        deploy["spec"]["strategy"],
        json!({ "type": "Recreate" }),
        "without election a rollout never runs two pods at once"
    );
    let elected = template("tl", "tl-system", &["--set", "replicaCount=1"]);
    assert_eq!(
        elected.get("Deployment")["spec"]["strategy"],
        json!({ "type": "RollingUpdate", "rollingUpdate": { "maxSurge": 1, "maxUnavailable": 0 } })
    );
}

#[test]
fn election_timings_reach_the_binary() {
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set",
            "leaderElection.leaseDuration=30s,leaderElection.renewDeadline=20s,leaderElection.retryPeriod=4s",
        ],
    );
    let args = r.args();
    for expected in [
        "--leader-election-duration=30s",
        "--leader-election-renew-deadline=20s",
        "--leader-election-retry-period=4s",
    ] {
        assert!(args.iter().any(|a| a == expected), "{expected} in {args:?}");
    }
    refused(
        &["--set", "leaderElection.renewDeadline=soon"],
        "/leaderElection/renewDeadline",
    );
}

#[test]
fn the_admission_policy_renders_under_plain_helm_template_unless_turned_off() {
    // No --api-versions: what `helm template` (and Argo CD without cluster
    // access) renders.
    let r = template("tl", "tl-system", &[]);
    let policy = r.policy("status-writers");
    assert_eq!(policy["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(
        policy["spec"]["matchConstraints"]["resourceRules"],
        json!([{ "apiGroups": ["targetlease.dev"], "apiVersions": ["*"],
                 "operations": ["UPDATE"], "resources": ["targetleases/status"] }])
    );
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    assert_eq!(
        policy["spec"]["validations"][0]["expression"],
        r#"request.userInfo.username in ["system:serviceaccount:tl-system:tl-targetlease"]"#
    );
    for which in ["status-writers", "pod-marks", "lease-metadata"] {
        let binding = r.policy_binding(which);
        assert_eq!(
            binding["spec"]["policyName"],
            r.policy(which)["metadata"]["name"]
        );
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        assert!(
            binding["spec"]["matchResources"].is_null(),
            "all namespaces when the operator watches all"
        );
    }
    // The lease-metadata policy judges every TargetLease write but status.
    let metadata = r.policy("lease-metadata");
    assert_eq!(metadata["spec"]["failurePolicy"], "Fail");
    assert_eq!(
        metadata["spec"]["matchConstraints"]["resourceRules"],
        json!([{ "apiGroups": ["targetlease.dev"], "apiVersions": ["*"],
                 "operations": ["CREATE", "UPDATE"], "resources": ["targetleases"] }])
    );
    assert!(
        metadata["spec"]["validations"][0]["expression"]
            .as_str()
            .unwrap()
            .starts_with("variables.bytes <= 65536 ")
    );
    let lower = template(
        "tl",
        "tl-system",
        &["--set", "admissionPolicy.maxLeaseMetadataBytes=4096"],
    );
    assert!(
        lower.policy("lease-metadata")["spec"]["validations"][0]["expression"]
            .as_str()
            .unwrap()
            .starts_with("variables.bytes <= 4096 ")
    );
    // The pod-marks policy judges only the operator's own pod updates.
    let marks = r.policy("pod-marks");
    assert_eq!(marks["spec"]["failurePolicy"], "Fail");
    assert_eq!(
        marks["spec"]["matchConditions"],
        json!([{ "name": "the-operator",
                 "expression": r#"request.userInfo.username == "system:serviceaccount:tl-system:tl-targetlease""# }])
    );
    assert_eq!(
        marks["spec"]["matchConstraints"]["resourceRules"],
        json!([{ "apiGroups": [""], "apiVersions": ["v1"],
                 "operations": ["UPDATE"], "resources": ["pods"] }])
    );

    // Scoped to the watched namespace; extra identities allowed on request.
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set",
            "operator.watchNamespace=apps,admissionPolicy.extraAllowedUsers[0]=break-glass",
        ],
    );
    for which in ["status-writers", "pod-marks", "lease-metadata"] {
        assert_eq!(
            r.policy_binding(which)["spec"]["matchResources"],
            json!({ "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": "apps" } } })
        );
    }
    assert_eq!(
        r.policy("status-writers")["spec"]["validations"][0]["expression"],
        r#"request.userInfo.username in ["system:serviceaccount:tl-system:tl-targetlease","break-glass"]"#
    );

    let r = template(
        "tl",
        "tl-system",
        &["--set", "admissionPolicy.enabled=false"],
    );
    assert!(r.find("ValidatingAdmissionPolicy").is_none());
    assert!(r.find("ValidatingAdmissionPolicyBinding").is_none());
}

fn cluster_scoped_names(r: &Rendered) -> BTreeSet<(String, String)> {
    r.0.iter()
        .filter(|d| d["metadata"]["namespace"].is_null())
        .map(|d| {
            let s = |v: &Value| v.as_str().unwrap().to_string();
            (s(&d["kind"]), s(&d["metadata"]["name"]))
        })
        .collect()
}

/// Two releases, each watching its own namespace: cluster-scoped objects
/// never shared, each policy binding only its own namespace, each policy
/// allowing its own operator.
fn assert_side_by_side(first: (&str, &str), second: (&str, &str)) {
    let render = |(release, ns): (&str, &str)| {
        let watch = format!("operator.watchNamespace={ns}");
        template(release, ns, &["--set", &watch])
    };
    let (a, b) = (render(first), render(second));
    let (names_a, names_b) = (cluster_scoped_names(&a), cluster_scoped_names(&b));
    assert_eq!(names_a.len(), 9, "{names_a:?}"); // with the read-only view role
    assert!(
        names_a.is_disjoint(&names_b),
        "{first:?} and {second:?} share {:?}",
        names_a.intersection(&names_b).collect::<Vec<_>>()
    );
    for (r, (_, ns)) in [(&a, first), (&b, second)] {
        let binding = r.policy_binding("status-writers");
        assert_eq!(
            binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"],
            json!({ "kubernetes.io/metadata.name": ns }),
            "the policy of the release in {ns} binds only {ns}"
        );
        let sa = r.get("ServiceAccount")["metadata"]["name"]
            .as_str()
            .unwrap();
        assert_eq!(
            r.policy("status-writers")["spec"]["validations"][0]["expression"],
            format!(r#"request.userInfo.username in ["system:serviceaccount:{ns}:{sa}"]"#)
        );
        // Watching one namespace: RBAC there and in the release namespace
        // only, nothing cluster-wide.
        assert!(r.find("ClusterRoleBinding").is_none());
        let bindings: Vec<_> = r.0.iter().filter(|d| d["kind"] == "RoleBinding").collect();
        assert_eq!(
            bindings.len(),
            2,
            "the watched namespace's and the release's"
        );
        for b in bindings {
            assert_eq!(
                b["subjects"],
                json!([{ "kind": "ServiceAccount", "name": sa, "namespace": ns }])
            );
            assert_eq!(b["roleRef"]["kind"], "Role");
        }
    }
}

#[test]
fn two_releases_share_no_cluster_scoped_name_and_no_policy_scope() {
    assert_side_by_side(("tl", "team-a"), ("tl", "team-b"));
    assert_side_by_side(("alpha", "team-a"), ("beta", "team-b"));
}

/// `admissionPolicy.namespaceSelector` narrows where the chart's policies on
/// TargetLeases apply, and nothing else: the operator still watches every
/// namespace (and the pod-marks policy still covers every pod it may patch),
/// with its cluster-wide role, so a namespace left out of the selector has
/// its TargetLeases served without the policies' protection (docs/operator.md,
/// "What a tenant can reach"). Only `operator.watchNamespace` narrows what
/// the operator watches and may touch.
#[test]
fn a_namespace_selector_narrows_the_policies_not_what_the_operator_watches() {
    let selector = json!({ "matchLabels": { "tenants": "yes" } });
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set-json",
            &format!("admissionPolicy.namespaceSelector={selector}"),
        ],
    );
    for which in ["status-writers", "lease-metadata"] {
        assert_eq!(
            r.policy_binding(which)["spec"]["matchResources"]["namespaceSelector"],
            selector,
            "{which}"
        );
    }
    // The operator may patch pods wherever it watches: their policy
    // follows it, not the selector.
    assert!(r.policy_binding("pod-marks")["spec"]["matchResources"].is_null());
    assert!(
        !r.args().iter().any(|a| a.starts_with("--watch-namespace")),
        "{:?}",
        r.args()
    );
    assert!(
        r.find("ClusterRoleBinding").is_some(),
        "the operator keeps its cluster-wide role"
    );
}
