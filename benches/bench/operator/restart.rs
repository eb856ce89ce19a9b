//! Restart: kill -9 the operator, start another, count new tokens and status writes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kube::api::Api;
use serde_json::json;
use targetlease::operator::crd::TargetLease;
use targetlease::store::valkey::{ValkeyConfig, ValkeyStore};
use targetlease::store::{LeaseStore, Target};

use super::objects::create_all;
use super::process::{Operator, apiserver_metrics, renews, tl_writes};
use super::{Bench, Restart, Results};
use crate::tracker::Tracker;

pub(super) async fn restart(
    b: &Bench<'_>,
    ns: &str,
    mut op: Operator,
    tracker: &Tracker,
    n: usize,
    results: &mut Results,
) -> Operator {
    // Restart: kill -9, start again, count new tokens and status writes.
    eprintln!("bench: operator restart with {n} leases");
    let store = ValkeyStore::connect(&ValkeyConfig {
        url: b.valkey.url(),
        ..ValkeyConfig::default()
    })
    .await
    .expect("connect to the bench valkey");
    let valkey_tokens = |names: Vec<String>| {
        let (store, ns) = (&store, &ns);
        async move {
            let mut out = HashMap::new();
            for name in names {
                let t = Target::new(*ns, name.as_str());
                let token = store
                    .get(&t)
                    .await
                    .ok()
                    .and_then(|r| r.lease)
                    .map(|l| l.fencing_token);
                out.insert(name, token);
            }
            out
        }
    };
    // Leases whose status is not due for republishing during the restart
    // (leaseDuration 1h): any write to them is re-adoption cost. The default
    // leases keep their 60 s republish schedule across the restart.
    let quiet_n = n / 10;
    let quiet: Vec<TargetLease> = (0..quiet_n)
        .map(|i| {
            serde_json::from_value(json!({
                "apiVersion": "targetlease.dev/v1alpha1",
                "kind": "TargetLease",
                "metadata": { "name": format!("quiet-{i:05}"), "namespace": ns },
                "spec": { "target": format!("quiet-{i:05}"), "holder": { "identity": "q" },
                          "leaseDuration": "1h", "renewInterval": "30s" },
            }))
            .expect("a valid TargetLease")
        })
        .collect();
    let api: Api<TargetLease> = Api::namespaced(b.client.clone(), ns);
    create_all(&api, quiet, b.p.create_parallelism).await;
    tracker
        .wait(Duration::from_secs(120), |t| t.held_count() >= n + quiet_n)
        .await
        .expect("the 1h leases Held");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen_before = tracker.snapshot();
    let names: Vec<String> = seen_before.keys().cloned().collect();
    let tokens_before = valkey_tokens(names.clone()).await;
    op.kill();
    let changes_before = tracker.changes();
    let api_before = apiserver_metrics(&b.client).await;
    let restarted = Instant::now();
    let op2 = Operator::start(&b.cp, &b.valkey, ns, b.dir.path(), 99);
    assert!(
        op2.wait_ready(Duration::from_secs(60)).await,
        "restarted operator not ready"
    );
    let ready_secs = restarted.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut all_renewed = None;
    while Instant::now() < deadline {
        if renews(&op2.metrics()) >= (n + quiet_n) as f64 {
            all_renewed = Some(restarted.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let api_after = apiserver_metrics(&b.client).await;
    let tokens_after = valkey_tokens(names).await;
    let seen_after = tracker.snapshot();
    results.restart = Some(Restart {
        leases: n + quiet_n,
        new_tokens: tokens_before
            .iter()
            .filter(|(k, v)| tokens_after.get(*k) != Some(v))
            .count(),
        tokens_changed_in_status: seen_before
            .iter()
            .filter(|(k, v)| seen_after.get(*k).map(|s| s.token) != Some(v.token))
            .count(),
        tl_writes: tl_writes(&api_after, false) - tl_writes(&api_before, false),
        tl_objects_changed: tracker.changes() - changes_before,
        quiet_leases: quiet_n,
        quiet_changed: seen_before
            .iter()
            .filter(|(k, v)| {
                k.starts_with("quiet-")
                    && seen_after.get(*k).map(|s| &s.resource_version) != Some(&v.resource_version)
            })
            .count(),
        ready_secs,
        all_renewed_secs: all_renewed,
        renews: renews(&op2.metrics()),
    });

    op2
}
