//! The PrometheusRule and the Grafana dashboard: every series they query is
//! one the operator exposes (names taken from the operator's own registry),
//! every expression selects this release, and the alerts an operator of
//! the release needs are there. What the alerts do over time is tested by
//! promtool (alert_rules.rs).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use targetlease::operator::metrics::{
    OperatorMetrics, api_writes::WriteKind, exposed_names, registry,
};
use targetlease::store::LeaseStore;
use targetlease::store::memory::MemoryStore;
use targetlease::store::metrics::{MeteredStore, StoreMetrics};

use crate::helm::*;

/// Every sample name a busy operator exposes.
async fn exposed() -> BTreeSet<String> {
    let operator = OperatorMetrics::default();
    let store_metrics = StoreMetrics::default();
    let store = MeteredStore::new(Arc::new(MemoryStore::default()), store_metrics.clone());
    store.health().await.unwrap();
    operator.reconciled(Duration::from_millis(3), Some("kube"));
    operator.lease_lost();
    operator.api_writes.count(WriteKind::Status);
    operator.count_phases(std::iter::empty());
    exposed_names(&registry(&operator, &store_metrics))
        .into_iter()
        .collect()
}

/// The `targetlease_…` names an expression refers to.
fn referenced(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("targetlease_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

fn balanced(expr: &str) -> bool {
    let mut stack = Vec::new();
    for c in expr.chars() {
        let open = match c {
            '(' | '{' | '[' => {
                stack.push(c);
                continue;
            }
            ')' => '(',
            '}' => '{',
            ']' => '[',
            _ => continue,
        };
        if stack.pop() != Some(open) {
            return false;
        }
    }
    stack.is_empty()
}

#[tokio::test]
async fn the_alerting_rules_query_exposed_series_of_this_release() {
    let exposed = exposed().await;
    assert!(
        template("tl", "tl-system", &[])
            .find("PrometheusRule")
            .is_none(),
        "off by default"
    );
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set",
            "metrics.prometheusRule.enabled=true,metrics.prometheusRule.labels.release=prom,metrics.prometheusRule.alertLabels.team=platform",
        ],
    );
    let rule = r.get("PrometheusRule");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["labels"]["release"], "prom");
    let rules = rule["spec"]["groups"][0]["rules"].as_array().unwrap();
    let alerts: Vec<&str> = rules.iter().map(|r| r["alert"].as_str().unwrap()).collect();
    assert_eq!(
        alerts,
        [
            "TargetLeaseBackendDown",
            "TargetLeaseNoLeader",
            "TargetLeaseLeasesLost",
            "TargetLeaseLeasesUnhealthy",
            "TargetLeaseReconcileErrors"
        ]
    );
    let selector = r#"job="tl-targetlease-metrics",namespace="tl-system""#;
    for rule in rules {
        let expr = rule["expr"].as_str().unwrap();
        assert!(balanced(expr), "unbalanced: {expr}");
        let names = referenced(expr);
        assert!(!names.is_empty(), "{expr}");
        for name in &names {
            assert!(
                exposed.contains(name),
                "{name} (in {expr}) is not exposed; exposed: {exposed:?}"
            );
            assert!(
                expr.contains(&format!("{name}{{{selector}")),
                "{name} must select this release's series in {expr}"
            );
        }
        assert_eq!(rule["labels"]["team"], "platform");
        assert!(["critical", "warning"].contains(&rule["labels"]["severity"].as_str().unwrap()));
        assert!(!rule["annotations"]["summary"].as_str().unwrap().is_empty());
    }
    let by_name = |n: &str| {
        rules.iter().find(|r| r["alert"] == n).unwrap()["expr"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(by_name("TargetLeaseLeasesUnhealthy").contains(r#"phase=~"Error|Lost|Unknown""#));
    assert!(by_name("TargetLeaseNoLeader").contains("absent(targetlease_leader{"));
    assert!(by_name("TargetLeaseReconcileErrors").ends_with("> 0.1"));

    // A custom selector replaces the default one everywhere.
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set",
            "metrics.prometheusRule.enabled=true,metrics.prometheusRule.namespace=monitoring",
            "--set-string",
            r#"metrics.prometheusRule.selector=service="tl""#,
        ],
    );
    let rule = r.get("PrometheusRule");
    assert_eq!(rule["metadata"]["namespace"], "monitoring");
    for rule in rule["spec"]["groups"][0]["rules"].as_array().unwrap() {
        let expr = rule["expr"].as_str().unwrap();
        assert!(!expr.contains("job="), "{expr}");
        for name in referenced(expr) {
            assert!(expr.contains(&format!(r#"{name}{{service="tl""#)), "{expr}");
        }
    }
}

#[tokio::test]
async fn the_dashboard_is_a_sidecar_configmap_querying_exposed_series() {
    let exposed = exposed().await;
    let r = template(
        "tl",
        "tl-system",
        &[
            "--set",
            "metrics.grafanaDashboard.enabled=true,metrics.grafanaDashboard.folder=Platform",
        ],
    );
    let cm = r.get("ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(cm["metadata"]["annotations"]["grafana_folder"], "Platform");
    let json = cm["data"]["targetlease.json"].as_str().unwrap();
    let dash: Value = serde_json::from_str(json).expect("the dashboard is JSON");
    assert_eq!(dash["uid"], "targetlease");
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "namespace", "job"]);
    let panels = dash["panels"].as_array().unwrap();
    assert!(panels.len() >= 10);
    let mut queried = BTreeSet::new();
    for panel in panels {
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "{}",
            panel["title"]
        );
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            assert!(balanced(expr), "{expr}");
            for name in referenced(expr) {
                assert!(
                    exposed.contains(&name),
                    "{name} (panel {}) is not exposed",
                    panel["title"]
                );
                assert!(
                    expr.contains(&format!(r#"{name}{{job=~"$job",namespace=~"$namespace""#)),
                    "{expr}"
                );
                queried.insert(name);
            }
        }
    }
    for must in [
        "targetlease_api_writes_total",
        "targetlease_leases_lost_total",
        "targetlease_leases",
        "targetlease_backend_up",
        "targetlease_process_resident_memory_bytes",
    ] {
        assert!(queried.contains(must), "{must} on the dashboard");
    }
    // The shipped file and the rendered ConfigMap are the same document.
    let file =
        std::fs::read_to_string(repo().join("charts/targetlease/dashboards/targetlease.json"))
            .unwrap();
    assert_eq!(file.trim_end(), json.trim_end());
}
