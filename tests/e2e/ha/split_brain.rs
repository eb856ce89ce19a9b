//! A leader cut off from the API server must stop writing before the standby
//! takes over, and must not write again when it comes back.
//!
//! Each replica runs as its own ServiceAccount (the chart's RBAC) through its
//! own cuttable proxy to kube-apiserver; the API server's audit log, not the
//! operators' own logs, says who wrote what and when.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::{SOON, election, is_leader, spec, start_operator};
use crate::support::audit::{self, Write};
use crate::support::chart_identity::{chart_service_account, service_account_kubeconfig};
use crate::support::kube_env::eventually;
use crate::support::operator_env::{OperatorEnv, http_get, summary};
use crate::support::tcp_proxy::TcpProxy;
use targetlease::operator::crd::Phase;

/// Every `targetlease_leases` sample of operator `i`, e.g. `{phase="Held"} 2`.
fn phase_samples(env: &OperatorEnv, i: usize) -> Vec<String> {
    let (_, text) = http_get(env.admin_port(i), "/metrics").expect("/metrics answers");
    text.lines()
        .filter_map(|l| l.strip_prefix("targetlease_leases"))
        .filter(|l| l.starts_with('{'))
        .map(String::from)
        .collect()
}

fn observed_generation_is_current(tl: &targetlease::operator::crd::TargetLease) -> bool {
    tl.status.as_ref().and_then(|s| s.observed_generation) == tl.metadata.generation
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_stops_writing_before_the_standby_takes_over() {
    let mut env = OperatorEnv::start_without_operator("split").await;
    let (cp, ns) = (env.cp, env.ns.clone());
    let dir = tempfile::tempdir().unwrap();
    let upstream: SocketAddr = cp
        .server_url()
        .trim_start_matches("https://")
        .parse()
        .expect("the API server listens on 127.0.0.1:PORT");
    let proxies = [TcpProxy::start(upstream), TcpProxy::start(upstream)];
    // Lease 6s, renew deadline 4s, retry 1s: the leader's gate closes at most
    // 4s after its last successful renewal was sent; the standby waits at
    // least 6s after it saw that renewal.
    let flags = election(&env, "6s", "4s", "1s");
    let mut users = Vec::new();
    for (i, sa) in ["operator-a", "operator-b"].into_iter().enumerate() {
        users.push(chart_service_account(cp, &ns, sa).await);
        let server = format!("https://127.0.0.1:{}", proxies[i].port);
        let kubeconfig = service_account_kubeconfig(cp, &ns, sa, &server, dir.path()).await;
        env.run_operators_as(kubeconfig);
        assert_eq!(start_operator(&mut env, &flags), i);
        if i == 0 {
            eventually("operator-a to lead", SOON, || async {
                is_leader(&env, 0).filter(|l| *l)
            })
            .await;
        }
    }
    let (old, new) = (0, 1);
    eventually("operator-b to stand by", SOON, || async {
        is_leader(&env, new).filter(|l| !*l)
    })
    .await;
    env.create("job", spec("t")).await;
    let token = summary(&env.wait_phase("job", Phase::Held, SOON).await).2;

    // Cut the leader off. Both replicas still reach Valkey.
    let cut = Instant::now();
    proxies[old].cut();
    let (mut old_down, mut new_up) = (None, None);
    while new_up.is_none() {
        assert!(
            cut.elapsed() < Duration::from_secs(30),
            "operator-b never took over; old leader log:\n{}\nstandby log:\n{}",
            env.operator_log(old),
            env.operator_log(new)
        );
        if old_down.is_none() && is_leader(&env, old) == Some(false) {
            old_down = Some(cut.elapsed());
        }
        if is_leader(&env, new) == Some(true) {
            new_up = Some(cut.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    eprintln!(
        "after the cut: operator-a stopped leading at {old_down:?}, operator-b led at {new_up:?}"
    );

    // Work the stale replica would act on if it still ran: a new lease, and a
    // spec edit of the one it held (its status must follow the generation).
    let api = env.api();
    env.create("during", spec("u")).await;
    let edit = |interval: &str| json!({ "spec": { "renewInterval": interval } });
    api.patch("job", &PatchParams::default(), &Patch::Merge(edit("3s")))
        .await
        .expect("edit job");
    env.wait_phase("during", Phase::Held, SOON).await;
    env.wait_for(
        "job",
        "observed by the new leader",
        SOON,
        observed_generation_is_current,
    )
    .await;

    // Let the old leader back in, give it more work, and time to misbehave.
    proxies[old].restore();
    tokio::time::sleep(Duration::from_secs(3)).await;
    api.patch("during", &PatchParams::default(), &Patch::Merge(edit("3s")))
        .await
        .expect("edit during");
    env.wait_for("during", "observed", SOON, observed_generation_is_current)
        .await;
    tokio::time::sleep(Duration::from_secs(8)).await;

    // What the API server saw.
    let writes = audit::writes_in(cp, &ns);
    let took_over = by_user(&writes, &users[new])
        .filter(|w| w.resource == "leases" && w.succeeded())
        .map(|w| w.received)
        .min()
        .expect("the new leader's Lease write is in the audit log");
    assert!(
        by_user(&writes, &users[old])
            .any(|w| w.resource == "targetleases/status" && w.received < took_over),
        "the audit log shows the old leader writing status before the cut (else this test proves nothing):\n{}",
        list(by_user(&writes, &users[old]))
    );
    // Losing the race for the Lease is allowed (a refused write changes
    // nothing); any other write after the takeover is a split brain.
    let late: Vec<&Write> = by_user(&writes, &users[old])
        .filter(|w| w.received > took_over)
        .filter(|w| w.resource != "leases" || w.succeeded())
        .collect();
    assert!(
        late.is_empty(),
        "the old leader wrote after the new leader took over at {took_over}:\n{}\nold leader log:\n{}",
        list(late.into_iter()),
        env.operator_log(old)
    );
    assert!(
        by_user(&writes, &users[new])
            .any(|w| w.resource == "targetleases/status" && w.name == "during"),
        "the new leader published the lease created during the cut"
    );

    // The gate closed before the standby could start, as the replicas saw it.
    let old_down = old_down.expect("operator-a reported targetlease_leader 0 while cut off");
    assert!(
        old_down < new_up.unwrap(),
        "operator-a stopped leading {old_down:?} after the cut, operator-b led at {new_up:?}"
    );
    // Metrics: the old leader counts nothing, the new one counts every lease once.
    assert_eq!(is_leader(&env, old), Some(false));
    let stale = phase_samples(&env, old);
    assert!(
        stale.iter().all(|s| s.ends_with(" 0")),
        "a replica that does not lead reports leases: {stale:?}"
    );
    assert_eq!(is_leader(&env, new), Some(true));
    assert!(
        phase_samples(&env, new).contains(&"{phase=\"Held\"} 2".to_string()),
        "{:?}",
        phase_samples(&env, new)
    );
    let job = api.get("job").await.unwrap();
    assert_eq!(summary(&job), (Some(Phase::Held), Some("t".into()), token));
}

fn by_user<'a>(writes: &'a [Write], user: &'a str) -> impl Iterator<Item = &'a Write> {
    writes.iter().filter(move |w| w.user == user)
}

fn list<'a>(writes: impl Iterator<Item = &'a Write>) -> String {
    writes.map(|w| format!("  {w}\n")).collect()
}
