//! Invalid specs refused by the API server, and what kubectl shows.

use super::*;

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
            "spec.leaseDuration must be a duration such as 90s",
        ),
        (
            json!({ "target": "t", "holder": {"identity": "a"}, "leaseDuration": "soon", "renewInterval": "1s" }),
            "spec.leaseDuration must be a duration such as 90s",
        ),
        (
            json!({ "target": "t", "holder": {"identity": "a"}, "renewInterval": "10 s" }),
            "spec.renewInterval must be a duration such as 30s",
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
            "spec.target must not contain control characters",
        ),
        (
            json!({ "target": "t", "holder": {"identity": "a\u{85}b"} }),
            "spec.holder.identity must not contain control characters",
        ),
        (
            // 129 characters, 258 bytes: the store counts bytes, so admission does too.
            json!({ "target": "é".repeat(129), "holder": {"identity": "a"} }),
            "at most 256 bytes",
        ),
        // A tenant cannot make the operator hold megabytes: selectors are bounded.
        (
            json!({ "target": "t", "candidates": {"podSelector": {"matchLabels": { "app": "v".repeat(1_200_000) }}} }),
            "spec.candidates.podSelector.matchLabels.app: Too long",
        ),
        (
            json!({ "target": "t", "candidates": {"podSelector": {"matchLabels":
                (0..33).map(|i| (format!("k{i}"), json!("v"))).collect::<serde_json::Map<_, _>>() }}} ),
            "spec.candidates.podSelector.matchLabels: Too many: 33",
        ),
        (
            json!({ "target": "t", "candidates": {"podSelector": {"matchLabels": { "k".repeat(318): "v" }}} }),
            "matchLabels keys must be at most 317 characters",
        ),
        (
            json!({ "target": "t", "candidates": {"podSelector": {"matchExpressions":
                [{"key": "app", "operator": "In", "values": (0..33).map(|i| format!("v{i}")).collect::<Vec<_>>()}] }}} ),
            "values: Too many: 33",
        ),
        (
            json!({ "target": "t", "candidates": {"podSelector": {"matchExpressions":
                (0..17).map(|_| json!({"key": "app", "operator": "Exists"})).collect::<Vec<_>>() }}} ),
            "matchExpressions: Too many: 17",
        ),
        (
            json!({ "target": "t", "candidates": {"podSelector": {"matchExpressions":
                [{"key": "app", "operator": "Near", "values": ["x"]}] }}} ),
            "supported values: \"In\", \"NotIn\", \"Exists\", \"DoesNotExist\"",
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
        let obj: targetlease::operator::crd::TargetLease = serde_json::from_value(obj).unwrap();
        let err = api
            .create(&Default::default(), &obj)
            .await
            .expect_err(&format!("case {i} must be refused"));
        let text = err.to_string();
        assert!(text.contains(expected), "case {i}: {text}");
        // Refusals are sentences: never a regular expression or a CEL failure.
        for raw in ["should match", "^(", "[^", "evaluation", "no such overload"] {
            assert!(!text.contains(raw), "case {i} shows {raw:?}: {text}");
        }
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
    env.create("ok", lease_for("t").identity("a")).await;
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

fn kubectl(env: &OperatorEnv, args: &[&str]) -> String {
    let out = std::process::Command::new(crate::support::tools::tool("kubectl"))
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
    env.create("job", lease_for("reports").identity("nightly"))
        .await;
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
    // The descriptions state the exact rules the API server enforces.
    let renew = kubectl(&env, &["explain", "targetlease.spec.renewInterval"]);
    let renew = renew.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(renew.contains("at most half of `leaseDuration`"), "{renew}");
    assert!(renew.contains("at least 100ms"), "{renew}");
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
