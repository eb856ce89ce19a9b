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
use crate::support::kube_env;

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
    Command::new(kube_env::tool("promtool", "promtool"))
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
