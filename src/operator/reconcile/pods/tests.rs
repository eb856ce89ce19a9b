use super::*;

/// A pod as the API server sends it: spec, managed fields, other tools'
/// annotations, several conditions.
fn full_pod() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0", "namespace": "shop", "uid": "u-1",
            "resourceVersion": "42", "generateName": "web-",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionTimestamp": "2026-01-02T00:00:00Z",
            "labels": {
                "app": "web", "tl.targetlease.dev/leader": "true",
                "tl.targetlease.dev/candidate": "true",
            },
            "annotations": {
                "tl.targetlease.dev/fencing-token": "7",
                "db.targetlease.dev/expires-at": "2026-01-01T00:00:00Z",
                "kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z",
            },
            "finalizers": ["example.com/keep"],
            "ownerReferences": [{ "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "s-1" }],
            "managedFields": [{ "manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": { "f:status": {} } }],
        },
        "spec": { "containers": [{ "name": "app", "image": "registry.example/app:1" }] },
        "status": {
            "phase": "Running",
            "conditions": [
                { "type": "PodScheduled", "status": "True" },
                { "type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z" },
            ],
            "containerStatuses": [{ "name": "app", "ready": true, "restartCount": 0, "image": "x", "imageID": "y" }],
        },
    })
}

#[test]
fn the_cache_keeps_what_the_planner_and_the_marks_read() {
    let mut pod: CachedPod = serde_json::from_value(full_pod()).unwrap();
    pod.slim();
    let meta = &pod.metadata;
    assert_eq!(pod.name_any(), "web-0");
    assert_eq!(meta.namespace.as_deref(), Some("shop"));
    assert_eq!(meta.uid.as_deref(), Some("u-1"));
    assert_eq!(meta.resource_version.as_deref(), Some("42"));
    assert!(meta.creation_timestamp.is_some() && meta.deletion_timestamp.is_some());
    assert_eq!(
        pod.labels().len(),
        3,
        "every label of a pod that opted in: selectors read them"
    );
    assert!(!pod.labels_dropped);
    assert_eq!(
        pod.annotations().keys().collect::<Vec<_>>(),
        [
            "db.targetlease.dev/expires-at",
            "tl.targetlease.dev/fencing-token"
        ],
        "our annotations only"
    );
    assert!(meta.managed_fields.is_none() && meta.owner_references.is_none());
    assert!(meta.finalizers.is_none() && meta.generate_name.is_none());
    assert_eq!(
        pod.status.and_then(|s| s.conditions),
        Some(vec![CachedCondition {
            type_: "Ready".into(),
            status: "True".into()
        }])
    );
}

/// Annotations under our domain that anyone who may create pods can add:
/// the cache keeps only the two marks it reads, short, and at most as many
/// as it keeps labels; a 250 KB `pad.targetlease.dev/x` is not kept.
#[test]
fn the_cache_keeps_no_annotation_the_operator_does_not_read() {
    let mut json = full_pod();
    let annotations = json["metadata"]["annotations"].as_object_mut().unwrap();
    annotations.insert("pad.targetlease.dev/x".into(), "x".repeat(250_000).into());
    annotations.insert(
        "big.targetlease.dev/fencing-token".into(),
        "9".repeat(1000).into(),
    );
    for i in 0..5_000 {
        annotations.insert(
            format!("n{i:05}.targetlease.dev/expires-at"),
            "2026-01-01T00:00:00Z".into(),
        );
    }
    let mut pod: CachedPod = serde_json::from_value(json).unwrap();
    pod.slim();
    let kept = pod.annotations();
    assert_eq!(
        kept.len(),
        MAX_KEPT_LABELS,
        "{:?}",
        kept.keys().take(3).collect::<Vec<_>>()
    );
    assert!(kept.values().all(|v| v.len() <= MAX_MARK_VALUE_BYTES));
    assert!(!kept.contains_key("pad.targetlease.dev/x"));
    assert!(!kept.contains_key("big.targetlease.dev/fencing-token"));
    assert!(
        kept.contains_key("db.targetlease.dev/expires-at"),
        "the first ones by key stay"
    );
}

/// Labels anyone who may create pods can add, as many and as large as the
/// API server takes: the cache keeps none of them for a pod that opted in to
/// nothing, and for one that opted in only ours once they pass the bounds.
#[test]
fn the_cache_keeps_no_labels_the_operator_does_not_read() {
    let mut json = full_pod();
    let labels = json["metadata"]["labels"].as_object_mut().unwrap();
    labels.remove("tl.targetlease.dev/candidate");
    for i in 0..2000 {
        labels.insert(format!("example.com/noise-{i:04}"), "x".repeat(63).into());
    }
    let mut bystander: CachedPod = serde_json::from_value(json.clone()).unwrap();
    bystander.slim();
    assert_eq!(
        bystander.labels().keys().collect::<Vec<_>>(),
        ["tl.targetlease.dev/leader"],
        "a pod that opted in to nothing keeps only our labels"
    );
    assert!(!bystander.labels_dropped);

    let opt_in = ("tl.targetlease.dev/candidate", "true");
    json["metadata"]["labels"][opt_in.0] = opt_in.1.into();
    let mut opted: CachedPod = serde_json::from_value(json).unwrap();
    opted.slim();
    assert_eq!(
        opted.labels().keys().collect::<Vec<_>>(),
        [opt_in.0, "tl.targetlease.dev/leader"],
        "past the bounds, a pod that opted in keeps only ours"
    );
    assert!(opted.labels_dropped, "and is nobody's candidate");

    // Ours alone, past the bounds (opted in to thousands of leases): the
    // first ones are kept, within the bounds.
    let mut many = pod("many", 1, &[]);
    let ours = many.metadata.labels.get_or_insert_default();
    for i in 0..5000 {
        ours.insert(format!("l{i:04}.targetlease.dev/candidate"), "true".into());
    }
    many.slim();
    assert_eq!(many.labels().len(), MAX_KEPT_LABELS);
    assert!(
        many.labels()
            .contains_key("l0000.targetlease.dev/candidate")
    );
    assert!(many.labels_dropped);
}

/// Every pod is slimmed as it is decoded, in a list page as in a watch
/// event: the cache never stores, and a page never holds decoded, what the
/// planner does not read (other tools' annotations are not even decoded).
#[test]
fn every_pod_is_slimmed_as_it_is_decoded() {
    let mut json = full_pod();
    let labels = json["metadata"]["labels"].as_object_mut().unwrap();
    labels.remove("tl.targetlease.dev/candidate");
    labels.insert("example.com/noise".into(), "x".repeat(63).into());
    json["metadata"]["annotations"]["example.com/big"] = "x".repeat(200_000).into();
    let page = serde_json::json!({
        "apiVersion": "v1", "kind": "PodList",
        "metadata": { "resourceVersion": "7", "continue": "next" },
        "items": [json.clone(), json.clone()],
    });
    let listed: kube::core::ObjectList<CachedPod> =
        serde_json::from_str(&page.to_string()).unwrap();
    let event = serde_json::json!({ "type": "MODIFIED", "object": json }).to_string();
    let kube::core::WatchEvent::Modified(watched) = serde_json::from_str(&event).unwrap() else {
        panic!("a MODIFIED event")
    };
    assert_eq!(listed.items.len(), 2);
    for pod in listed.items.iter().chain([&watched]) {
        let meta = &pod.metadata;
        assert_eq!(
            pod.labels().keys().collect::<Vec<_>>(),
            ["tl.targetlease.dev/leader"],
            "a pod that opted in to nothing keeps only our labels"
        );
        assert_eq!(
            pod.annotations().keys().collect::<Vec<_>>(),
            [
                "db.targetlease.dev/expires-at",
                "tl.targetlease.dev/fencing-token"
            ]
        );
        assert!(meta.managed_fields.is_none() && meta.owner_references.is_none());
        assert!(meta.finalizers.is_none() && meta.generate_name.is_none());
        let conditions = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
        assert_eq!(conditions.map(Vec::len), Some(1), "Ready only");
    }
}

#[test]
fn ready_means_a_true_ready_condition_and_no_deletion() {
    let mut json = full_pod();
    let deleting: CachedPod = serde_json::from_value(json.clone()).unwrap();
    assert!(!is_ready(&deleting), "being deleted");
    json["metadata"]["deletionTimestamp"] = serde_json::Value::Null;
    let ready: CachedPod = serde_json::from_value(json.clone()).unwrap();
    assert!(is_ready(&ready));
    json["status"]["conditions"][1]["status"] = "False".into();
    let not_ready: CachedPod = serde_json::from_value(json.clone()).unwrap();
    assert!(!is_ready(&not_ready));
    json["status"] = serde_json::Value::Null;
    let no_status: CachedPod = serde_json::from_value(json).unwrap();
    assert!(!is_ready(&no_status));
}

/// A Ready pod of namespace `shop` created at second `created` with these labels.
fn pod(name: &str, created: i64, labels: &[(&str, &str)]) -> CachedPod {
    let mut json = full_pod();
    json["metadata"]["name"] = name.into();
    json["metadata"]["uid"] = format!("uid-{name}").into();
    json["metadata"]["deletionTimestamp"] = serde_json::Value::Null;
    json["metadata"]["creationTimestamp"] = format!("2026-01-01T00:00:{created:02}Z").into();
    let labels: serde_json::Map<_, _> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    json["metadata"]["labels"] = labels.into();
    serde_json::from_value(json).unwrap()
}

fn cache(pods: Vec<CachedPod>) -> PodCache {
    PodCache::of(pods)
}

fn lease(name: &str, spec: serde_json::Value) -> (TargetLease, ValidSpec) {
    let spec = serde_json::from_value(spec).unwrap();
    let mut tl = TargetLease::new(name, spec);
    tl.metadata.namespace = Some("shop".into());
    let valid = super::super::spec::validate(&tl).unwrap();
    (tl, valid)
}

fn holder_of(desired: &Desired) -> Result<String, (Reason, String)> {
    match desired {
        Desired::Holder { pod, .. } => Ok(pod.as_ref().unwrap().name.clone()),
        Desired::Nobody { reason, message } => Err((*reason, message.clone())),
    }
}

#[test]
fn only_a_pod_that_opted_in_can_hold_a_named_lease() {
    let pods = cache(vec![
        pod("bystander", 1, &[("app", "web")]),
        pod(
            "other-lease",
            2,
            &[("other.targetlease.dev/candidate", "true")],
        ),
        pod("worker", 3, &[("tied.targetlease.dev/candidate", "true")]),
    ]);
    let named = |pod: &str| {
        lease(
            "tied",
            serde_json::json!({"target": "t", "holder": {"identity": "w", "podName": pod}}),
        )
    };
    for refused in ["bystander", "other-lease"] {
        let (tl, spec) = named(refused);
        let (reason, message) = holder_of(&desired_holder(&tl, &spec, &pods)).unwrap_err();
        assert_eq!(reason, Reason::PodNotOptedIn, "{refused}");
        assert!(
            message.contains("tied.targetlease.dev/candidate: \"true\""),
            "the message names the label to add: {message}"
        );
    }
    let (tl, spec) = named("worker");
    assert_eq!(
        holder_of(&desired_holder(&tl, &spec, &pods)),
        Ok("worker".into())
    );
}

#[test]
fn an_election_elects_only_among_pods_that_opted_in() {
    let spec = serde_json::json!({
        "target": "t", "candidates": {"podSelector": {"matchLabels": {"app": "web"}}},
    });
    let opted = ("web-leader.targetlease.dev/candidate", "true");
    // The oldest pod has not opted in: it is passed over.
    let pods = cache(vec![
        pod("web-0", 1, &[("app", "web")]),
        pod(
            "web-1",
            2,
            &[
                ("app", "web"),
                ("web-leader.targetlease.dev/candidate", "yes"),
            ],
        ),
        pod("web-2", 3, &[("app", "web"), opted]),
        pod("api-0", 0, &[("app", "api"), opted]),
    ]);
    let (tl, valid) = lease("web-leader", spec.clone());
    assert_eq!(
        holder_of(&desired_holder(&tl, &valid, &pods)),
        Ok("web-2".into())
    );

    // Ready pods match, none opted in: the cache cannot tell (it keeps no
    // labels of theirs), the API server's list can.
    let bystanders = vec![
        pod("web-0", 1, &[("app", "web")]),
        pod("web-1", 2, &[("app", "web")]),
    ];
    let (reason, _) = holder_of(&desired_holder(&tl, &valid, &cache(bystanders))).unwrap_err();
    assert_eq!(reason, Reason::NoReadyCandidate);
    let listed = |rest| NotOptedIn {
        ready: vec!["web-1".to_string(), "web-0".to_string()],
        listed: 2,
        rest,
    };
    let (reason, message) =
        holder_of(&nobody_elected("web-leader", listed(Rest::None), vec![])).unwrap_err();
    assert_eq!(reason, Reason::PodNotOptedIn);
    assert!(
        message.starts_with("2 Ready pod(s)")
            && message.contains("web-0, web-1")
            && !message.contains("checked"),
        "{message}"
    );
    // Only the first page is asked: the rest counted by the server, or not.
    let (_, message) = holder_of(&nobody_elected(
        "web-leader",
        listed(Rest::Counted(21)),
        vec![],
    ))
    .unwrap_err();
    assert!(
        message.starts_with("2 Ready pod(s)")
            && message.ends_with("(the first 2 of 23 matching pods checked)"),
        "{message}"
    );
    let (_, message) = holder_of(&nobody_elected(
        "web-leader",
        listed(Rest::Uncounted),
        vec![],
    ))
    .unwrap_err();
    assert!(
        message.starts_with("at least 2 Ready pod(s)") && message.contains("more match"),
        "{message}"
    );

    // Nothing matches at all: no Ready candidate.
    let (reason, _) = holder_of(&desired_holder(&tl, &valid, &cache(vec![]))).unwrap_err();
    assert_eq!(reason, Reason::NoReadyCandidate);
    let (reason, _) = holder_of(&nobody_elected("web-leader", none(), vec![])).unwrap_err();
    assert_eq!(reason, Reason::NoReadyCandidate);

    // Opted in with more labels than the cache keeps: not a candidate, and
    // the reason says why.
    let mut big = pod("web-9", 1, &[("app", "web"), opted]);
    let labels = big.metadata.labels.as_mut().unwrap();
    for i in 0..MAX_KEPT_LABELS {
        labels.insert(format!("example.com/l{i}"), "x".into());
    }
    big.slim();
    assert!(big.labels_dropped);
    let (reason, _) = holder_of(&desired_holder(&tl, &valid, &cache(vec![big]))).unwrap_err();
    assert_eq!(reason, Reason::NoReadyCandidate);
    let (_, message) =
        holder_of(&nobody_elected("web-leader", none(), vec!["web-9".into()])).unwrap_err();
    assert!(
        message.contains("more labels than the operator keeps"),
        "{message}"
    );
}

#[test]
fn candidates_and_named_pods_come_only_from_the_leases_namespace() {
    let mut elsewhere = pod(
        "web-0",
        1,
        &[("app", "web"), ("tl.targetlease.dev/candidate", "true")],
    );
    elsewhere.metadata.namespace = Some("other".into());
    let pods = cache(vec![elsewhere]);
    let (named, spec) = lease(
        "tl",
        serde_json::json!({"target": "t", "holder": {"identity": "w", "podName": "web-0"}}),
    );
    let (reason, message) = holder_of(&desired_holder(&named, &spec, &pods)).unwrap_err();
    assert_eq!(reason, Reason::PodNotReady);
    assert!(message.contains("does not exist"), "{message}");
    let (elected, spec) = lease(
        "tl",
        serde_json::json!({"target": "t", "candidates": {"podSelector": {"matchLabels": {"app": "web"}}}}),
    );
    let (reason, _) = holder_of(&desired_holder(&elected, &spec, &pods)).unwrap_err();
    assert_eq!(reason, Reason::NoReadyCandidate);
}

#[test]
fn a_pod_is_in_another_election_only_if_it_opted_in_to_it() {
    let election = |name: &str, uid: &str| {
        let (mut tl, _) = lease(
            name,
            serde_json::json!({"target": name, "candidates": {"podSelector": {"matchLabels": {"app": "web"}}}}),
        );
        tl.metadata.uid = Some(uid.into());
        tl.metadata.generation = Some(1);
        std::sync::Arc::new(tl)
    };
    let leases = vec![
        election("a", "u-a"),
        election("b", "u-b"),
        election("c", "u-c"),
    ];
    let p = pod(
        "web-0",
        1,
        &[
            ("app", "web"),
            ("a.targetlease.dev/candidate", "true"),
            ("b.targetlease.dev/candidate", "true"),
        ],
    );
    let selectors = Selectors::default();
    assert_eq!(
        overlapping_elections(&leases[0], &p, &leases, &selectors),
        ["b"]
    );
    assert!(
        concerns(&leases[2], &p, &selectors),
        "c is woken: the pod may opt in to it"
    );
}

/// No pod that did not opt in, on a whole list.
fn none() -> NotOptedIn {
    NotOptedIn {
        ready: vec![],
        listed: 0,
        rest: Rest::None,
    }
}
