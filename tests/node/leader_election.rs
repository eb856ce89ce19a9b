//! examples/leader-election.yaml with real pods, applied as written: the
//! operator elects one Ready pod, labels it, the leader Service routes to it
//! alone, a readiness failure inside the container (`rm` of the file its
//! probe reads) moves leadership, and the new leader's downward-API file
//! `/etc/lease/token` receives the new token. The delay from the status
//! change to the file change is measured over several handoffs and printed
//! (docs/node.md).

use std::time::{Duration, Instant};

use crate::fixture::{Node, Watch, eventually, http_get, is_ready, name, node, percentile};

const HANDOFFS: usize = 10;
const LEADER_LABEL: &str = "web-leader.targetlease.dev/leader";

#[test]
fn leader_election_example_moves_leadership_on_readiness_and_the_token_file_follows() {
    let (node, _turn) = node();
    let ns = node.namespace("leader-election");
    node.apply(&ns, &example());
    let all_ready = || {
        let pods = node.pods(&ns, "app=web");
        (pods.len() == 3 && pods.iter().all(is_ready)).then_some(pods)
    };
    eventually(
        "3 web pods Ready",
        Duration::from_secs(120),
        &all_ready,
        || node.describe(&ns),
    );
    let watch = node.watch(&ns, "targetlease", "web-leader");

    let mut delays = Vec::new();
    let mut handoffs = Vec::new();
    for round in 0..HANDOFFS {
        let (leader, token) = held(node, &ns);
        let leader_ip = only_leader(node, &ns, &leader);
        eventually(
            "the leader's token file",
            Duration::from_secs(60),
            || {
                (http_get(&format!("{leader_ip}:8080"), "/token")? == token.to_string())
                    .then_some(())
            },
            || node.describe(&ns),
        );

        // A readiness failure inside the leader's container.
        node.kubectl(&["-n", &ns, "exec", &leader, "--", "rm", "/tmp/www/healthz"]);
        let failed_at = Instant::now();
        let (changed_at, next, next_token) = next_holder(node, &ns, &watch, &leader, token);
        let next_ip = pod_ip(node, &ns, &next);
        let file_at = file_changed(&format!("{next_ip}:8080"), next_token).unwrap_or_else(|| {
            panic!(
                "{next}'s token file never read {next_token}\n{}",
                node.describe(&ns)
            )
        });
        let delay = file_at.saturating_duration_since(changed_at);
        let handoff = changed_at.duration_since(failed_at);
        eprintln!(
            "handoff {}: {leader} -> {next}, token {token} -> {next_token}; readiness failure -> status {} ms, status -> file {} ms",
            round + 1,
            handoff.as_millis(),
            delay.as_millis()
        );
        delays.push(delay);
        handoffs.push(handoff);

        // The old leader recovers and stands by; the next round needs three
        // Ready candidates.
        node.kubectl(&[
            "-n",
            &ns,
            "exec",
            &leader,
            "--",
            "sh",
            "-c",
            "echo ok > /tmp/www/healthz",
        ]);
        eventually(
            "3 web pods Ready",
            Duration::from_secs(60),
            &all_ready,
            || node.describe(&ns),
        );
        let old_ip = pod_ip(node, &ns, &leader);
        eventually(
            "the old leader's token file to be empty",
            Duration::from_secs(60),
            || {
                http_get(&format!("{old_ip}:8080"), "/token")?
                    .is_empty()
                    .then_some(())
            },
            || node.describe(&ns),
        );
    }
    let (leader, _) = held(node, &ns);
    only_leader(node, &ns, &leader);

    delays.sort();
    handoffs.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    eprintln!(
        "downward-API delay, status change -> /etc/lease/token change, n={}: p50 {:.0} ms, p99 {:.0} ms, min {:.0} ms, max {:.0} ms",
        delays.len(),
        ms(percentile(&delays, 50.0)),
        ms(percentile(&delays, 99.0)),
        ms(delays[0]),
        ms(delays[delays.len() - 1])
    );
    eprintln!(
        "handoff, readiness failure (rm /tmp/www/healthz) -> status change, n={}: p50 {:.0} ms, p99 {:.0} ms",
        handoffs.len(),
        ms(percentile(&handoffs, 50.0)),
        ms(percentile(&handoffs, 99.0))
    );
    node.kubectl(&["delete", "namespace", &ns, "--wait=false"]);
}

/// The example, as written.
fn example() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/leader-election.yaml"
    ))
    .expect("examples/leader-election.yaml")
}

/// The TargetLease's holder pod and token, once Held.
fn held(node: &Node, ns: &str) -> (String, u64) {
    eventually(
        "TargetLease web-leader Held",
        Duration::from_secs(60),
        || {
            let tl = node.json(&["-n", ns, "get", "targetlease", "web-leader"]);
            let status = &tl["status"];
            (status["phase"] == "Held").then(|| {
                (
                    status["holderPod"].as_str().unwrap_or_default().to_string(),
                    status["fencingToken"].as_u64().unwrap_or_default(),
                )
            })
        },
        || node.describe(ns),
    )
}

/// Waits until LEADER alone carries the leader label and the leader
/// Service's EndpointSlices list only its address, ready; returns that
/// address.
fn only_leader(node: &Node, ns: &str, leader: &str) -> String {
    let ip = pod_ip(node, ns, leader);
    eventually(
        "the leader label on the holder alone",
        Duration::from_secs(60),
        || {
            let labelled = node.pods(ns, &format!("{LEADER_LABEL}=true"));
            (labelled.len() == 1 && name(&labelled[0]) == leader).then_some(())
        },
        || node.describe(ns),
    );
    eventually(
        "the leader Service's EndpointSlices to list the leader alone",
        Duration::from_secs(60),
        || {
            let slices = node.json(&[
                "-n",
                ns,
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=web-leader",
            ]);
            // Every endpoint listed, with whether it takes traffic: a
            // listed leader the slice marks not ready (`ready: false`; absent
            // means ready) does not count.
            let endpoints: Vec<(String, bool)> = slices["items"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
                .flat_map(|e| {
                    let ready = e["conditions"]["ready"].as_bool().unwrap_or(true);
                    e["addresses"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(move |a| a.as_str().map(|a| (a.to_string(), ready)))
                })
                .collect();
            (endpoints == [(ip.clone(), true)]).then_some(())
        },
        || node.describe(ns),
    );
    ip
}

/// The first status naming another holder with a larger token (tokens only
/// grow, so it is the one after the failure even if it came before the exec
/// that caused it returned): when the watch delivered it, the pod and the
/// token.
fn next_holder(
    node: &Node,
    ns: &str,
    watch: &Watch,
    leader: &str,
    token: u64,
) -> (Instant, String, u64) {
    eventually(
        "leadership to move off the unready leader",
        Duration::from_secs(120),
        || {
            watch.seen().into_iter().find_map(|(at, tl)| {
                let status = &tl["status"];
                let pod = status["holderPod"].as_str()?;
                let next = status["fencingToken"].as_u64()?;
                (status["phase"] == "Held" && pod != leader && next > token)
                    .then(|| (at, pod.to_string(), next))
            })
        },
        || node.describe(ns),
    )
}

/// When the file served at ADDR first reads TOKEN, polling every 20 ms
/// (`eventually`'s 100 ms would blur the figure); `None` after two minutes.
fn file_changed(addr: &str, token: u64) -> Option<Instant> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if http_get(addr, "/token") == Some(token.to_string()) {
            return Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn pod_ip(node: &Node, ns: &str, pod: &str) -> String {
    node.kubectl(&[
        "-n",
        ns,
        "get",
        "pod",
        pod,
        "-o",
        "jsonpath={.status.podIP}",
    ])
}
