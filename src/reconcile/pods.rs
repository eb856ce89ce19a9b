//! Pods: who qualifies to hold a lease, and the marks the elected pod carries.
//!
//! Selection reads only the informer cache (no client required); marking is
//! one server-side apply per change, under a field manager of its own so that
//! applying an empty document removes exactly our marks.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::reflector::Store;

use super::plan::Desired;
use crate::conditions::reason;
use crate::crd::TargetLease;

/// Label on the elected pod, so a Service can select only the leader.
pub const LEADER_LABEL: &str = "targetlease.dev/leader";
/// Annotation: the TargetLease that elected this pod.
pub const LEASE_ANNOTATION: &str = "targetlease.dev/lease";
/// Annotation: the holder identity (the pod's own name).
pub const HOLDER_ANNOTATION: &str = "targetlease.dev/holder";
/// Annotation: the fencing token.
pub const TOKEN_ANNOTATION: &str = "targetlease.dev/fencing-token";
/// Annotation: a lower bound on the lease expiry (RFC 3339).
pub const EXPIRES_ANNOTATION: &str = "targetlease.dev/expires-at";

/// True when the pod is not being deleted and its Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Who should hold the lease, from the spec and the pod cache.
pub fn desired_holder(tl: &TargetLease, pods: &Store<Pod>) -> Desired {
    let ns = tl.namespace().unwrap_or_default();
    if let Some(holder) = &tl.spec.holder {
        return match &holder.pod_name {
            None => Desired::Holder(holder.identity.clone()),
            Some(pod_name) => {
                let pod = pods.state().into_iter().find(|p| {
                    p.namespace().as_deref() == Some(ns.as_str()) && p.name_any() == *pod_name
                });
                match pod {
                    Some(p) if is_ready(&p) => Desired::Holder(holder.identity.clone()),
                    Some(_) => Desired::Nobody {
                        reason: reason::POD_NOT_READY,
                        message: format!("pod {pod_name} is not Ready"),
                    },
                    None => Desired::Nobody {
                        reason: reason::POD_NOT_READY,
                        message: format!("pod {pod_name} does not exist"),
                    },
                }
            }
        };
    }
    let Some(candidates) = &tl.spec.candidates else {
        return Desired::Nobody {
            reason: reason::INVALID_SPEC,
            message: "neither holder nor candidates is set".into(),
        };
    };
    let selector = match Selector::try_from(candidates.pod_selector.clone()) {
        Ok(s) => s,
        Err(e) => {
            return Desired::Nobody {
                reason: reason::INVALID_SPEC,
                message: format!("spec.candidates.podSelector: {e}"),
            };
        }
    };
    let mut ready: Vec<_> = pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .filter(|p| selector.matches(p.labels()))
        .filter(|p| is_ready(p))
        .collect();
    let current = tl.status.as_ref().and_then(|s| s.holder.clone());
    if let Some(current) = current
        && ready.iter().any(|p| p.name_any() == current)
    {
        return Desired::Holder(current);
    }
    ready.sort_by(|a, b| {
        (a.creation_timestamp(), a.name_any()).cmp(&(b.creation_timestamp(), b.name_any()))
    });
    match ready.first() {
        Some(p) => Desired::Holder(p.name_any()),
        None => Desired::Nobody {
            reason: reason::NO_READY_CANDIDATE,
            message: "no pod matching spec.candidates.podSelector is Ready".into(),
        },
    }
}

/// Does this pod matter to this TargetLease (so a pod event should wake it)?
pub fn concerns(tl: &TargetLease, pod: &Pod) -> bool {
    if tl.namespace() != pod.namespace() {
        return false;
    }
    let name = pod.name_any();
    if tl.status.as_ref().and_then(|s| s.holder.as_deref()) == Some(name.as_str()) {
        return true;
    }
    if let Some(h) = &tl.spec.holder {
        return h.pod_name.as_deref() == Some(name.as_str());
    }
    tl.spec
        .candidates
        .as_ref()
        .and_then(|c| Selector::try_from(c.pod_selector.clone()).ok())
        .is_some_and(|s| s.matches(pod.labels()))
}

fn field_manager(tl: &TargetLease) -> String {
    format!("targetlease-operator/{}", tl.name_any())
}

/// Marks the elected pod: leader label and lease annotations (server-side apply).
pub async fn mark(
    client: &kube::Client,
    tl: &TargetLease,
    pod_name: &str,
    token: u64,
    expires_at: &str,
) -> Result<(), kube::Error> {
    let ns = tl.namespace().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let annotations = BTreeMap::from([
        (LEASE_ANNOTATION.to_owned(), tl.name_any()),
        (HOLDER_ANNOTATION.to_owned(), pod_name.to_owned()),
        (TOKEN_ANNOTATION.to_owned(), token.to_string()),
        (EXPIRES_ANNOTATION.to_owned(), expires_at.to_owned()),
    ]);
    let patch = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name,
            "labels": { LEADER_LABEL: "true" },
            "annotations": annotations,
        }
    });
    api.patch(
        pod_name,
        &PatchParams::apply(&field_manager(tl)).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
}

/// Removes our marks from a pod; a pod that is already gone is fine.
pub async fn unmark(
    client: &kube::Client,
    tl: &TargetLease,
    pod_name: &str,
) -> Result<(), kube::Error> {
    let ns = tl.namespace().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let patch = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": pod_name }
    });
    match api
        .patch(
            pod_name,
            &PatchParams::apply(&field_manager(tl)).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        // Gone (404), or gone so that apply would have to create it (422): no marks left.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 422 => Ok(()),
        Err(e) => Err(e),
    }
}
