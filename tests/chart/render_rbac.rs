//! The chart's RBAC: exactly the verbs the operator uses, cluster-wide or,
//! with a watched namespace, namespaced; and TargetLeases readable by
//! everyone with the view role.

use serde_json::{Value, json};

use crate::helm::*;

fn expected_cluster_rules() -> Value {
    json!([
        { "apiGroups": ["targetlease.dev"], "resources": ["targetleases"],
          "verbs": ["get", "list", "watch", "patch"] },
        { "apiGroups": ["targetlease.dev"], "resources": ["targetleases/status"],
          "verbs": ["patch"] },
        { "apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "patch"] },
        { "apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"] },
    ])
}

/// The chart's default floor ConfigMap (`operator.floorConfigMap`).
pub const DEFAULT_FLOORS: &str = "targetlease-token-floors";
/// The chart's default leader-election Lease (`leaderElection.leaseName`).
pub const DEFAULT_ELECTION_LEASE: &str = "targetlease-operator";

/// The Role's rules; `watch`: `operator.watchNamespace` (then the operator
/// may update only that namespace's floor ConfigMap; otherwise any, narrowed
/// by the token-floors admission policy); `key_secret`: the lease-id key
/// Secret the operator creates (none with `leaseIdKey.existingSecret`).
pub fn expected_role_rules(
    floor: &str,
    watch: Option<&str>,
    election_lease: Option<&str>,
    key_secret: Option<&str>,
) -> Value {
    let mut floors = json!({ "apiGroups": [""], "resources": ["configmaps"],
                             "verbs": ["get", "update"] });
    if let Some(ns) = watch {
        floors["resourceNames"] = json!([format!("{floor}.{ns}")]);
    }
    let mut rules = vec![
        json!({ "apiGroups": [""], "resources": ["configmaps"],
                "verbs": ["create", "list", "watch"] }),
        floors,
    ];
    if let Some(secret) = key_secret {
        rules.push(json!({ "apiGroups": [""], "resources": ["secrets"], "verbs": ["create"] }));
        rules.push(json!({ "apiGroups": [""], "resources": ["secrets"],
                           "resourceNames": [secret], "verbs": ["get"] }));
        // Its own ServiceAccount (the release's full name, like the Secret's
        // prefix): a key Secret older than it is refused.
        let service_account = secret.trim_end_matches("-lease-id-key");
        rules.push(json!({ "apiGroups": [""], "resources": ["serviceaccounts"],
                           "resourceNames": [service_account], "verbs": ["get"] }));
    }
    if let Some(lease) = election_lease {
        rules.push(
            json!({ "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                           "verbs": ["create"] }),
        );
        rules.push(
            json!({ "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                           "resourceNames": [lease], "verbs": ["get", "update"] }),
        );
    }
    Value::Array(rules)
}

#[test]
fn everyone_with_the_view_role_can_read_targetleases() {
    let r = template("tl", "tl-system", &[]);
    let view: Vec<_> = r
        .0
        .iter()
        .filter(|d| {
            d["kind"] == "ClusterRole" && d["metadata"]["name"] == "tl-system.tl-targetlease-view"
        })
        .collect();
    assert_eq!(view.len(), 1);
    let labels = &view[0]["metadata"]["labels"];
    for role in ["view", "edit", "admin"] {
        assert_eq!(
            labels[format!("rbac.authorization.k8s.io/aggregate-to-{role}")],
            "true"
        );
    }
    assert_eq!(
        view[0]["rules"],
        json!([{ "apiGroups": ["targetlease.dev"], "resources": ["targetleases"],
                 "verbs": ["get", "list", "watch"] }])
    );
    let off = template("tl", "tl-system", &["--set", "rbac.aggregateToView=false"]);
    assert_eq!(
        off.0.iter().filter(|d| d["kind"] == "ClusterRole").count(),
        1
    );
}

#[test]
fn rbac_grants_exactly_the_verbs_the_operator_uses() {
    let r = template("tl", "tl-system", &[]);
    assert_eq!(r.operator_cluster_role()["rules"], expected_cluster_rules());
    assert_eq!(
        r.operator_cluster_role()["metadata"]["name"],
        "tl-system.tl-targetlease",
        "cluster-scoped names carry the release namespace"
    );
    assert_eq!(
        r.get("Role")["rules"],
        expected_role_rules(
            DEFAULT_FLOORS,
            None,
            Some(DEFAULT_ELECTION_LEASE),
            Some("tl-targetlease-lease-id-key")
        )
    );
    let subject =
        json!([{ "kind": "ServiceAccount", "name": "tl-targetlease", "namespace": "tl-system" }]);
    for (binding, role) in [
        ("ClusterRoleBinding", "ClusterRole"),
        ("RoleBinding", "Role"),
    ] {
        let b = r.get(binding);
        assert_eq!(b["subjects"], subject, "{binding}");
        assert_eq!(b["roleRef"]["kind"], role);
        let role_doc = if role == "ClusterRole" {
            r.operator_cluster_role()
        } else {
            r.get(role)
        };
        assert_eq!(b["roleRef"]["name"], role_doc["metadata"]["name"]);
    }

    // Renamed floor ConfigMap and Lease follow; no election, no Lease rights.
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set",
            "operator.floorConfigMap=floors,leaderElection.leaseName=le",
        ],
    );
    assert_eq!(
        r.get("Role")["rules"],
        expected_role_rules(
            "floors",
            None,
            Some("le"),
            Some("tl-targetlease-lease-id-key")
        )
    );
    let r = template(
        "tl",
        "tl-system",
        &["--set", "leaderElection.enabled=false,replicaCount=1"],
    );
    assert_eq!(
        r.get("Role")["rules"],
        expected_role_rules(
            DEFAULT_FLOORS,
            None,
            None,
            Some("tl-targetlease-lease-id-key")
        )
    );
    assert!(!r.args().iter().any(|a| a.starts_with("--leader-election")));
}

#[test]
fn with_a_watched_namespace_rbac_is_namespaced_and_nothing_is_cluster_wide() {
    let r = template(
        "tl",
        "tl-system",
        &["--set", "operator.watchNamespace=apps"],
    );
    assert!(
        r.find("ClusterRoleBinding").is_none(),
        "no cluster-wide binding"
    );
    let cluster_roles: Vec<_> = r.0.iter().filter(|d| d["kind"] == "ClusterRole").collect();
    assert_eq!(cluster_roles.len(), 1, "only the aggregated read-only role");
    assert_eq!(
        cluster_roles[0]["metadata"]["name"],
        "tl-system.tl-targetlease-view"
    );
    let workloads = r.named("Role", "tl-targetlease-workloads");
    assert_eq!(workloads["metadata"]["namespace"], "apps");
    assert_eq!(workloads["rules"], expected_cluster_rules());
    let binding = r.named("RoleBinding", "tl-targetlease-workloads");
    assert_eq!(binding["metadata"]["namespace"], "apps");
    assert_eq!(
        binding["roleRef"],
        json!({ "apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                "name": "tl-targetlease-workloads" })
    );
    assert_eq!(
        binding["subjects"],
        json!([{ "kind": "ServiceAccount", "name": "tl-targetlease", "namespace": "tl-system" }])
    );
    assert_eq!(
        r.release_role()["rules"],
        expected_role_rules(
            DEFAULT_FLOORS,
            Some("apps"),
            Some(DEFAULT_ELECTION_LEASE),
            Some("tl-targetlease-lease-id-key")
        ),
        "the release namespace keeps its own Role"
    );
}
