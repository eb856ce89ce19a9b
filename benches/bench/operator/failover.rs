//! Leader failover: delete the elected pod, time the new leader in status and on the pods.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use targetlease::operator::crd::TargetLease;

use super::objects::candidate_pod;
use super::{Bench, Results};
use crate::tracker::Tracker;

pub(super) async fn failover(b: &Bench<'_>, ns: &str, tracker: &Tracker, results: &mut Results) {
    // Leader failover: delete the elected pod, time the new leader.
    eprintln!("bench: leader failover, {} trials", b.p.failover_trials);
    let pods: Api<Pod> = Api::namespaced(b.client.clone(), ns);
    let api: Api<TargetLease> = Api::namespaced(b.client.clone(), ns);
    for i in 0..b.p.failover_trials {
        let app = format!("fo-{i:03}");
        candidate_pod(&pods, &format!("{app}-0"), &app).await;
        candidate_pod(&pods, &format!("{app}-1"), &app).await;
        let tl: TargetLease = serde_json::from_value(json!({
            "apiVersion": "targetlease.dev/v1alpha1",
            "kind": "TargetLease",
            "metadata": { "name": app, "namespace": ns },
            "spec": { "target": app, "candidates": { "podSelector": { "matchLabels": { "app": app } } } },
        }))
        .unwrap();
        api.create(&PostParams::default(), &tl)
            .await
            .expect("create election lease");
    }
    let ft = b.p.failover_trials;
    tracker
        .wait(Duration::from_secs(60), |t| {
            (0..ft).all(|i| {
                let app = format!("fo-{i:03}");
                t.get(&app)
                    .filter(|s| s.held())
                    .and_then(|s| s.holder)
                    .is_some_and(|h| t.is_leader(&h))
            })
        })
        .await
        .expect("every election Held and its leader marked");
    for i in 0..b.p.failover_trials {
        let app = format!("fo-{i:03}");
        let leader = tracker.get(&app).and_then(|s| s.holder).expect("a leader");
        let other = if leader.ends_with("-0") {
            format!("{app}-1")
        } else {
            format!("{app}-0")
        };
        let t0 = Instant::now();
        pods.delete(&leader, &DeleteParams::default().grace_period(0))
            .await
            .expect("delete the leader pod");
        let moved = tracker
            .wait(Duration::from_secs(30), |t| {
                t.get(&app)
                    .is_some_and(|s| s.held() && s.holder.as_deref() == Some(other.as_str()))
            })
            .await;
        let marked = tracker
            .wait(Duration::from_secs(30), |t| t.is_leader(&other))
            .await;
        match (moved, marked) {
            (Some(a), Some(b)) => {
                results.failover_status.push(a - t0);
                results.failover_marked.push(b - t0);
            }
            _ => results.failover_failures += 1,
        }
        if results.failover_failures >= 3 {
            eprintln!("bench: failover: 3 trials timed out, stopping the series");
            break;
        }
    }
}
