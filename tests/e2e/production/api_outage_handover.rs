//! An API-server outage longer than the leases that ends with a change of
//! operator leader (the chart runs two replicas): the replica that takes over
//! has no confirmation of its own of any lease, and every published expiry
//! has passed. It renews each lease with its published handle before it
//! withdraws anything, so the lease stays Held with the same token and its
//! pod keeps its marks; the former leader's keeper lets go once it sees the
//! new leader renew the lease.

use std::time::Instant;

use super::api_outage::lease_stays_live;
use super::*;
use support::operator_env::http_get;
use support::tcp_proxy::TcpProxy;
use support::timeline::{Change, Timeline};

/// leaseDuration of the lease under test; the outage lasts 2.5 times as long.
const LEASE: Duration = Duration::from_secs(8);

/// Whether operator `i`'s write gate is open (`None`: its admin server is silent).
fn leads(env: &OperatorEnv, i: usize) -> Option<bool> {
    http_get(env.admin_port(i), "/metrics")
        .map(|(_, m)| m.lines().any(|l| l == "targetlease_leader 1"))
}

/// Renewals operator `i` has sent (its reconciles' and its keeper's).
fn renewals(env: &OperatorEnv, i: usize) -> f64 {
    let (_, metrics) = http_get(env.admin_port(i), "/metrics").expect("/metrics");
    metrics
        .lines()
        .filter(|l| l.starts_with("targetlease_store_calls_total{operation=\"renew\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Promise: the return of the API server costs no published lease even when
/// another replica leads afterwards. Two replicas with leader election, each
/// reaching kube-apiserver through a proxy of its own. kube-apiserver hangs
/// (SIGSTOP) for 2.5 × leaseDuration while the leader's keeper renews the
/// lease in Valkey; just before it resumes, the leader is cut off from it,
/// so the standby wins the election with no confirmation of the lease and
/// its published expiry long passed. Every version of the TargetLease is
/// Held with the same token and every version of the holder pod carries its
/// marks; once the former leader reaches the API server again it sees the
/// new leader, and stops renewing once Valkey shows the new leader's renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_after_an_api_outage_keeps_the_lease_held_and_its_marks() {
    let mut env = OperatorEnv::start_on_own_control_plane("api-handover").await;
    let ns = env.ns.clone();
    let upstream: std::net::SocketAddr = env
        .cp
        .server_url()
        .trim_start_matches("https://")
        .parse()
        .unwrap();
    let flags = [
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
    ];
    let (to_a, to_b) = (TcpProxy::start(upstream), TcpProxy::start(upstream));
    env.run_operators_as(env.kubeconfig_via(to_a.port));
    let a = env.start_operator_with(&flags);
    eventually("the first replica to lead", SOON, || async {
        leads(&env, a).filter(|l| *l)
    })
    .await;
    env.run_operators_as(env.kubeconfig_via(to_b.port));
    let b = env.start_operator_with(&flags);
    eventually("the second replica to stand by", SOON, || async {
        leads(&env, b).filter(|l| !*l)
    })
    .await;

    let timeline = Timeline::record(&env.client, &ns);
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

    let published = env.api().get("job").await.unwrap().status.unwrap();
    let published = ms(&published.expires_at).expect("a published expiry");
    env.pause_apiserver(true);
    let moved = lease_stays_live(&env, "t", token, LEASE * 5 / 2).await;
    to_a.cut();
    env.pause_apiserver(false);
    let back = Instant::now();
    assert!(
        published < now_ms(),
        "the published expiry passed during the outage"
    );
    eventually("the standby to lead", Duration::from_secs(30), || async {
        leads(&env, b).filter(|l| *l)
    })
    .await;
    println!(
        "the standby leads {:?} after the API server returned",
        back.elapsed()
    );
    assert!(moved >= 4, "the expiry moved only {moved} times");
    env.wait_for(
        "job",
        "Held with a fresh expiry",
        Duration::from_secs(40),
        |tl| {
            let s = tl.status.clone().unwrap_or_default();
            s.phase == Some(Phase::Held) && ms(&s.expires_at).is_some_and(|e| e > now_ms())
        },
    )
    .await;
    println!(
        "republished {:?} after the API server returned",
        back.elapsed()
    );
    // A few renewals by the new leader.
    tokio::time::sleep(LEASE).await;

    to_a.restore();
    eventually(
        "the former leader to leave the renewals to the new one",
        Duration::from_secs(30),
        || async {
            env.operator_log(a)
                .contains("the new leader renewed the lease; leaving it to that replica")
                .then_some(())
        },
    )
    .await;
    let before = renewals(&env, a);
    // Its keeper would renew at least twice in this time.
    tokio::time::sleep(LEASE).await;
    assert_eq!(renewals(&env, a), before, "the former leader still renews");
    assert_eq!(leads(&env, a), Some(false));
    env.wait_led_by("job", "w", token, SOON).await;

    // Every version, as the watches delivered them.
    let versions = timeline.lease_versions("job");
    let first_held = versions
        .iter()
        .position(|(_, _, tl)| {
            tl.as_ref()
                .is_some_and(|t| summary(t).0 == Some(Phase::Held))
        })
        .expect("a Held version");
    let flaps: Vec<_> = versions[first_held..]
        .iter()
        .filter_map(|(rv, _, tl)| {
            let tl = tl.as_ref()?;
            let (phase, _, t) = summary(tl);
            (phase != Some(Phase::Held) || t != Some(token))
                .then(|| format!("rv {rv}: {:?} {:?}", summary(tl), reason(tl)))
        })
        .collect();
    let leader_label = "job.targetlease.dev/leader";
    let token_annotation = "job.targetlease.dev/fencing-token";
    let pod_versions: Vec<_> = timeline
        .entries()
        .into_iter()
        .filter_map(|e| match e.change {
            Change::Pod(name, pod) if name == "w" => Some((e.rv, pod)),
            _ => None,
        })
        .collect();
    let first_marked = pod_versions
        .iter()
        .position(|(_, p)| {
            p.as_ref()
                .is_some_and(|p| p.labels().contains_key(leader_label))
        })
        .expect("a marked version of the pod");
    let unmarked: Vec<_> = pod_versions[first_marked..]
        .iter()
        .filter(|(_, p)| {
            !p.as_ref().is_some_and(|p| {
                p.labels().get(leader_label).map(String::as_str) == Some("true")
                    && p.annotations().get(token_annotation) == Some(&token.to_string())
            })
        })
        .map(|(rv, p)| format!("rv {rv}: {:?}", p.as_ref().map(|p| p.labels())))
        .collect();
    assert!(
        flaps.is_empty() && unmarked.is_empty(),
        "job was not Held throughout: {flaps:?}\nthe pod lost its marks: {unmarked:?}"
    );
    let violations = timeline.violations();
    assert!(violations.is_empty(), "{violations:#?}");
}
