//! Every example in examples/ on the real node, each run to completion (or
//! to holding) with its fencing token: the two leases of job-lease.yaml one
//! after the other, the Job of job-with-token.yaml printing the token it
//! acts with, and leader-election.yaml (its own test, leader_election.rs).
//!
//! Applied as written, but for what this node needs, and only that: the
//! Job's init container talks to the API server, so it is told where it is
//! (KUBERNETES_SERVICE_HOST/PORT: there is no kube-proxy), and its
//! RoleBinding names the test's namespace (the example says `default`, the
//! namespace it expects to be applied to).

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::fixture::{Node, eventually, node};

fn example(file: &str) -> String {
    let path = format!("{}/examples/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The examples this binary runs, each by the test named beside it.
const RUN_HERE: [(&str, &str); 3] = [
    ("job-lease.yaml", "job_lease_example_holds_then_hands_over"),
    (
        "job-with-token.yaml",
        "job_with_token_example_runs_to_completion_with_its_token",
    ),
    (
        "leader-election.yaml",
        "leader_election_example_moves_leadership_on_readiness_and_the_token_file_follows",
    ),
];

/// A new example must get a test here (the recipes in examples/fencing/
/// have theirs: tests/fencing_postgresql.rs and tests/e2e/fencing.rs).
#[test]
fn every_yaml_example_is_run_on_the_node() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".yml"))
        .collect();
    found.sort();
    let mut covered: Vec<String> = RUN_HERE.iter().map(|(f, _)| f.to_string()).collect();
    covered.sort();
    assert_eq!(found, covered, "examples/ and the node tests disagree");
}

/// `status` of a TargetLease: (phase, holder, token).
fn status(node: &Node, ns: &str, name: &str) -> (String, String, Option<u64>) {
    let tl = node.json(&["-n", ns, "get", "targetlease", name]);
    let s = &tl["status"];
    (
        s["phase"].as_str().unwrap_or_default().to_string(),
        s["holder"].as_str().unwrap_or_default().to_string(),
        s["fencingToken"].as_u64(),
    )
}

#[test]
fn job_lease_example_holds_then_hands_over() {
    let (node, _turn) = node();
    let ns = node.namespace("job-lease");
    node.apply(&ns, &example("job-lease.yaml"));
    let first = eventually(
        "orders-db-job-1 Held, orders-db-job-2 Pending",
        Duration::from_secs(60),
        || {
            let one = status(node, &ns, "orders-db-job-1");
            let two = status(node, &ns, "orders-db-job-2");
            (one.0 == "Held" && two.0 == "Pending").then_some(one)
        },
        || node.describe(&ns),
    );
    assert_eq!(first.1, "migration-2026-11");
    let token = first.2.expect("a Held lease shows its token");
    eprintln!(
        "job-lease.yaml: orders-db-job-1 Held by {} with token {token}",
        first.1
    );

    // The first job is done: deleting its lease hands the target over.
    node.kubectl(&["-n", &ns, "delete", "targetlease", "orders-db-job-1"]);
    let second = eventually(
        "orders-db-job-2 Held",
        Duration::from_secs(60),
        || {
            let two = status(node, &ns, "orders-db-job-2");
            (two.0 == "Held").then_some(two)
        },
        || node.describe(&ns),
    );
    assert_eq!(second.1, "backfill-2026-11");
    let next = second.2.expect("a Held lease shows its token");
    assert!(next > token, "token {next} must outrank {token}");
    eprintln!(
        "job-lease.yaml: then orders-db-job-2 Held by {} with token {next}",
        second.1
    );
    node.kubectl(&["delete", "namespace", &ns, "--wait=false"]);
}

#[test]
fn job_with_token_example_runs_to_completion_with_its_token() {
    let (node, _turn) = node();
    let ns = node.namespace("job-with-token");
    // Someone held the target before (and let it expire): the Job's token
    // must outrank theirs.
    let before = node.cli(&[
        "lease",
        "acquire",
        "--target",
        "reports-db",
        "--namespace",
        &ns,
        "--ttl",
        "1s",
        "--owner",
        "an-earlier-report",
    ]);
    let before: Value = serde_json::from_slice(&before.stdout).expect("acquire prints JSON");
    let earlier = before["lease"]["fencing_token"]
        .as_u64()
        .unwrap_or_else(|| panic!("the earlier holder did not acquire: {before}"));
    std::thread::sleep(Duration::from_millis(1500));

    node.apply(&ns, &adapted_job_example(node, &ns));
    eventually(
        "Job nightly-report to succeed",
        Duration::from_secs(180),
        || {
            let job = node.json(&["-n", &ns, "get", "job", "nightly-report"]);
            assert_eq!(
                job["status"]["failed"].as_u64().unwrap_or(0),
                0,
                "{}",
                node.describe(&ns)
            );
            (job["status"]["succeeded"] == 1).then_some(())
        },
        || node.describe(&ns),
    );
    let (phase, holder, token) = status(node, &ns, "nightly-report");
    assert_eq!(
        (phase.as_str(), holder.as_str()),
        ("Held", "nightly-report")
    );
    let token = token.expect("a Held lease shows its token");
    assert!(
        token > earlier,
        "the Job's token {token} must outrank {earlier}"
    );
    let logs = node.kubectl(&["-n", &ns, "logs", "job/nightly-report", "-c", "report"]);
    assert_eq!(
        logs.trim(),
        format!("nightly-report: writing to reports-db with fencing token {token}")
    );
    eprintln!("job-with-token.yaml: {}", logs.trim());
    node.kubectl(&["delete", "namespace", &ns, "--wait=false"]);
}

fn adapted_job_example(node: &Node, ns: &str) -> String {
    let api_server = [
        json!({"name": "KUBERNETES_SERVICE_HOST", "value": node.bridge}),
        json!({"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}),
    ];
    let mut items = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&example("job-with-token.yaml")) {
        let mut object = Value::deserialize(doc).expect("the example parses");
        match object["kind"].as_str() {
            Some("RoleBinding") => object["subjects"][0]["namespace"] = json!(ns),
            Some("Job") => {
                let init = &mut object["spec"]["template"]["spec"]["initContainers"][0];
                init["env"]
                    .as_array_mut()
                    .expect("the init container has env")
                    .extend(api_server.clone());
            }
            _ => {}
        }
        items.push(object);
    }
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}
