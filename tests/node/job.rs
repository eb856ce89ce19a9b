//! examples/job-with-token.yaml with a real Job: its init container
//! (`targetlease token`, the operator image) waits for the lease and writes
//! the token to a file, and its main container makes a fenced write with it
//! (`targetlease lease commit`) that a stale holder's write cannot override.
//!
//! Adapted only where this node needs it: the images (local, never pulled),
//! where the API server is (KUBERNETES_SERVICE_HOST/PORT: no kube-proxy),
//! the RoleBinding's namespace, and the main container's command (the CLI's
//! fenced write, to Valkey at the bridge address, instead of `report`).

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::fixture::{DEMO_IMAGE, Node, OPERATOR_IMAGE, eventually, node};

const TARGET: &str = "orders-db";

#[test]
fn job_receives_its_token_and_its_fenced_write_outranks_a_stale_holder() {
    let (node, _turn) = node();
    let ns = node.namespace("job-with-token");

    // An earlier holder of the same target: it writes under its lease, then
    // its lease expires while it still believes it holds it.
    let stale = node.cli(&[
        "lease",
        "acquire",
        "--target",
        TARGET,
        "--namespace",
        &ns,
        "--ttl",
        "2s",
        "--owner",
        "stale-report",
    ]);
    let stale: Value = serde_json::from_slice(&stale.stdout).expect("acquire prints JSON");
    let stale_token = stale["lease"]["fencing_token"]
        .as_u64()
        .unwrap_or_else(|| panic!("the stale holder did not acquire: {stale}"));
    let wrote = commit(node, &ns, stale_token, "from-the-stale-holder");
    assert_eq!(wrote["outcome"], "committed", "{wrote}");
    std::thread::sleep(Duration::from_millis(2500));

    node.apply(&ns, &adapted_example(node, &ns));
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

    let tl = node.json(&["-n", &ns, "get", "targetlease", "orders-db-report"]);
    let token = tl["status"]["fencingToken"]
        .as_u64()
        .expect("a Held lease has a token");
    assert!(
        token > stale_token,
        "the Job's token {token} must outrank {stale_token}"
    );
    let logs = node.kubectl(&["-n", &ns, "logs", "job/nightly-report", "-c", "report"]);
    let written: Value = serde_json::from_str(logs.trim()).expect("commit prints JSON");
    assert_eq!(written["outcome"], "committed", "{written}");
    assert_eq!(written["lease"]["fencing_token"], token, "{written}");

    // The stale holder writes again with its old token: refused, and the
    // Job's value stays.
    let late = commit(node, &ns, stale_token, "from-the-stale-holder-again");
    assert_eq!(late["outcome"], "stale_token", "{late}");
    let read = node.cli(&[
        "lease",
        "read",
        "--target",
        TARGET,
        "--namespace",
        &ns,
        "--key",
        "report",
    ]);
    let read: Value = serde_json::from_slice(&read.stdout).expect("read prints JSON");
    assert_eq!(read["committed"]["value"], "written-by-the-job", "{read}");
    assert_eq!(read["committed"]["fencing_token"], token, "{read}");
    node.kubectl(&["delete", "namespace", &ns, "--wait=false"]);
}

fn commit(node: &Node, ns: &str, token: u64, value: &str) -> Value {
    let out = node.cli(&[
        "lease",
        "commit",
        "--target",
        TARGET,
        "--namespace",
        ns,
        "--token",
        &token.to_string(),
        "--key",
        "report",
        "--value",
        value,
    ]);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "commit printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn adapted_example(node: &Node, ns: &str) -> String {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/job-with-token.yaml"
    ))
    .expect("examples/job-with-token.yaml");
    let api_server = json!([
        {"name": "KUBERNETES_SERVICE_HOST", "value": node.bridge},
        {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}
    ]);
    let write = format!(
        "exec targetlease lease commit --target {TARGET} --namespace {ns} \
         --token \"$(cat /lease/token)\" --key report --value written-by-the-job \
         --valkey-url {}",
        node.valkey_url_for_pods()
    );
    let mut items = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let mut object = Value::deserialize(doc).expect("the example parses");
        match object["kind"].as_str() {
            Some("RoleBinding") => object["subjects"][0]["namespace"] = json!(ns),
            Some("Job") => {
                let pod = &mut object["spec"]["template"]["spec"];
                let init = &mut pod["initContainers"][0];
                init["image"] = json!(OPERATOR_IMAGE);
                init["imagePullPolicy"] = json!("Never");
                init["env"]
                    .as_array_mut()
                    .expect("the init container has env")
                    .extend(api_server.as_array().cloned().unwrap_or_default());
                let main = &mut pod["containers"][0];
                main["image"] = json!(DEMO_IMAGE);
                main["imagePullPolicy"] = json!("Never");
                main["command"] = json!(["sh", "-c", write]);
            }
            _ => {}
        }
        items.push(object);
    }
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}
