//! Operator process concerns end to end: the admin endpoints, graceful
//! shutdown, two replicas electing one leader that is replaced when killed,
//! a leader cut off from the API server that must stop writing before the
//! standby takes over (proved from the API server's audit log), and release
//! notifications for a leader elected while Valkey was down.

use crate::support;

use std::time::{Duration, Instant};

use support::kube_env::eventually;
use support::operator_env::{OperatorEnv, http_get, summary};
use support::spec::{Spec, lease_for};
use targetlease::operator::crd::Phase;

mod split_brain;
mod subscription;

const SOON: Duration = Duration::from_secs(20);

/// True when the exposition has exactly this sample line (not a HELP text).
fn has_sample(metrics: &str, line: &str) -> bool {
    metrics.lines().any(|l| l == line)
}

/// `targetlease_leader` of operator `i`: None when its admin server does not answer.
fn is_leader(env: &OperatorEnv, i: usize) -> Option<bool> {
    http_get(env.admin_port(i), "/metrics").map(|m| has_sample(&m.1, "targetlease_leader 1"))
}

fn spec(target: &str) -> Spec {
    lease_for(target).identity(target).durations("30s", "2s")
}

/// Leader election in `env`'s namespace with these timings.
fn election(env: &OperatorEnv, duration: &str, renew_deadline: &str, retry: &str) -> Vec<String> {
    [
        "--leader-election",
        "--leader-election-namespace",
        &env.ns,
        "--leader-election-duration",
        duration,
        "--leader-election-renew-deadline",
        renew_deadline,
        "--leader-election-retry-period",
        retry,
    ]
    .map(String::from)
    .to_vec()
}

fn start_operator(env: &mut OperatorEnv, flags: &[String]) -> usize {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    env.start_operator_with(&flags)
}

/// After a change of leader: a new TargetLease `after` gets Held, and `job`
/// still holds target `t` with `token`.
async fn assert_new_leader_serves_and_job_kept(env: &OperatorEnv, token: Option<u64>) {
    env.create("after", spec("u")).await;
    env.wait_phase("after", Phase::Held, SOON).await;
    let still = env.api().get("job").await.unwrap();
    assert_eq!(
        summary(&still),
        (Some(Phase::Held), Some("t".into()), token)
    );
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
    // The phase counts come from the operator's watch cache, which sees its
    // own `Held` write a moment after the test's watch may: ask until it does.
    let needles = [
        "targetlease_leases{phase=\"Held\"} 1",
        "targetlease_backend_up 1",
        "targetlease_leader 1",
        "targetlease_store_calls_total{operation=\"acquire\",result=\"acquired\"} 1",
    ];
    let deadline = std::time::Instant::now() + SOON;
    let metrics = loop {
        let (code, metrics) = http_get(port, "/metrics").expect("/metrics answers");
        assert_eq!(code, 200);
        let missing: Vec<_> = needles
            .iter()
            .filter(|n| !has_sample(&metrics, n))
            .collect();
        if missing.is_empty() {
            break metrics;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "missing {missing:?} after {SOON:?} in:\n{metrics}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
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
    let flags = election(&env, "4s", "3s", "500ms");
    let a = start_operator(&mut env, &flags);
    let b = start_operator(&mut env, &flags);

    env.create("job", spec("t")).await;
    let held = env.wait_phase("job", Phase::Held, SOON).await;
    let token = summary(&held).2;

    // Exactly one replica leads.
    let leader = eventually("one leader", SOON, || async {
        match (is_leader(&env, a), is_leader(&env, b)) {
            (Some(true), Some(false)) => Some(a),
            (Some(false), Some(true)) => Some(b),
            _ => None,
        }
    })
    .await;
    let standby = if leader == a { b } else { a };

    // A crash gives nothing back: the standby waits out the lease duration.
    let killed = Instant::now();
    env.kill_operator(leader);
    eventually("the standby to lead", Duration::from_secs(15), || async {
        is_leader(&env, standby).filter(|l| *l)
    })
    .await;
    // It waits the lease duration from when it saw the last renewal, which
    // was at most one retry period before the crash.
    assert!(
        killed.elapsed() >= Duration::from_millis(3500),
        "the standby took over {:?} after the crash: before the 4s lease duration ran out",
        killed.elapsed()
    );
    // The new leader reconciles: a new lease is served, the old one keeps its token.
    assert_new_leader_serves_and_job_kept(&env, token).await;
}

#[tokio::test]
async fn sigterm_hands_leadership_over_at_once() {
    let mut env = OperatorEnv::start_without_operator("handover").await;
    // A long lease: a takeover within seconds proves the Lease was given up.
    let flags = election(&env, "60s", "40s", "500ms");
    let a = start_operator(&mut env, &flags);
    eventually("the first replica to lead", SOON, || async {
        is_leader(&env, a).filter(|l| *l)
    })
    .await;
    let b = start_operator(&mut env, &flags);
    env.create("job", spec("t")).await;
    let token = summary(&env.wait_phase("job", Phase::Held, SOON).await).2;
    eventually("the second replica to stand by", SOON, || async {
        is_leader(&env, b).filter(|l| !*l)
    })
    .await;

    let stopped = Instant::now();
    let status = env.stop_operator(a);
    assert!(status.success(), "operator exited with {status}");
    eventually("the standby to lead", Duration::from_secs(10), || async {
        is_leader(&env, b).filter(|l| *l)
    })
    .await;
    assert!(stopped.elapsed() < Duration::from_secs(10));
    // The workload's lease was not released: same holder, same token.
    assert_new_leader_serves_and_job_kept(&env, token).await;
}
