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
use serde::Deserialize;
use std::sync::Arc;

use super::plan::{Desired, PodRef};
use super::pod_index::PodCache;
use super::selectors::Selectors;
use super::spec::{Holders, ValidSpec};
use crate::operator::conditions::Reason;
use crate::operator::crd::TargetLease;

/// Most labels the cache keeps of a pod that opted in (selectors read them).
pub const MAX_KEPT_LABELS: usize = 64;
/// Most bytes (keys and values) of labels the cache keeps of a pod that opted in.
pub const MAX_KEPT_LABEL_BYTES: usize = 16 * 1024;

const OUR_KEYS: &str = ".targetlease.dev/";

/// The annotations the cache keeps (of a TargetLease's marks, the leader is
/// a label): a token is at most 20 digits, an expiry an RFC 3339 time.
const MARK_ANNOTATIONS: [&str; 2] = [
    ".targetlease.dev/fencing-token",
    ".targetlease.dev/expires-at",
];
/// Longest mark annotation value the cache keeps; a longer one is not ours.
pub const MAX_MARK_VALUE_BYTES: usize = 64;

/// A pod as the operator caches it: only what the planner and the marks
/// read. It decodes nothing else (no spec, no container statuses, no
/// annotation but the marks: [`crate::operator::cache::pod_metadata`]), and every pod
/// is slimmed ([`CachedPod::slim`]) as it is decoded, before the next one of
/// a list page is: thousands of unrelated pods, whatever they carry, cost
/// the cache little.
#[derive(kube::Resource, Clone, Debug, Default, Deserialize, PartialEq)]
#[resource(inherit = "Pod")]
#[serde(from = "DecodedPod")]
pub struct CachedPod {
    /// Name, namespace, UID, resourceVersion, labels (every label of a pod
    /// that opted in, only ours of any other), our annotations, creation and
    /// deletion times.
    pub metadata: ObjectMeta,
    /// The pod's conditions (only Ready is kept).
    pub status: Option<CachedPodStatus>,
    /// The pod opted in but carries more labels than the cache keeps
    /// ([`MAX_KEPT_LABELS`], [`MAX_KEPT_LABEL_BYTES`]): only ours were kept,
    /// so no selector can be matched against it and it is nobody's candidate.
    pub labels_dropped: bool,
}

/// A pod as it is decoded, before [`CachedPod::slim`].
#[derive(Deserialize)]
struct DecodedPod {
    #[serde(deserialize_with = "crate::operator::cache::pod_metadata")]
    metadata: ObjectMeta,
    #[serde(default)]
    status: Option<CachedPodStatus>,
}

impl From<DecodedPod> for CachedPod {
    fn from(d: DecodedPod) -> Self {
        let mut pod = CachedPod {
            metadata: d.metadata,
            status: d.status,
            labels_dropped: false,
        };
        pod.slim();
        pod
    }
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
    /// other tools' annotations, every condition but Ready, and the labels of
    /// a pod that opted in to nothing but ours (whoever may create pods could
    /// otherwise grow the operator's memory with labels it never reads).
    /// A pod that opted in keeps its labels for the selectors, up to
    /// [`MAX_KEPT_LABELS`] and [`MAX_KEPT_LABEL_BYTES`]; past them it keeps
    /// only ours and is marked [`CachedPod::labels_dropped`].
    pub fn slim(&mut self) {
        let meta = &mut self.metadata;
        meta.owner_references = None;
        meta.generate_name = None;
        meta.finalizers = None;
        if let Some(annotations) = meta.annotations.as_mut() {
            // Only the two marks the operator reads, each as short as ours
            // are, and no more of them than a pod may keep labels.
            annotations.retain(|k, v| is_mark_annotation(k, Some(v)));
            while annotations.len() > MAX_KEPT_LABELS {
                annotations.pop_last();
            }
        }
        if let Some(labels) = meta.labels.as_mut() {
            let opted = labels
                .iter()
                .any(|(k, v)| v == "true" && k.ends_with(OPT_IN_SUFFIX));
            let within = !over_bounds(labels);
            if !(opted && within) {
                labels.retain(|k, _| k.contains(OUR_KEYS));
                self.labels_dropped = opted;
            }
            // Ours alone past the bounds: a pod opted in to that many
            // TargetLeases is abuse; the first ones (by key) are kept.
            while over_bounds(labels) {
                labels.pop_last();
                self.labels_dropped = true;
            }
        }
        if let Some(conditions) = self.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            conditions.retain(|c| c.type_ == "Ready");
        }
    }
}

/// True when annotation `key` (with `value`, once read) is one of the marks
/// the cache keeps: a fencing token or an expiry of ours, no longer than
/// [`MAX_MARK_VALUE_BYTES`].
pub fn is_mark_annotation(key: &str, value: Option<&str>) -> bool {
    MARK_ANNOTATIONS.iter().any(|s| key.ends_with(s))
        && value.is_none_or(|v| v.len() <= MAX_MARK_VALUE_BYTES)
}

/// How every opt-in label ends ([`opt_in_label`]).
pub(super) const OPT_IN_SUFFIX: &str = ".targetlease.dev/candidate";

fn over_bounds(labels: &std::collections::BTreeMap<String, String>) -> bool {
    labels.len() > MAX_KEPT_LABELS
        || labels.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() > MAX_KEPT_LABEL_BYTES
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

/// The Ready pods of the lease's namespace that `selector` matches and that
/// opted in to TargetLease `name` (read from the opt-in index, never from
/// every pod of the cluster).
fn candidates(
    ns: &str,
    name: &str,
    selector: &kube::core::Selector,
    pods: &PodCache,
) -> Vec<Arc<CachedPod>> {
    pods.opted_in(ns, name)
        .into_iter()
        .filter(|p| {
            accepts(p, name) && !p.labels_dropped && selector.matches(p.labels()) && is_ready(p)
        })
        .collect()
}

/// Whether anyone qualifies to hold the lease: [`desired_holder`] would name
/// a holder. Cheaper: it never looks at pods that did not opt in.
pub fn qualifies(tl: &TargetLease, spec: &ValidSpec, pods: &PodCache) -> bool {
    let ns = tl.namespace().unwrap_or_default();
    let name = tl.name_any();
    match &spec.holders {
        Holders::Named { pod: None, .. } => true,
        Holders::Named {
            pod: Some(pod_name),
            ..
        } => pods
            .get(&ns, pod_name)
            .is_some_and(|p| accepts(&p, &name) && is_ready(&p)),
        Holders::Elected(selector) => !candidates(&ns, &name, selector, pods).is_empty(),
    }
}

/// Who should hold the lease, from a valid spec and the pod cache.
pub fn desired_holder(tl: &TargetLease, spec: &ValidSpec, pods: &PodCache) -> Desired {
    let ns = tl.namespace().unwrap_or_default();
    let name = tl.name_any();
    match &spec.holders {
        Holders::Named { owner, pod: None } => Desired::Holder {
            owner: owner.clone(),
            pod: None,
        },
        Holders::Named {
            owner,
            pod: Some(pod_name),
        } => match pods.get(&ns, pod_name) {
            Some(p) if !accepts(&p, &name) => Desired::Nobody {
                reason: Reason::PodNotOptedIn,
                message: format!(
                    "pod {pod_name} has not opted in to this TargetLease: it needs the label {}: \"true\"",
                    opt_in_label(&name)
                ),
            },
            Some(p) if is_ready(&p) => Desired::Holder {
                owner: owner.clone(),
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
            let mut ready = candidates(&ns, &name, selector, pods);
            let current = tl.status.as_ref().and_then(|s| s.holder.clone());
            if let Some(p) = current.and_then(|c| ready.iter().find(|p| p.name_any() == c)) {
                return Desired::Holder {
                    owner: p.name_any(),
                    pod: Some(pod_ref(p)),
                };
            }
            ready.sort_by_key(|p| (p.creation_timestamp(), p.name_any()));
            if let Some(p) = ready.first() {
                return Desired::Holder {
                    owner: p.name_any(),
                    pod: Some(pod_ref(p)),
                };
            }
            // Nobody qualifies. Whether pods match but did not opt in is
            // told by [`nobody_elected`], from the API server: the cache
            // keeps no labels of pods that opted in to nothing.
            no_ready_candidate(&name)
        }
    }
}

fn no_ready_candidate(name: &str) -> Desired {
    Desired::Nobody {
        reason: Reason::NoReadyCandidate,
        message: format!(
            "no pod matching spec.candidates.podSelector and labelled {}: \"true\" is Ready",
            opt_in_label(name)
        ),
    }
}

/// The pods an election's selector matches that did not opt in, from the
/// first page of the API server's list: those of the page the cache knows
/// Ready, how many the page held, and how many follow it.
pub struct NotOptedIn {
    /// The page's pods that the cache knows Ready, by name.
    pub ready: Vec<String>,
    /// How many pods the page held, Ready or not.
    pub listed: usize,
    /// How many pods follow the page.
    pub rest: Rest,
}

/// How many pods follow the first page of a list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rest {
    /// None: the page is the whole list.
    None,
    /// This many (the server's `remainingItemCount`).
    Counted(u64),
    /// Some, not counted (the server gives no count for a label-selected list).
    Uncounted,
}

/// Why nobody qualifies for election `name`, from the Ready pods its
/// selector matches as the API server lists them: those that did not opt in
/// (`not_opted`: PodNotOptedIn, naming a few, counted from the first page
/// only), else those that opted in with more labels than the cache keeps
/// (`too_big`), else none at all (NoReadyCandidate).
pub fn nobody_elected(name: &str, not_opted: NotOptedIn, mut too_big: Vec<String>) -> Desired {
    let NotOptedIn {
        ready: mut not_opted,
        listed,
        rest,
    } = not_opted;
    if not_opted.is_empty() {
        if too_big.is_empty() {
            return no_ready_candidate(name);
        }
        too_big.sort();
        return Desired::Nobody {
            reason: Reason::NoReadyCandidate,
            message: format!(
                "{} Ready pod(s) opted in but carry more labels than the operator keeps \
                 ({MAX_KEPT_LABELS} labels, {MAX_KEPT_LABEL_BYTES} bytes): {}",
                too_big.len(),
                shown(&too_big)
            ),
        };
    }
    not_opted.sort();
    let (at_least, checked) = match rest {
        Rest::None => ("", String::new()),
        Rest::Counted(more) => (
            "",
            format!(
                " (the first {listed} of {} matching pods checked)",
                listed as u64 + more
            ),
        ),
        Rest::Uncounted => (
            "at least ",
            format!(" (the first {listed} matching pods checked; more match)"),
        ),
    };
    Desired::Nobody {
        reason: Reason::PodNotOptedIn,
        message: format!(
            "{at_least}{} Ready pod(s) match spec.candidates.podSelector ({}) but none has \
             opted in: a candidate needs the label {}: \"true\"{checked}",
            not_opted.len(),
            shown(&not_opted),
            opt_in_label(name)
        ),
    }
}

/// The first three names, and how many more.
fn shown(names: &[String]) -> String {
    let first = names.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
    match names.len().saturating_sub(3) {
        0 => first,
        more => format!("{first} and {more} more"),
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
mod tests;
