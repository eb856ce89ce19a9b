//! The objects the bench creates: TargetLeases, candidate pods, and a
//! client-go-style Lease renewed as the baseline.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use targetlease::operator::crd::TargetLease;

/// TargetLease `name` on a target of the same name.
pub(super) fn holder_lease(name: &str, ns: &str, identity: &str) -> TargetLease {
    contended(name, ns, name, identity)
}

/// Creates `names` (target, object name) with `par` requests in flight; returns
/// the instant the last create returned.
pub(super) async fn create_all(
    api: &Api<TargetLease>,
    objs: Vec<TargetLease>,
    par: usize,
) -> Instant {
    let results: Vec<_> = futures::stream::iter(objs)
        .map(|o| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &o).await }
        })
        .buffer_unordered(par)
        .collect()
        .await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    assert_eq!(
        failed,
        0,
        "some creates failed: {:?}",
        results.iter().find(|r| r.is_err())
    );
    Instant::now()
}

/// A client-go-style leader Lease renewed every 2 s (Update of renewTime),
/// the write rate the steady-state figure is compared with.
pub(super) async fn renew_lease_every_2s(
    client: Client,
    ns: String,
    stop: tokio::sync::watch::Receiver<bool>,
) -> u64 {
    let api: Api<Lease> = Api::namespaced(client, &ns);
    let mut lease: Lease = serde_json::from_value(json!({
        "metadata": { "name": "client-go-style" },
        "spec": { "holderIdentity": "bench", "leaseDurationSeconds": 15 },
    }))
    .unwrap();
    lease = api
        .create(&PostParams::default(), &lease)
        .await
        .expect("create Lease");
    let mut writes = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.tick().await;
    while !*stop.borrow() {
        tick.tick().await;
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        match api
            .replace("client-go-style", &PostParams::default(), &lease)
            .await
        {
            Ok(l) => {
                lease = l;
                writes += 1;
            }
            Err(_) => lease = api.get("client-go-style").await.expect("get Lease"),
        }
    }
    writes
}

/// A Ready pod labelled `app`, opted in to the election of the same name.
pub(super) async fn candidate_pod(pods: &Api<Pod>, name: &str, app: &str) {
    let opt_in = format!("{app}.targetlease.dev/candidate");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": { "app": app, opt_in: "true" } },
        "spec": { "containers": [{ "name": "app", "image": "registry.example/app:1.0" }] },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    // No kubelet: readiness goes through the status subresource.
    let status = json!({ "status": { "conditions": [{ "type": "Ready", "status": "True" }] } });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("set pod Ready");
}

/// TargetLease `name` on `target`, which other TargetLeases may want too.
pub(super) fn contended(name: &str, ns: &str, target: &str, identity: &str) -> TargetLease {
    serde_json::from_value(json!({
        "apiVersion": "targetlease.dev/v1alpha1",
        "kind": "TargetLease",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "target": target, "holder": { "identity": identity } },
    }))
    .expect("a valid TargetLease")
}
