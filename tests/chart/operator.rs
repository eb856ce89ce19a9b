//! The operator binary running as the chart's ServiceAccount, with only the
//! chart's RBAC, under the chart's admission policy.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::json;
use targetlease::operator::crd::Phase;
use targetlease::store::valkey::{ValkeyConfig, ValkeyStore};
use targetlease::store::{LeaseStore, Outcome, RevokeRequest, Target};

use crate::cluster::{SOON, install_identity, service_account_kubeconfig, wait_policy_enforced};
use crate::support::kube_env::eventually;
use crate::support::operator_env::{OperatorEnv, apply_example, summary};

/// The pods of the example's election, opted in to TargetLease `web-leader`.
const WEB: &[(&str, &str)] = &[
    ("app", "web"),
    ("web-leader.targetlease.dev/candidate", "true"),
];

/// The end-to-end flows with the operator authenticated as the chart's
/// ServiceAccount, holding only the chart's RBAC, under the chart's policy.
#[tokio::test]
async fn the_operator_runs_as_the_chart_service_account() {
    let mut env = OperatorEnv::start_without_operator("chart-rbac").await;
    let cp = env.cp;
    let ns = env.ns.clone();
    let release = install_identity(cp, &ns).await;

    // The policy is in force before the operator writes anything.
    env.create(
        "policy-probe",
        json!({ "target": "probe", "holder": { "identity": "x" } }),
    )
    .await;
    wait_policy_enforced(cp, &ns, "policy-probe").await;
    env.delete("policy-probe").await;
    env.wait_gone("policy-probe", SOON).await;

    // Run the binary as the ServiceAccount, with the chart's own settings for
    // the floor ConfigMap and leader election (OperatorEnv sets the namespaces).
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig =
        service_account_kubeconfig(cp, &ns, &release.service_account, dir.path()).await;
    let chart_args: Vec<String> = release
        .rendered
        .args()
        .into_iter()
        .filter(|a| {
            a.starts_with("--floor-configmap")
                || a == "--leader-election"
                || a.starts_with("--leader-election-lease")
        })
        .collect();
    assert_eq!(chart_args.len(), 3, "{chart_args:?}");
    env.run_operators_as(kubeconfig);
    let extra: Vec<&str> = chart_args.iter().map(String::as_str).collect();
    env.start_operator_with(&extra);

    // Apply -> Held with a token, finalizer set.
    let spec = |id: &str| json!({ "target": "orders-db", "holder": { "identity": id } });
    env.create("job-a", spec("job-a")).await;
    let a = env.wait_phase("job-a", Phase::Held, SOON).await;
    assert_eq!(
        summary(&a),
        (Some(Phase::Held), Some("job-a".into()), Some(1))
    );
    assert!(
        a.finalizers()
            .contains(&"targetlease.dev/release".to_string())
    );

    // Two leases on one target hand off when the holder is deleted.
    env.create("job-b", spec("job-b")).await;
    env.wait_phase("job-b", Phase::Pending, SOON).await;
    env.delete("job-a").await;
    env.wait_gone("job-a", SOON).await;
    let b = env.wait_phase("job-b", Phase::Held, SOON).await;
    assert_eq!(summary(&b).2, Some(2));

    // Deletion releases in Valkey and records the token floor in the ConfigMap.
    env.delete("job-b").await;
    env.wait_gone("job-b", SOON).await;
    let store = ValkeyStore::connect(&ValkeyConfig {
        url: env.valkey.url(),
        ..ValkeyConfig::default()
    })
    .await
    .expect("connect to the test valkey");
    let got = store.get(&Target::new(&ns, "orders-db")).await.unwrap();
    assert_eq!(got.outcome, Outcome::NotFound, "released in Valkey");
    let floors = Api::<ConfigMap>::namespaced(cp.client(), &ns)
        .list(
            &ListParams::default().labels("targetlease.dev/token-floors=targetlease-token-floors"),
        )
        .await
        .expect("the token floor ConfigMaps, written by the operator");
    let key = targetlease::operator::floor::floor_key(&ns, "orders-db");
    assert!(
        floors.items.into_iter().any(|cm| {
            let data = cm.data.unwrap_or_default();
            data.contains_key(&key)
                && targetlease::operator::floor::ledger::floor_in(&data, &key) == 2
        }),
        "floor records token 2"
    );

    // Leader election among pods: mark one, fail over with a larger token.
    env.create_pod("web-0", WEB, true).await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // distinct creation times
    env.create_pod("web-1", WEB, true).await;
    apply_example(&env, "leader-election.yaml").await;
    env.wait_led_by("web-leader", "web-0", 1, SOON).await;
    Api::<Pod>::namespaced(cp.client(), &ns)
        .delete("web-0", &Default::default())
        .await
        .unwrap();
    env.wait_led_by("web-leader", "web-1", 2, SOON).await;

    // Events were recorded, and the operator leads through the chart's Lease.
    let events: Api<Event> = Api::namespaced(cp.client(), &ns);
    eventually("an Acquired event", SOON, || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("Acquired")
                        && e.reporting_controller.as_deref() == Some("targetlease-operator")
                })
                .then_some(())
        }
    })
    .await;
    let lease_name = chart_args
        .iter()
        .find_map(|a| a.strip_prefix("--leader-election-lease="))
        .unwrap();
    let lease = Api::<Lease>::namespaced(cp.client(), &ns)
        .get(lease_name)
        .await
        .expect("the leader-election Lease");
    assert!(
        lease
            .spec
            .and_then(|s| s.holder_identity)
            .is_some_and(|h| !h.is_empty()),
        "a replica holds the Lease"
    );

    // A lease that ends in Valkey without being given back (here: revoked)
    // is lost, and counted once (the counter starts at zero); the operator
    // then acquires the target again, with the next token.
    let lost = || async {
        sample(
            &scrape(env.admin_port(0)).await,
            "targetlease_leases_lost_total",
        )
    };
    assert_eq!(lost().await, 0.0);
    env.create(
        "job-c",
        json!({ "target": "payments", "holder": { "identity": "job-c" },
                "leaseDuration": "4s", "renewInterval": "1s" }),
    )
    .await;
    env.wait_phase("job-c", Phase::Held, SOON).await;
    let revoked = store
        .revoke(&RevokeRequest::new(Target::new(&ns, "payments")))
        .await
        .unwrap();
    assert_eq!(revoked.outcome, Outcome::Revoked);
    env.wait_for("job-c", "held again with token 2", SOON, |tl| {
        summary(tl) == (Some(Phase::Held), Some("job-c".into()), Some(2))
    })
    .await;
    eventually("the lost lease counted", SOON, || async {
        (lost().await == 1.0).then_some(())
    })
    .await;

    // Every kind of write the flows above made was counted once it reached
    // the API server (the client counts them, so none can be missed).
    let metrics = scrape(env.admin_port(0)).await;
    for kind in ["status", "finalizer", "pod_mark", "floor", "event"] {
        let line = format!("targetlease_api_writes_total{{kind=\"{kind}\"}} ");
        let n: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("no {line} in\n{metrics}"))
            .trim()
            .parse()
            .unwrap();
        assert!(n >= 1.0, "{line}{n}");
    }
    for line in ["targetlease_backend_up 1", "targetlease_leader 1"] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    assert!(metrics.contains("targetlease_leases_lost_total "));
    assert!(metrics.contains("targetlease_build_info{version="));
    assert!(metrics.contains("targetlease_process_resident_memory_bytes "));

    let log = env.operator_log(0);
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the operator was refused something:\n{log}"
    );
}

/// The value of the sample named exactly `name` (no labels).
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
        .trim()
        .parse()
        .unwrap()
}

/// `GET /metrics` on the admin port.
async fn scrape(port: u16) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the admin port");
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).await.unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    reply
}
