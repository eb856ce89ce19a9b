//! Pods: who qualifies to hold a lease (from the informer cache; no client required).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::core::SelectorExt;
use kube::runtime::reflector::{ObjectRef, Store};
use serde::Deserialize;

use super::plan::{Desired, PodRef};
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
            let mut ready: Vec<_> = pods
                .state()
                .into_iter()
                .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
                .filter(|p| selector.matches(p.labels()) && is_ready(p))
                .collect();
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
                None => Desired::Nobody {
                    reason: Reason::NoReadyCandidate,
                    message: "no pod matching spec.candidates.podSelector is Ready".into(),
                },
            }
        }
    }
}

/// Does this pod matter to this TargetLease (so a pod event should wake it)?
pub fn concerns(tl: &TargetLease, pod: &CachedPod) -> bool {
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
    tl.spec
        .candidates
        .as_ref()
        .and_then(|c| kube::core::Selector::try_from(c.pod_selector.clone()).ok())
        .is_some_and(|s| s.matches(pod.labels()))
}

/// Other elections in the namespace whose selectors also match `pod`.
pub fn overlapping_elections(
    tl: &TargetLease,
    pod: &CachedPod,
    leases: &[std::sync::Arc<TargetLease>],
) -> Vec<String> {
    let me = tl.name_any();
    let mut names: Vec<String> = leases
        .iter()
        .filter(|o| o.namespace() == tl.namespace() && o.name_any() != me)
        .filter(|o| o.metadata.deletion_timestamp.is_none())
        .filter(|o| {
            o.spec
                .candidates
                .as_ref()
                .and_then(|c| kube::core::Selector::try_from(c.pod_selector.clone()).ok())
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
}
