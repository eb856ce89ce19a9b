//! Pods: who qualifies to hold a lease (from the informer cache; no client required).

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::core::SelectorExt;
use kube::runtime::reflector::{ObjectRef, Store};

use super::plan::{Desired, PodRef};
use super::spec::{Holders, ValidSpec};
use crate::conditions::Reason;
use crate::crd::TargetLease;

/// True when the pod is not being deleted and its Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_ref(pod: &Pod) -> PodRef {
    PodRef {
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
    }
}

/// Who should hold the lease, from a valid spec and the pod cache.
pub fn desired_holder(tl: &TargetLease, spec: &ValidSpec, pods: &Store<Pod>) -> Desired {
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
pub fn concerns(tl: &TargetLease, pod: &Pod) -> bool {
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
    pod: &Pod,
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
