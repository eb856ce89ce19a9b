//! The chart under GitOps: `helm template` (what Argo CD runs) renders the
//! same manifests every time, with no random key in them; the lease-id key
//! is made once in the cluster by the operator (tests/chart/lease_id_key.rs).

use crate::helm::*;
use crate::render_rbac::{DEFAULT_ELECTION_LEASE, DEFAULT_FLOORS, expected_role_rules};

#[test]
fn helm_template_renders_identical_manifests_every_time() {
    let chart = chart();
    let render = |extra: &[&str]| {
        let mut args = vec!["template", "tl", chart.as_str(), "--namespace", "tl-system"];
        args.extend_from_slice(&["--kube-version", KUBE_VERSION]);
        args.extend_from_slice(extra);
        helm_ok(&args)
    };
    for extra in [
        &[][..],
        &[
            "--set",
            "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,metrics.grafanaDashboard.enabled=true",
        ][..],
        &["--set", "leaseIdKey.existingSecret=mine"][..],
    ] {
        let first = render(extra);
        for _ in 0..2 {
            assert_eq!(
                render(extra),
                first,
                "helm template {extra:?} is not deterministic"
            );
        }
    }
}

#[test]
fn by_default_the_operator_makes_the_key_and_may_touch_only_that_secret() {
    let r = template("tl", "tl-system", &[]);
    assert!(
        r.find("Secret").is_none(),
        "no key rendered, nothing random in the manifests"
    );
    assert!(
        r.args()
            .contains(&"--lease-id-key-secret=tl-targetlease-lease-id-key".to_string())
    );
    assert!(
        !r.args()
            .iter()
            .any(|a| a.starts_with("--lease-id-key-file"))
    );
    let rules = r.get("Role")["rules"].as_array().unwrap().clone();
    let secret_rules: Vec<_> = rules
        .iter()
        .filter(|r| r["resources"][0] == "secrets")
        .collect();
    assert_eq!(
        serde_json::Value::Array(secret_rules.into_iter().cloned().collect()),
        serde_json::json!([
            { "apiGroups": [""], "resources": ["secrets"], "verbs": ["create"] },
            { "apiGroups": [""], "resources": ["secrets"],
              "resourceNames": ["tl-targetlease-lease-id-key"], "verbs": ["get"] },
        ]),
        "create (cannot be limited by name) and get on the one Secret; no list, watch or update"
    );
    assert!(
        r.operator_cluster_role()["rules"]
            .as_array()
            .unwrap()
            .iter()
            .all(|rule| rule["resources"][0] != "secrets"),
        "no Secret access outside the release namespace"
    );
}

#[test]
fn an_existing_secret_is_mounted_and_grants_no_secret_access() {
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set",
            "leaseIdKey.existingSecret=gitops-key,leaseIdKey.key=secret",
        ],
    );
    assert!(r.find("Secret").is_none());
    assert!(
        r.args()
            .contains(&"--lease-id-key-file=/etc/targetlease/lease-id/key".to_string())
    );
    assert!(
        !r.args()
            .iter()
            .any(|a| a.starts_with("--lease-id-key-secret"))
    );
    assert_eq!(
        r.volume("lease-id-key")["secret"],
        serde_json::json!({ "secretName": "gitops-key", "defaultMode": 0o440,
                            "items": [{ "key": "secret", "path": "key" }] })
    );
    assert_eq!(
        r.get("Role")["rules"],
        expected_role_rules(DEFAULT_FLOORS, None, Some(DEFAULT_ELECTION_LEASE), None)
    );
}
