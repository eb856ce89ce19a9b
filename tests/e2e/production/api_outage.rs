//! The operator while kube-apiserver is hung, down or black-holed, with
//! Valkey healthy: published leases keep renewing in Valkey, nothing is lost
//! and no token changes when the API server returns, and a request nobody
//! answers gives its reconcile slot back within `--api-timeout`.

use std::time::Instant;

use super::*;
use support::operator_env::http_get;
use support::tcp_proxy::TcpProxy;

/// leaseDuration of the leases under test; the outages last 2.5 times as long.
const LEASE: Duration = Duration::from_secs(8);

/// Samples Valkey's record of `target` every 250 ms for `outage`: it must
/// stay the lease with `token`, live, and its expiry must keep moving on.
/// Returns how many times the expiry moved.
pub(super) async fn lease_stays_live(
    env: &OperatorEnv,
    target: &str,
    token: u64,
    outage: Duration,
) -> usize {
    let store = env.store().await;
    let target = Target::new(&env.ns, target);
    let started = Instant::now();
    let mut expiry = 0;
    let mut moved = 0;
    while started.elapsed() < outage {
        let r = store.get(&target).await.expect("Valkey answers");
        let lease = r.lease.unwrap_or_else(|| {
            panic!(
                "{:?} into the outage the lease is gone from Valkey ({}: {})\nlog:\n{}",
                started.elapsed(),
                r.outcome,
                r.message,
                env.operator_log(0)
            )
        });
        assert_eq!(lease.fencing_token, token, "the same lease");
        assert!(lease.expires_at_ms > r.server_time_ms);
        if lease.expires_at_ms > expiry {
            moved += usize::from(expiry > 0);
            expiry = lease.expires_at_ms;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    moved
}

/// After the outage: Held again with the same token and a fresh expiry, and
/// no version of it the watch saw was Lost, Unknown or carried another token.
pub(super) async fn held_as_before(env: &OperatorEnv, history: &History, name: &str, token: u64) {
    env.wait_for(
        name,
        "Held with a fresh expiry",
        Duration::from_secs(90),
        |tl| {
            let s = tl.status.clone().unwrap_or_default();
            s.phase == Some(Phase::Held) && ms(&s.expires_at).is_some_and(|e| e > now_ms())
        },
    )
    .await;
    let versions = history.of(name);
    let lost: Vec<_> = versions
        .iter()
        .filter(|tl| {
            let (phase, _, t) = summary(tl);
            t.is_some_and(|t| t != token) || matches!(phase, Some(Phase::Lost | Phase::Unknown))
        })
        .map(|tl| format!("{:?} {:?}", summary(tl), reason(tl)))
        .collect();
    assert!(lost.is_empty(), "{name} changed hands: {lost:?}");
}

/// Promise: a published lease outlives an API outage. kube-apiserver hangs
/// (SIGSTOP: connections open, nothing answers) for 2.5 × leaseDuration with
/// Valkey healthy; the operator runs leader election, so its write gate
/// closes 4 s into the outage and its controller stops. The lease stays in
/// Valkey with its expiry moving, and afterwards it is Held with the same
/// token, its pod still marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_api_server_costs_no_published_lease() {
    let mut env = OperatorEnv::start_on_own_control_plane("api-hung").await;
    let ns = env.ns.clone();
    env.start_operator_with(&[
        "--api-timeout",
        "2s",
        "--leader-election",
        "--leader-election-namespace",
        &ns,
        "--leader-election-duration",
        "6s",
        "--leader-election-renew-deadline",
        "4s",
        "--leader-election-retry-period",
        "1s",
    ]);
    let history = History::record(&env);
    env.create_pod(
        "w",
        &[("app", "w"), ("job.targetlease.dev/candidate", "true")],
        true,
    )
    .await;
    env.create(
        "job",
        lease_for("t").identity("w").pod("w").durations("8s", "2s"),
    )
    .await;
    let held = env
        .wait_phase("job", Phase::Held, Duration::from_secs(40))
        .await;
    let token = summary(&held).2.unwrap();
    env.wait_led_by("job", "w", token, SOON).await;

    env.pause_apiserver(true);
    let moved = lease_stays_live(&env, "t", token, LEASE * 5 / 2).await;
    env.pause_apiserver(false);
    assert!(moved >= 4, "the expiry moved only {moved} times");
    held_as_before(&env, &history, "job", token).await;
    env.wait_led_by("job", "w", token, SOON).await;
    let log = env.operator_log(0);
    assert!(
        log.contains("renewing published leases whose reconcile is late"),
        "the keeper renewed them:\n{log}"
    );
}

/// The same with kube-apiserver killed (connections refused) and started
/// again 2.5 × leaseDuration later, without leader election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_api_server_costs_no_published_lease() {
    let mut env = OperatorEnv::start_on_own_control_plane("api-down").await;
    env.start_operator_with(&["--api-timeout", "5s"]);
    let history = History::record(&env);
    env.create("job", lease_for("t").identity("job").durations("8s", "2s"))
        .await;
    let held = env
        .wait_phase("job", Phase::Held, Duration::from_secs(40))
        .await;
    let token = summary(&held).2.unwrap();

    let stopped = env.kill_apiserver();
    let moved = lease_stays_live(&env, "t", token, LEASE * 5 / 2).await;
    env.restart_apiserver(stopped);
    assert!(moved >= 4, "the expiry moved only {moved} times");
    held_as_before(&env, &history, "job", token).await;
    // Still renewing, and a new lease is served: the operator is whole again.
    env.create("after", lease_for("u").identity("after")).await;
    env.wait_phase("after", Phase::Held, Duration::from_secs(60))
        .await;
}

/// Promise: no Kubernetes request waits longer than `--api-timeout`. The
/// operator (one reconcile slot) reaches kube-apiserver through a proxy that
/// turns every open connection into a black hole (open, silent) while new
/// connections pass. The reconcile whose request went into the hole gives
/// its slot back after the timeout, the dead watches are noticed and made
/// again, and a TargetLease created afterwards is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_api_connection_frees_its_reconcile_slot_in_time() {
    let mut env = OperatorEnv::start_without_operator("api-hole").await;
    let upstream: std::net::SocketAddr = env
        .cp
        .server_url()
        .trim_start_matches("https://")
        .parse()
        .unwrap();
    let proxy = TcpProxy::start(upstream);
    env.run_operators_as(env.kubeconfig_via(proxy.port));
    env.start_operator_with(&[
        "--concurrency",
        "1",
        "--api-timeout",
        "3s",
        "--watch-timeout",
        "4s",
    ]);
    // Renewed every second and republished every other second: a status
    // write is never far off.
    env.create("a", lease_for("t").identity("a").durations("3s", "1s"))
        .await;
    env.wait_phase("a", Phase::Held, SOON).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    proxy.hang_open();
    let hung = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.create("b", lease_for("u").identity("b")).await;
    env.wait_phase("b", Phase::Held, Duration::from_secs(40))
        .await;
    println!(
        "b Held {:?} after the connections went silent",
        hung.elapsed()
    );

    let (_, metrics) = http_get(env.admin_port(0), "/metrics").expect("/metrics");
    let sample = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert!(
        sample("targetlease_reconcile_errors_total{category=\"api_timeout\"}") >= 1.0,
        "a request was cut at its deadline:\n{metrics}"
    );
    // The histogram's bucket just above the 3 s timeout: a reconcile whose
    // request went into the hole ends within it (the timeout, plus what the
    // reconcile did before that request), never after a second timeout.
    let all = sample("targetlease_reconcile_duration_seconds_count");
    let within = sample("targetlease_reconcile_duration_seconds_bucket{le=\"4.096\"}");
    assert_eq!(
        within, all,
        "a reconcile held its slot past the 3 s timeout (4.096 s bucket):\n{metrics}"
    );
}
