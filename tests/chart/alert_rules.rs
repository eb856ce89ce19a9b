//! The chart's alerting rules under `promtool` (built from
//! github.com/prometheus/prometheus by `scripts/build-controlplane.sh
//! promtool`): the rendered PrometheusRule passes `promtool check rules` and
//! the unit tests in `tests/chart/fixtures/prometheusrule.test.yaml` (each
//! alert fires when it should, stays quiet when it should not, and ignores
//! another release's series), and those unit tests fail on a rule that lost
//! its release selector or its delay.

use std::process::{Command, Output};

use serde_json::Value;

use crate::helm::{repo, template};

const FIXTURE: &str = "tests/chart/fixtures/prometheusrule.test.yaml";

/// The rule groups of release `tl` in `tl-system`, as the fixture expects
/// them, with `extra` helm arguments on top.
fn rule_spec(extra: &[&str]) -> Value {
    let mut args = vec![
        "--set",
        "metrics.prometheusRule.enabled=true,metrics.prometheusRule.alertLabels.team=platform",
    ];
    args.extend_from_slice(extra);
    template("tl", "tl-system", &args).get("PrometheusRule")["spec"].clone()
}

/// Runs `promtool ARGS…` in a directory holding the rules (`rules.yaml`;
/// JSON is YAML) and the fixture.
fn promtool(spec: &Value, args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), spec.to_string()).unwrap();
    std::fs::copy(repo().join(FIXTURE), dir.path().join("rules.test.yaml")).unwrap();
    Command::new(crate::support::tools::tool("promtool"))
        .args(args)
        .current_dir(dir.path())
        .output()
        .expect("run promtool")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn unit_tests(spec: &Value) -> Output {
    promtool(spec, &["test", "rules", "rules.test.yaml"])
}

fn rule_mut<'a>(spec: &'a mut Value, alert: &str) -> &'a mut Value {
    spec["groups"][0]["rules"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|r| r["alert"] == alert)
        .unwrap_or_else(|| panic!("no rule {alert}"))
}

#[test]
fn the_rendered_alerting_rules_pass_promtool_and_their_unit_tests() {
    let spec = rule_spec(&[]);
    let out = promtool(&spec, &["check", "rules", "rules.yaml"]);
    assert!(out.status.success(), "promtool check rules: {}", text(&out));
    assert!(text(&out).contains("5 rules found"), "{}", text(&out));
    let out = unit_tests(&spec);
    assert!(out.status.success(), "promtool test rules: {}", text(&out));
    assert!(text(&out).contains("SUCCESS"), "{}", text(&out));
}

/// The unit tests must fail on `spec`, naming `alert`.
fn assert_caught(spec: &Value, alert: &str, broken: &str) {
    let out = unit_tests(spec);
    assert!(!out.status.success(), "{broken} passed: {}", text(&out));
    assert!(text(&out).contains(alert), "{broken}: {}", text(&out));
}

#[test]
fn the_unit_tests_fail_on_a_rule_without_its_release_selector_or_its_delay() {
    // Another release's series in the same namespace now count as ours.
    let spec = rule_spec(&[
        "--set-string",
        r#"metrics.prometheusRule.selector=namespace="tl-system""#,
    ]);
    assert_caught(&spec, "TargetLeaseLeasesLost", "a selector without the job");

    // Without `for`, a 2-minute outage alerts at once.
    let mut spec = rule_spec(&[]);
    rule_mut(&mut spec, "TargetLeaseBackendDown")
        .as_object_mut()
        .unwrap()
        .remove("for");
    assert_caught(&spec, "TargetLeaseBackendDown", "a rule without `for`");

    // A summed leader gauge that forgot `absent`: a release with no replica
    // left must still alert.
    let mut spec = rule_spec(&[]);
    let rule = rule_mut(&mut spec, "TargetLeaseNoLeader");
    let expr = rule["expr"].as_str().unwrap().to_string();
    rule["expr"] = Value::from(expr.split(" or ").next().unwrap());
    assert_caught(&spec, "TargetLeaseNoLeader", "a rule without `absent`");
}

#[test]
fn the_fixture_names_every_alert_the_chart_ships() {
    let fixture = std::fs::read_to_string(repo().join(FIXTURE)).unwrap();
    let spec = rule_spec(&[]);
    for rule in spec["groups"][0]["rules"].as_array().unwrap() {
        let alert = rule["alert"].as_str().unwrap();
        assert!(
            fixture.contains(&format!(
                "alertname: {alert}\n        exp_alerts:\n          - exp_labels"
            )),
            "{FIXTURE} never expects {alert} to fire"
        );
    }
}

/// Plausible wrong versions of each rule: a threshold, a window, a delay, an
/// aggregation, a phase or one metric's selector changed. Each must make the
/// unit tests fail, naming the alert. (Changes that cannot alter an alert on
/// the operator's 0/1 gauges, like `max` → `sum` on `backend_up`, are left
/// out: no fixture can tell them apart.)
#[test]
fn the_unit_tests_fail_on_each_plausibly_wrong_rule() {
    const SEL: &str = r#"job="tl-targetlease-metrics",namespace="tl-system""#;
    const NS: &str = r#",namespace="tl-system""#;
    let sel = |metric: &str| format!("{metric}{{{SEL}}}");
    // (alert, field, from, to, what it breaks)
    let mutants: Vec<(&str, &str, String, String, &str)> = vec![
        (
            "TargetLeaseBackendDown",
            "expr",
            "max(".into(),
            "min(".into(),
            "any replica down alerts",
        ),
        (
            "TargetLeaseBackendDown",
            "for",
            "2m".into(),
            "3m".into(),
            "a longer delay",
        ),
        (
            "TargetLeaseBackendDown",
            "expr",
            NS.into(),
            "".into(),
            "a same-named release elsewhere hides it",
        ),
        (
            "TargetLeaseNoLeader",
            "expr",
            format!("sum({})", sel("targetlease_leader")),
            "sum(targetlease_leader)".into(),
            "another release's leader hides it",
        ),
        (
            "TargetLeaseNoLeader",
            "for",
            "2m".into(),
            "3m".into(),
            "a longer delay",
        ),
        (
            "TargetLeaseLeasesLost",
            "expr",
            "[10m]".into(),
            "[5m]".into(),
            "a shorter window",
        ),
        (
            "TargetLeaseLeasesLost",
            "expr",
            "[10m]".into(),
            "[11m]".into(),
            "a longer window",
        ),
        (
            "TargetLeaseLeasesLost",
            "expr",
            "> 0".into(),
            "> 1".into(),
            "one lost lease is silent",
        ),
        (
            "TargetLeaseLeasesLost",
            "expr",
            "sum(".into(),
            "max(".into(),
            "losses on two replicas not added",
        ),
        (
            "TargetLeaseLeasesLost",
            "expr",
            NS.into(),
            "".into(),
            "a same-named release elsewhere counts",
        ),
        (
            "TargetLeaseLeasesUnhealthy",
            "expr",
            "> 0".into(),
            "> 1".into(),
            "one unhealthy lease is silent",
        ),
        (
            "TargetLeaseLeasesUnhealthy",
            "expr",
            "Error|Lost|Unknown".into(),
            "Lost|Unknown".into(),
            "Error never alerts",
        ),
        (
            "TargetLeaseLeasesUnhealthy",
            "expr",
            "Error|Lost|Unknown".into(),
            "Error|Lost".into(),
            "Unknown never alerts",
        ),
        (
            "TargetLeaseLeasesUnhealthy",
            "expr",
            "Error|Lost|Unknown".into(),
            "Error|Lost|Unknown|Pending".into(),
            "Pending alerts",
        ),
        (
            "TargetLeaseLeasesUnhealthy",
            "expr",
            format!("{SEL},"),
            "".into(),
            "another release's leases count",
        ),
        (
            "TargetLeaseReconcileErrors",
            "expr",
            "> 0.1".into(),
            "> 0.2".into(),
            "a higher threshold",
        ),
        (
            "TargetLeaseReconcileErrors",
            "expr",
            "> 0.1".into(),
            "> 0.05".into(),
            "a lower threshold",
        ),
        (
            "TargetLeaseReconcileErrors",
            "expr",
            "[5m]".into(),
            "[2m]".into(),
            "a shorter rate window",
        ),
        (
            "TargetLeaseReconcileErrors",
            "expr",
            "[5m]".into(),
            "[10m]".into(),
            "a longer rate window",
        ),
        (
            "TargetLeaseReconcileErrors",
            "expr",
            "rate(".into(),
            "irate(".into(),
            "irate",
        ),
        (
            "TargetLeaseReconcileErrors",
            "expr",
            "sum(".into(),
            "max(".into(),
            "replicas not summed",
        ),
        (
            "TargetLeaseReconcileErrors",
            "expr",
            sel("targetlease_reconcile_errors_total"),
            "targetlease_reconcile_errors_total".into(),
            "another release's errors count",
        ),
        (
            "TargetLeaseReconcileErrors",
            "expr",
            sel("targetlease_reconcile_duration_seconds_count"),
            "targetlease_reconcile_duration_seconds_count".into(),
            "another release's reconciles dilute",
        ),
    ];
    for (alert, field, from, to, what) in mutants {
        let mut spec = rule_spec(&[]);
        let rule = rule_mut(&mut spec, alert);
        let text = rule[field].as_str().unwrap().to_string();
        assert!(
            text.contains(&from),
            "{alert}.{field} has no {from:?}: {text}"
        );
        rule[field] = Value::from(text.replace(&from, &to));
        assert_caught(
            &spec,
            alert,
            &format!("{alert}: {what} ({from:?} -> {to:?})"),
        );
    }
}

/// Non-default values still render rules promtool accepts: no extra alert
/// labels, a `severity` among them (which used to render a second
/// `severity:` key in the same map, refused by promtool), a custom selector
/// and another namespace for the PrometheusRule.
#[test]
fn the_rules_with_non_default_values_pass_promtool_check() {
    for (extra, severity) in [
        (
            vec!["--set", "metrics.prometheusRule.alertLabels=null"],
            None,
        ),
        (
            vec!["--set", "metrics.prometheusRule.alertLabels.severity=page"],
            Some("page"),
        ),
        (
            vec![
                "--set",
                "metrics.prometheusRule.namespace=monitoring",
                "--set-string",
                r#"metrics.prometheusRule.selector=service="tl-targetlease-metrics"\,namespace="tl-system""#,
            ],
            None,
        ),
    ] {
        // The text helm renders, not a re-serialised copy: a duplicate key
        // must reach promtool as it would reach a user.
        let chart = crate::helm::chart();
        let mut args = vec![
            "template",
            "tl",
            chart.as_str(),
            "--namespace",
            "tl-system",
            "--kube-version",
            crate::helm::KUBE_VERSION,
            "--show-only",
            "templates/prometheusrule.yaml",
            "--set",
            "metrics.prometheusRule.enabled=true,metrics.prometheusRule.alertLabels.team=platform",
        ];
        args.extend_from_slice(&extra);
        let rendered = crate::helm::helm_ok(&args);
        let spec = rendered
            .split_once("\nspec:\n")
            .expect("a spec")
            .1
            .lines()
            .map(|l| l.strip_prefix("  ").unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rules.yaml"), &spec).unwrap();
        let out = Command::new(crate::support::tools::tool("promtool"))
            .args(["check", "rules", "rules.yaml"])
            .current_dir(dir.path())
            .output()
            .expect("run promtool");
        assert!(out.status.success(), "{extra:?}: {}\n{spec}", text(&out));
        if let Some(severity) = severity {
            let n = spec.matches("severity:").count();
            let ours = spec.matches(&format!("severity: {severity}")).count();
            assert_eq!((n, ours), (5, 5), "{extra:?}: {spec}");
        }
    }
}
