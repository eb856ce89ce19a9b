//! Operator process concerns end to end: the admin endpoints, graceful
//! shutdown, and two replicas electing one leader that is replaced when killed.

mod support {
    pub mod kube_env;
    pub mod operator_env;
    pub mod resp;
    pub mod valkey_server;
}

use std::time::Duration;

use serde_json::json;
use support::kube_env::eventually;
use support::operator_env::{OperatorEnv, http_get, summary};
use targetlease::crd::Phase;

const SOON: Duration = Duration::from_secs(20);

/// True when the exposition has exactly this sample line (not a HELP text).
fn has_sample(metrics: &str, line: &str) -> bool {
    metrics.lines().any(|l| l == line)
}

fn spec(target: &str) -> serde_json::Value {
    json!({ "target": target, "holder": { "identity": target }, "leaseDuration": "30s", "renewInterval": "2s" })
}

#[tokio::test]
async fn admin_endpoints_report_liveness_readiness_and_metrics() {
    let mut env = OperatorEnv::start("admin").await;
    let port = env.admin_port(0);
    env.create("job", spec("t")).await;
    env.wait_phase("job", Phase::Held, SOON).await;
    let (code, body) = eventually("/livez", SOON, || async { http_get(port, "/livez") }).await;
    assert_eq!((code, body.as_str()), (200, "ok"));
    let ready = eventually("/readyz ok", SOON, || async {
        http_get(port, "/readyz").filter(|(c, _)| *c == 200)
    })
    .await;
    assert_eq!(ready.1, "ok");
    let (code, metrics) = http_get(port, "/metrics").expect("/metrics answers");
    assert_eq!(code, 200);
    for needle in [
        "targetlease_leases{phase=\"Held\"} 1",
        "targetlease_backend_up 1",
        "targetlease_leader 1",
        "targetlease_store_calls_total{operation=\"acquire\",result=\"acquired\"} 1",
    ] {
        assert!(
            has_sample(&metrics, needle),
            "missing {needle} in:\n{metrics}"
        );
    }
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("targetlease_reconcile_duration_seconds_count "))
    );

    // The store goes away: not ready, backend_up 0, but still live.
    env.valkey.kill();
    let (code, _) = eventually("/readyz 503", SOON, || async {
        http_get(port, "/readyz").filter(|(c, _)| *c == 503)
    })
    .await;
    assert_eq!(code, 503);
    assert_eq!(http_get(port, "/livez").map(|r| r.0), Some(200));
    assert!(has_sample(
        &http_get(port, "/metrics").unwrap().1,
        "targetlease_backend_up 0"
    ));
    env.valkey.restart();

    // SIGTERM: a clean exit that leaves the workload's lease alone.
    let status = env.stop_operator(0);
    assert!(status.success(), "operator exited with {status}");
}

#[tokio::test]
async fn a_killed_leader_is_replaced_without_token_changes() {
    let mut env = OperatorEnv::start_without_operator("ha").await;
    let election = |env: &OperatorEnv| {
        vec![
            "--leader-election".to_string(),
            "--leader-election-namespace".to_string(),
            env.ns.clone(),
            "--leader-election-duration".to_string(),
            "4s".to_string(),
        ]
    };
    let flags = election(&env);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let a = env.start_operator_with(&flags);
    let b = env.start_operator_with(&flags);

    env.create("job", spec("t")).await;
    let held = env.wait_phase("job", Phase::Held, SOON).await;
    let token = summary(&held).2;

    // Exactly one replica leads.
    let leader = eventually("one leader", SOON, || async {
        let metric = |i| {
            http_get(env.admin_port(i), "/metrics")
                .map(|m| has_sample(&m.1, "targetlease_leader 1"))
        };
        match (metric(a), metric(b)) {
            (Some(true), Some(false)) => Some(a),
            (Some(false), Some(true)) => Some(b),
            _ => None,
        }
    })
    .await;
    let standby = if leader == a { b } else { a };

    env.kill_operator(leader);
    eventually("the standby to lead", Duration::from_secs(15), || async {
        http_get(env.admin_port(standby), "/metrics")
            .filter(|m| has_sample(&m.1, "targetlease_leader 1"))
    })
    .await;
    // The new leader reconciles: a new lease is served, the old one keeps its token.
    env.create("after", spec("u")).await;
    env.wait_phase("after", Phase::Held, SOON).await;
    let still = env.api().get("job").await.unwrap();
    assert_eq!(
        summary(&still),
        (Some(Phase::Held), Some("t".into()), token)
    );
}
