//! Pods: who qualifies to hold a lease (from the informer cache; no client required).
//!
//! A pod qualifies only if it opted in to the TargetLease: it carries the
//! label `<name>.targetlease.dev/candidate: "true"` ([`opt_in_label`]),
//! set by whoever writes the pod (its template). Naming a pod in
//! `spec.holder.podName` or matching it with `spec.candidates.podSelector`
//! is not enough: whoever may create TargetLeases could otherwise have the
//! operator put marks on pods they cannot patch themselves.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::core::SelectorExt;
use kube::runtime::reflector::{ObjectRef, Store};
use serde::Deserialize;

use super::plan::{Desired, PodRef};
use super::selectors::Selectors;
use super::spec::{Holders, ValidSpec};
use crate::conditions::Reason;
use crate::crd::TargetLease;

/// A pod as the operator caches it: only what the planner and the marks
/// read. The watch decodes nothing else (no spec, no container statuses), and
/// [`CachedPod::slim`] drops what the metadata carries beyond that, so
/// thousands of unrelated pods cost the cache little.
#[derive(kube::Resource, Clone, Debug, Default, Deserialize, PartialEq)]
#[resource(inherit = "Pod")]
pub struct CachedPod {
    /// Name, namespace, UID, resourceVersion, labels, our annotations,
    /// creation and deletion times.
    #[serde(deserialize_with = "crate::cache::without_managed_fields")]
    pub metadata: ObjectMeta,
    /// The pod's conditions (only Ready is kept).
    #[serde(default)]
    pub status: Option<CachedPodStatus>,
}

/// The part of a pod's status the planner reads.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct CachedPodStatus {
    /// Conditions by type and status (their times and messages are not read).
    #[serde(default)]
    pub conditions: Option<Vec<CachedCondition>>,
}

/// One pod condition: its type and status.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct CachedCondition {
    /// `Ready`, `PodScheduled`, …
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
}

impl CachedPod {
    /// Drops what the planner never reads: owner references, finalizers,
    /// other tools' annotations, every condition but Ready.
    pub fn slim(&mut self) {
        let meta = &mut self.metadata;
        meta.owner_references = None;
        meta.generate_name = None;
        meta.finalizers = None;
        if let Some(annotations) = meta.annotations.as_mut() {
            annotations.retain(|k, _| k.contains("targetlease.dev/"));
        }
        if let Some(conditions) = self.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            conditions.retain(|c| c.type_ == "Ready");
        }
    }
}

/// The label by which a pod opts in to TargetLease `name`: only a pod
/// carrying it with the value `"true"` can hold that TargetLease's lease
/// and carry its marks.
pub fn opt_in_label(name: &str) -> String {
    format!("{name}.targetlease.dev/candidate")
}

/// True when `pod` opted in to TargetLease `name` ([`opt_in_label`]).
pub fn accepts(pod: &CachedPod, name: &str) -> bool {
    pod.labels().get(&opt_in_label(name)).map(String::as_str) == Some("true")
}

/// True when the pod is not being deleted and its Ready condition is True.
pub fn is_ready(pod: &CachedPod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_ref(pod: &CachedPod) -> PodRef {
    PodRef {
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
    }
}

/// Who should hold the lease, from a valid spec and the pod cache.
pub fn desired_holder(tl: &TargetLease, spec: &ValidSpec, pods: &Store<CachedPod>) -> Desired {
    let ns = tl.namespace().unwrap_or_default();
    let name = tl.name_any();
    match &spec.holders {
        Holders::Named {
            identity,
            pod: None,
        } => Desired::Holder {
            identity: identity.clone(),
            pod: None,
        },
        Holders::Named {
            identity,
            pod: Some(pod_name),
        } => match pods.get(&ObjectRef::new(pod_name).within(&ns)) {
            Some(p) if !accepts(&p, &name) => Desired::Nobody {
                reason: Reason::PodNotOptedIn,
                message: format!(
                    "pod {pod_name} has not opted in to this TargetLease: it needs the label {}: \"true\"",
                    opt_in_label(&name)
                ),
            },
            Some(p) if is_ready(&p) => Desired::Holder {
                identity: identity.clone(),
                pod: Some(pod_ref(&p)),
            },
            Some(_) => Desired::Nobody {
                reason: Reason::PodNotReady,
                message: format!("pod {pod_name} is not Ready"),
            },
            None => Desired::Nobody {
                reason: Reason::PodNotReady,
                message: format!("pod {pod_name} does not exist"),
            },
        },
        Holders::Elected(selector) => {
            let (mut ready, refused): (Vec<_>, Vec<_>) = pods
                .state()
                .into_iter()
                .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
                .filter(|p| selector.matches(p.labels()) && is_ready(p))
                .partition(|p| accepts(p, &name));
            let current = tl.status.as_ref().and_then(|s| s.holder.clone());
            if let Some(p) = current.and_then(|c| ready.iter().find(|p| p.name_any() == c)) {
                return Desired::Holder {
                    identity: p.name_any(),
                    pod: Some(pod_ref(p)),
                };
            }
            ready.sort_by_key(|p| (p.creation_timestamp(), p.name_any()));
            match ready.first() {
                Some(p) => Desired::Holder {
                    identity: p.name_any(),
                    pod: Some(pod_ref(p)),
                },
                None if !refused.is_empty() => {
                    let mut names: Vec<_> = refused.iter().map(|p| p.name_any()).collect();
                    names.sort();
                    let shown = names.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
                    let more = names.len().saturating_sub(3);
                    Desired::Nobody {
                        reason: Reason::PodNotOptedIn,
                        message: format!(
                            "{} Ready pod(s) match spec.candidates.podSelector ({shown}{}) but none has opted in: \
                             a candidate needs the label {}: \"true\"",
                            names.len(),
                            if more > 0 {
                                format!(" and {more} more")
                            } else {
                                String::new()
                            },
                            opt_in_label(&name)
                        ),
                    }
                }
                None => Desired::Nobody {
                    reason: Reason::NoReadyCandidate,
                    message: format!(
                        "no pod matching spec.candidates.podSelector and labelled {}: \"true\" is Ready",
                        opt_in_label(&name)
                    ),
                },
            }
        }
    }
}

/// Does this pod matter to this TargetLease (so a pod event should wake it)?
/// Selectors come compiled from `selectors` (once per TargetLease version).
pub fn concerns(tl: &TargetLease, pod: &CachedPod, selectors: &Selectors) -> bool {
    if tl.namespace() != pod.namespace() {
        return false;
    }
    let name = pod.name_any();
    let status = tl.status.as_ref();
    if status.and_then(|s| s.holder_pod.as_deref()) == Some(name.as_str())
        || status.and_then(|s| s.holder.as_deref()) == Some(name.as_str())
        || super::marks::carries(pod, &tl.name_any())
    {
        return true;
    }
    if let Some(h) = &tl.spec.holder {
        return h.pod_name.as_deref() == Some(name.as_str());
    }
    selectors.of(tl).is_some_and(|s| s.matches(pod.labels()))
}

/// Other elections in the namespace that `pod` is also a candidate of: their
/// selectors match it and it opted in to them.
pub fn overlapping_elections(
    tl: &TargetLease,
    pod: &CachedPod,
    leases: &[std::sync::Arc<TargetLease>],
    selectors: &Selectors,
) -> Vec<String> {
    let me = tl.name_any();
    let mut names: Vec<String> = leases
        .iter()
        .filter(|o| o.namespace() == tl.namespace() && o.name_any() != me)
        .filter(|o| o.metadata.deletion_timestamp.is_none())
        .filter(|o| accepts(pod, &o.name_any()))
        .filter(|o| {
            selectors
                .of(o)
                .is_some_and(|s| !s.selects_all() && s.matches(pod.labels()))
        })
        .map(|o| o.name_any())
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
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
                "labels": { "app": "web", "tl.targetlease.dev/leader": "true" },
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
        assert_eq!(pod.labels().len(), 2, "every label: selectors read them");
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

    fn cache(pods: Vec<CachedPod>) -> Store<CachedPod> {
        let (reader, mut writer) = kube::runtime::reflector::store();
        for p in pods {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(p));
        }
        reader
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

        // Ready pods match, none opted in: a reason that says so, naming them.
        let pods = cache(vec![
            pod("web-0", 1, &[("app", "web")]),
            pod("web-1", 2, &[("app", "web")]),
        ]);
        let (reason, message) = holder_of(&desired_holder(&tl, &valid, &pods)).unwrap_err();
        assert_eq!(reason, Reason::PodNotOptedIn);
        assert!(
            message.starts_with("2 Ready pod(s)") && message.contains("web-0, web-1"),
            "{message}"
        );

        // Nothing matches at all: no Ready candidate.
        let (reason, _) = holder_of(&desired_holder(&tl, &valid, &cache(vec![]))).unwrap_err();
        assert_eq!(reason, Reason::NoReadyCandidate);
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
}
