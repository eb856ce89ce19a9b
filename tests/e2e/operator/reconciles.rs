//! The operator's work grows with the work, not with its own writes: a new
//! TargetLease costs one reconcile to reach Held, because the watch events
//! of the operator's own writes (the finalizer, the Held status) trigger
//! none.

use super::*;
use support::operator_env::http_get;

fn reconciles(env: &OperatorEnv) -> f64 {
    let (_, text) = http_get(env.admin_port(0), "/metrics").expect("/metrics answers");
    text.lines()
        .find_map(|l| {
            l.strip_prefix("targetlease_reconcile_duration_seconds_count ")?
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

#[tokio::test]
async fn the_operators_own_writes_trigger_no_reconcile() {
    const N: usize = 20;
    let env = OperatorEnv::start("echoes").await;
    // A first one shows the operator synced and working.
    let lease = |i: usize| {
        lease_for(&format!("t{i}"))
            .identity("job")
            .durations("60s", "20s")
    };
    env.create("first", lease(N)).await;
    env.wait_phase("first", Phase::Held, SOON).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = reconciles(&env);
    for i in 0..N {
        env.create(&format!("job-{i}"), lease(i)).await;
    }
    for i in 0..N {
        env.wait_phase(&format!("job-{i}"), Phase::Held, SOON).await;
    }
    // Every event of their writes has arrived (and would have run by now).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let spent = reconciles(&env) - before;
    eprintln!("{spent} reconciles for {N} new TargetLeases");
    // One each; more only where a write had to be retried. Under load the
    // finalizer's event can come after the status write that followed it:
    // when only the last write's version was recognised, that late echo
    // made 28 and 34 for 20 while the other test lanes ran (20 since). With
    // each finalizer and Held status triggering one more, it is 2-3 each
    // (40 for 20 seen).
    assert!(
        spent <= (N + N / 2) as f64,
        "{spent} reconciles for {N} new TargetLeases"
    );
    // Nothing runs while nothing changes (their renewals are 20 s away).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(reconciles(&env) - before, spent, "no reconcile while idle");
}

#[tokio::test]
async fn a_held_lease_is_reconciled_again_each_time_its_renewal_is_due() {
    let env = OperatorEnv::start("renewals-due").await;
    env.create(
        "renewed",
        lease_for("t").identity("job").durations("4s", "1s"),
    )
    .await;
    env.wait_phase("renewed", Phase::Held, SOON).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = reconciles(&env);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let spent = reconciles(&env) - before;
    eprintln!("{spent} reconciles in 6 s of a lease renewed every second");
    // About six: one per renewal (the keeper would renew it in Valkey, but
    // only its reconcile publishes what each renewal confirmed), and not a
    // loop that never waits.
    assert!(
        (4.0..=12.0).contains(&spent),
        "{spent} reconciles in 6 s of a lease renewed every second"
    );
    env.wait_phase("renewed", Phase::Held, SOON).await;
}

/// One watch that keeps failing holds back no renewal: here the operator may
/// no longer read pods (its Role lost the rule), so its pod watch is refused
/// each time it is made again (after 0.5 s, doubling to 3 s).
#[tokio::test]
async fn a_failing_pod_watch_holds_back_no_renewal() {
    use k8s_openapi::api::rbac::v1::Role;
    let mut env = OperatorEnv::start_without_operator("watch-fails").await;
    let dir = tempfile::tempdir().unwrap();
    let sa = "tl-operator";
    support::chart_identity::chart_service_account(env.cp, &env.ns, sa).await;
    let server = env.cp.server_url();
    let kubeconfig = support::chart_identity::service_account_kubeconfig(
        env.cp,
        &env.ns,
        sa,
        &server,
        dir.path(),
    )
    .await;
    env.run_operators_as(kubeconfig);
    env.start_operator_with(&["--watch-timeout", "1s"]);
    env.create(
        "renewed",
        lease_for("t").identity("job").durations("6s", "2s"),
    )
    .await;
    env.wait_phase("renewed", Phase::Held, SOON).await;
    // The Role that lets the operator list and watch pods loses that rule.
    let logged = env.operator_log(0).len();
    let roles: kube::Api<Role> = kube::Api::namespaced(env.client.clone(), &env.ns);
    let mut role = roles
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|r| {
            r.rules
                .iter()
                .flatten()
                .any(|rule| rule.resources.iter().flatten().any(|res| res == "pods"))
        })
        .expect("the chart's Role grants pods");
    for rule in role.rules.iter_mut().flatten() {
        if let Some(resources) = rule.resources.as_mut() {
            resources.retain(|res| res != "pods");
        }
    }
    // A rule must name a resource: one left with none goes.
    if let Some(rules) = role.rules.as_mut() {
        rules.retain(|rule| rule.resources.as_ref().is_some_and(|r| !r.is_empty()));
    }
    let rules = role.rules.clone();
    roles
        .patch(
            &role.metadata.name.clone().unwrap(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "rules": rules })),
        )
        .await
        .unwrap();
    // Its watch ends within a second and is refused from then on.
    let refusals = |from: usize| {
        env.operator_log(0)[from..]
            .matches("pods is forbidden")
            .count()
    };
    support::kube_env::eventually("the pod watch to be refused", SOON, || async {
        (refusals(logged) > 0).then_some(())
    })
    .await;
    let window = env.operator_log(0).len();
    // Six renewals in 12 s. With every trigger paused while the pod watch
    // backs off (0.5 s, doubling to 3 s, until something else comes through),
    // each renewal came up to a few seconds late: 3 or 4.
    let before = reconciles(&env);
    tokio::time::sleep(Duration::from_secs(12)).await;
    let spent = reconciles(&env) - before;
    eprintln!("{spent} reconciles in 12 s of a lease renewed every 2 s, its pod watch failing");
    assert!(refusals(window) > 0, "the pod watch was refused all along");
    assert!(
        (5.0..=12.0).contains(&spent),
        "{spent} reconciles in 12 s of a lease renewed every 2 s, its pod watch failing"
    );
}
