//! The chart's admission policies on a real API server: what the operator may
//! do to pods, and how much metadata a tenant may put on a TargetLease.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use targetlease::operator::crd::TargetLease;

use crate::cluster::{SOON, client_from, install_identity, service_account_kubeconfig};
use crate::support::kube_env::{self, eventually};

fn refused_by_marks_policy(r: &Result<Pod, kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 403
        && s.message.contains("ValidatingAdmissionPolicy")
        && s.message.contains("the targetlease operator may"))
}

/// The operator patches pods only to mark them, and only pods that opted in;
/// the chart's pod-marks policy refuses its ServiceAccount any other change
/// to a pod (RBAC cannot limit a patch to some keys or some pods), while its
/// marks go through where the pod accepts them.
#[tokio::test]
async fn the_operator_may_change_nothing_on_a_pod_but_its_marks() {
    let cp = kube_env::shared().await;
    let ns = cp.namespace("chart-marks").await;
    let release = install_identity(cp, &ns).await;
    let dir = tempfile::tempdir().unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "web-0", "namespace": ns,
                      "labels": { "app": "web", "web.targetlease.dev/candidate": "true" },
                      "annotations": { "note": "mine" } },
        "spec": { "containers": [{ "name": "web", "image": "registry.example/web:1.0" }] },
    }))
    .unwrap();
    let admin: Api<Pod> = Api::namespaced(cp.client(), &ns);
    admin
        .create(&PostParams::default(), &pod)
        .await
        .expect("create the pod");
    let kubeconfig =
        service_account_kubeconfig(cp, &ns, &release.service_account, dir.path()).await;
    let operator: Api<Pod> = Api::namespaced(client_from(&kubeconfig).await, &ns);
    let merge = |patch: Value| {
        let operator = operator.clone();
        async move {
            operator
                .patch("web-0", &PatchParams::default(), &Patch::Merge(patch))
                .await
        }
    };
    // The policy loads asynchronously: wait until it refuses (each probe a
    // real change, so one let through before that is no later no-op).
    let probes = std::sync::atomic::AtomicU32::new(0);
    eventually("the pod-marks policy to be enforced", SOON, || {
        let n = probes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let probe = json!({ "metadata": { "labels": { "probe": n.to_string() } } });
        async move { refused_by_marks_policy(&merge(probe).await).then_some(()) }
    })
    .await;

    // Its marks of the TargetLease the pod opted in to: set, changed, removed.
    let marked = merge(json!({ "metadata": {
        "labels": { "web.targetlease.dev/leader": "true" },
        "annotations": { "web.targetlease.dev/fencing-token": "7",
                         "web.targetlease.dev/expires-at": "2026-01-01T00:00:00Z" } } }))
    .await
    .expect("the operator marks the pod");
    assert_eq!(
        marked.metadata.labels.unwrap()["web.targetlease.dev/leader"],
        "true"
    );
    merge(json!({ "metadata": {
        "labels": { "web.targetlease.dev/leader": null },
        "annotations": { "web.targetlease.dev/fencing-token": "8" } } }))
    .await
    .expect("the operator changes and removes its marks");
    // Marks of a TargetLease the pod never opted in to (put there by
    // someone else) may be taken off.
    admin
        .patch(
            "web-0",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": {
                "labels": { "old.targetlease.dev/leader": "true" },
                "annotations": { "old.targetlease.dev/fencing-token": "3" } } })),
        )
        .await
        .unwrap();
    merge(json!({ "metadata": {
        "labels": { "old.targetlease.dev/leader": null },
        "annotations": { "old.targetlease.dev/fencing-token": null } } }))
    .await
    .expect("the operator removes marks the pod did not opt in to");

    // Anything else: refused.
    for (what, patch) in [
        (
            "another label",
            json!({ "metadata": { "labels": { "app": "evil" } } }),
        ),
        (
            "a new label",
            json!({ "metadata": { "labels": { "route": "me" } } }),
        ),
        (
            "a label removed",
            json!({ "metadata": { "labels": { "app": null } } }),
        ),
        (
            "another annotation",
            json!({ "metadata": { "annotations": { "note": "theirs" } } }),
        ),
        (
            "an annotation removed",
            json!({ "metadata": { "annotations": { "note": null } } }),
        ),
        (
            "the leader label of a TargetLease the pod did not opt in to",
            json!({ "metadata": { "labels": { "other.targetlease.dev/leader": "true" } } }),
        ),
        (
            "a token annotation of a TargetLease the pod did not opt in to",
            json!({ "metadata": { "annotations": { "other.targetlease.dev/fencing-token": "1" } } }),
        ),
        (
            "an expiry annotation of a TargetLease the pod did not opt in to",
            json!({ "metadata": { "annotations": { "other.targetlease.dev/expires-at": "2026-01-01T00:00:00Z" } } }),
        ),
        (
            "an opt-in label of its own making",
            json!({ "metadata": { "labels": { "other.targetlease.dev/candidate": "true" } } }),
        ),
        (
            "the opt-in label and a mark at once",
            json!({ "metadata": { "labels": { "other.targetlease.dev/candidate": "true",
                                              "other.targetlease.dev/leader": "true" } } }),
        ),
        (
            "the pod's opt-in label removed",
            json!({ "metadata": { "labels": { "web.targetlease.dev/candidate": null } } }),
        ),
        (
            "another key of the family",
            json!({ "metadata": { "labels": { "web.targetlease.dev/route": "me" } } }),
        ),
        (
            "the spec",
            json!({ "spec": { "activeDeadlineSeconds": 5 } }),
        ),
        (
            "a finalizer",
            json!({ "metadata": { "finalizers": ["example.com/hold"] } }),
        ),
    ] {
        let r = merge(patch).await;
        assert!(refused_by_marks_policy(&r), "{what}: {r:?}");
    }
    let now = admin.get("web-0").await.unwrap();
    let labels = now.metadata.labels.unwrap();
    assert_eq!(labels.get("app").map(String::as_str), Some("web"));
    assert!(!labels.contains_key("route"));
    assert!(!labels.contains_key("other.targetlease.dev/leader"));
    assert_eq!(labels["web.targetlease.dev/candidate"], "true");
    assert_eq!(now.metadata.annotations.unwrap()["note"], "mine");
    assert!(now.spec.unwrap().active_deadline_seconds.is_none());
}

fn refused_by_metadata_policy(r: &Result<TargetLease, kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 422
        && s.message.contains("ValidatingAdmissionPolicy")
        && s.message.contains("the labels, annotations, finalizers and owner references of a TargetLease may hold at most 65536 bytes"))
}

fn lease(name: &str, labels: Value, annotations: Value) -> TargetLease {
    serde_json::from_value(json!({
        "apiVersion": "targetlease.dev/v1alpha1", "kind": "TargetLease",
        "metadata": { "name": name, "labels": labels, "annotations": annotations },
        "spec": { "target": name, "holder": { "identity": "job" } },
    }))
    .unwrap()
}

/// A TargetLease with `metadata` (its name added).
fn lease_with(name: &str, mut metadata: Value) -> TargetLease {
    metadata["name"] = Value::from(name);
    serde_json::from_value(json!({
        "apiVersion": "targetlease.dev/v1alpha1", "kind": "TargetLease",
        "metadata": metadata,
        "spec": { "target": name, "holder": { "identity": "job" } },
    }))
    .unwrap()
}

/// A tenant allowed to create TargetLeases cannot make them carry more than
/// the chart's bound of labels and annotations (64 KiB by default, counted
/// in bytes of keys and values together), whichever way it spreads them; an
/// update that does not grow them is let through, so an object admitted
/// before the policy can still lose its finalizer.
#[tokio::test]
async fn a_targetlease_may_carry_only_so_much_metadata() {
    let cp = kube_env::shared().await;
    let ns = cp.namespace("chart-lease-metadata").await;
    crate::support::operator_env::install_crd(&cp.client()).await;
    let api: Api<TargetLease> = Api::namespaced(cp.client(), &ns);
    // Admitted before the policy: 200 KB of annotations (the API server's own
    // bound is 256 KiB of annotations, and none for labels).
    let before = lease("before", json!({}), json!({ "note": "n".repeat(200_000) }));
    api.create(&PostParams::default(), &before).await.unwrap();
    install_identity(cp, &ns).await;
    let probes = std::sync::atomic::AtomicU32::new(0);
    eventually("the lease-metadata policy to be enforced", SOON, || {
        let n = probes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let probe = lease(
            &format!("probe-{n}"),
            json!({}),
            json!({ "n": "n".repeat(70_000) }),
        );
        let api = api.clone();
        async move {
            refused_by_metadata_policy(&api.create(&PostParams::default(), &probe).await)
                .then_some(())
        }
    })
    .await;

    // At the bound: admitted. Keys count: 10 bytes "note" + value.
    let at = lease("at", json!({}), json!({ "note": "n".repeat(65_536 - 4) }));
    api.create(&PostParams::default(), &at)
        .await
        .expect("exactly 65536 bytes are admitted");
    // The same bound over finalizers and owner references, which the
    // operator's cache keeps, each counting 64 and 256 bytes more than its
    // text: 600 finalizers of 62 bytes (75600), 300 owners of about 270
    // bytes; 500 finalizers (63000) are admitted. One copy of the operator's
    // own finalizer is not counted, so it can always be added.
    let finalizers: Vec<String> = (0..600)
        .map(|i| format!("example.com/{i:04}{}", "f".repeat(46)))
        .collect();
    let owners: Vec<Value> = (0..300)
        .map(|i| {
            json!({ "apiVersion": "v1", "kind": "ConfigMap",
                    "name": format!("{i:04}{}", "o".repeat(249)), "uid": format!("uid-{i}") })
        })
        .collect();
    for (name, metadata) in [
        (
            "finalizers-under",
            json!({ "finalizers": finalizers[..500] }),
        ),
        (
            "at-and-mine",
            json!({ "annotations": { "note": "n".repeat(65_536 - 4) },
                    "finalizers": ["targetlease.dev/release"] }),
        ),
    ] {
        api.create(&PostParams::default(), &lease_with(name, metadata))
            .await
            .unwrap_or_else(|e| panic!("{name} is admitted: {e}"));
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
        )
        .await
        .expect("dropping finalizers shrinks the metadata");
    }
    // One byte over, as annotations, as labels, or both: refused.
    let many_labels: serde_json::Map<String, Value> = (0..1100)
        .map(|i| (format!("l{i:04}"), Value::from("v".repeat(55))))
        .collect(); // 1100 × (5 + 55) = 66000 bytes
    for (what, tl) in [
        (
            "one byte over in an annotation",
            lease("over", json!({}), json!({ "note": "n".repeat(65_536 - 3) })),
        ),
        (
            "many labels",
            lease("labels", Value::Object(many_labels), json!({})),
        ),
        (
            "labels and annotations together",
            lease(
                "both",
                json!({ "a": "x".repeat(63) }),
                json!({ "note": "n".repeat(65_536 - 4 - 1 - 63 + 1) }),
            ),
        ),
        (
            "multi-byte characters counted in bytes",
            lease("utf8", json!({}), json!({ "note": "é".repeat(32_767) })),
        ),
        (
            "many finalizers",
            lease_with("finalizers", json!({ "finalizers": finalizers })),
        ),
        (
            "many owner references",
            lease_with("owners", json!({ "ownerReferences": owners })),
        ),
        (
            "thousands of one-byte finalizers",
            lease_with("tiny-finalizers", json!({ "finalizers": vec!["a"; 2000] })),
        ),
        (
            "copies of the operator's own finalizer",
            lease_with(
                "my-finalizer-copies",
                json!({ "finalizers": vec!["targetlease.dev/release"; 1000] }),
            ),
        ),
        (
            "many tiny owner references",
            lease_with(
                "tiny-owners",
                json!({ "ownerReferences": (0..300)
                    .map(|i| json!({ "apiVersion": "v1", "kind": "A", "name": "a", "uid": format!("{i}") }))
                    .collect::<Vec<_>>() }),
            ),
        ),
        (
            "a finalizer on top of annotations at the bound",
            lease_with(
                "at-and-finalizer",
                json!({ "annotations": { "note": "n".repeat(65_536 - 4) },
                        "finalizers": ["example.com/x"] }),
            ),
        ),
    ] {
        let r = api.create(&PostParams::default(), &tl).await;
        assert!(refused_by_metadata_policy(&r), "{what}: {r:?}");
    }
    // Grown by an update: refused.
    let grow = api
        .patch(
            "at",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "more": "x" } } })),
        )
        .await;
    assert!(refused_by_metadata_policy(&grow), "{grow:?}");
    let grow = api
        .patch(
            "at",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": ["example.com/x"] } })),
        )
        .await;
    assert!(refused_by_metadata_policy(&grow), "a finalizer: {grow:?}");
    // The old object is already over, and not growing: a finalizer comes and
    // goes (what the operator does), and shrinking is fine.
    for finalizers in [json!(["targetlease.dev/release"]), json!(null)] {
        api.patch(
            "before",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": finalizers } })),
        )
        .await
        .expect("an update that does not grow the metadata");
    }
    let grown = api
        .patch(
            "before",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { "more": "x" } } })),
        )
        .await;
    assert!(refused_by_metadata_policy(&grown), "{grown:?}");
    api.patch(
        "before",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "annotations": { "note": "short" } } })),
    )
    .await
    .expect("shrinking is admitted");
}
