//! Pod marks: the label and annotations the holder pod of a TargetLease carries.
//!
//! Keys are per TargetLease (`<name>.targetlease.dev/…`), so two elections
//! that select the same pods never mark one pod for the other, and a Service
//! selecting `<name>.targetlease.dev/leader: "true"` routes to exactly that
//! election's leader. Which pod carries marks is derived from status alone
//! ([`wanted`]); the executor removes marks before a status write stops naming
//! a pod and adds them after a status write names one, so no pod ever carries
//! marks its TargetLease's status does not name.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use super::plan::is_published_held;
use super::pod_index::PodCache;
use super::pods::{CachedPod, accepts};
use crate::operator::crd::TargetLeaseStatus;

/// The keys one TargetLease marks its holder pod with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkKeys {
    /// Label, `"true"` on the holder pod.
    pub leader: String,
    /// Annotation: the fencing token.
    pub token: String,
    /// Annotation: a lower bound on the lease's expiry (RFC 3339).
    pub expires_at: String,
}

/// The mark keys of TargetLease `name`.
pub fn keys(name: &str) -> MarkKeys {
    MarkKeys {
        leader: format!("{name}.targetlease.dev/leader"),
        token: format!("{name}.targetlease.dev/fencing-token"),
        expires_at: format!("{name}.targetlease.dev/expires-at"),
    }
}

/// The marks a status calls for: its pod, its token and its published expiry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    /// The holder pod.
    pub pod: String,
    /// Its UID (marks never land on a pod recreated under the same name).
    pub uid: Option<String>,
    /// The fencing token.
    pub token: u64,
    /// The published expiry, RFC 3339.
    pub expires_at: String,
}

/// The marks `status` calls for: only a published Held lease tied to a pod.
pub fn wanted(status: &TargetLeaseStatus) -> Option<Mark> {
    if !is_published_held(status) {
        return None;
    }
    Some(Mark {
        pod: status.holder_pod.clone()?,
        uid: status.holder_pod_uid.clone(),
        token: status.fencing_token?,
        expires_at: status.expires_at.as_ref()?.0.to_string(),
    })
}

/// True when `pod` carries any mark of TargetLease `name`.
pub fn carries(pod: &CachedPod, name: &str) -> bool {
    let k = keys(name);
    pod.labels().contains_key(&k.leader)
        || pod.annotations().contains_key(&k.token)
        || pod.annotations().contains_key(&k.expires_at)
}

/// True when `pod` carries exactly `mark` for TargetLease `name`.
pub fn is_current(pod: &CachedPod, name: &str, mark: &Mark) -> bool {
    let k = keys(name);
    pod.labels().get(&k.leader).map(String::as_str) == Some("true")
        && pod.annotations().get(&k.token) == Some(&mark.token.to_string())
        && pod.annotations().get(&k.expires_at) == Some(&mark.expires_at)
}

/// Names of the TargetLeases whose marks `pod` carries.
pub fn marked_by(pod: &CachedPod) -> Vec<String> {
    let suffixes = [
        ".targetlease.dev/leader",
        ".targetlease.dev/fencing-token",
        ".targetlease.dev/expires-at",
    ];
    let mut names: Vec<String> = pod
        .labels()
        .keys()
        .chain(pod.annotations().keys())
        .filter_map(|k| suffixes.iter().find_map(|s| k.strip_suffix(s)))
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// What to do to pods so they match `wanted`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MarkPlan {
    /// Pods to strip of this TargetLease's marks (before the status write).
    pub unmark: Vec<String>,
    /// The pod to mark (after the status write), when its marks are missing or stale.
    pub mark: Option<Mark>,
}

/// Compares the pods of the namespace (from the cache) with the marks wanted.
/// `also_unmark` names a pod that may carry marks the cache does not show yet
/// (the pod the previous status named).
pub fn plan(
    name: &str,
    wanted: Option<&Mark>,
    pods: &[&CachedPod],
    also_unmark: Option<&str>,
) -> MarkPlan {
    let wanted_pod = wanted.map(|m| m.pod.as_str());
    let mut unmark: Vec<String> = pods
        .iter()
        .filter(|p| carries(p, name) && Some(p.name_any().as_str()) != wanted_pod)
        .map(|p| p.name_any())
        .collect();
    if let Some(extra) = also_unmark
        && Some(extra) != wanted_pod
        && !unmark.iter().any(|p| p == extra)
    {
        unmark.push(extra.to_owned());
    }
    unmark.sort();
    let mark = wanted.and_then(|m| {
        let pod = pods.iter().find(|p| p.name_any() == m.pod);
        let recreated = pod
            .zip(m.uid.as_deref())
            .is_some_and(|(p, uid)| p.uid().as_deref() != Some(uid));
        let current = pod.is_some_and(|p| is_current(p, name, m));
        (!recreated && !current).then(|| m.clone())
    });
    MarkPlan { unmark, mark }
}

fn field_manager(name: &str) -> String {
    let manager = format!("targetlease-operator/{name}");
    if manager.len() <= 128 {
        return manager;
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
    let hex: String = digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("targetlease-operator/h-{hex}")
}

/// Marks the holder pod (server-side apply under this TargetLease's own field
/// manager), only if it still opted in to TargetLease `name` when the marks
/// are written: `cached` (the pod as the cache has it, read just before the
/// write) must carry the opt-in label, and the patch has the API server
/// check that the pod is still that version (its UID and resourceVersion as
/// preconditions), so a label removed since the pod was chosen — even one the
/// cache has not seen yet — refuses the write. A pod that is gone, was
/// recreated, changed or opted out is left alone (`Ok(false)`): its change
/// wakes the TargetLease, whose next pass sees it.
pub async fn mark(
    client: &kube::Client,
    ns: &str,
    name: &str,
    m: &Mark,
    cached: &CachedPod,
) -> Result<bool, kube::Error> {
    if !accepts(cached, name) || cached.name_any() != m.pod {
        return Ok(false);
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let k = keys(name);
    let annotations = BTreeMap::from([
        (k.token, m.token.to_string()),
        (k.expires_at, m.expires_at.clone()),
    ]);
    let mut metadata = serde_json::json!({
        "name": m.pod,
        "labels": { k.leader: "true" },
        "annotations": annotations,
    });
    if let Some(uid) = &m.uid {
        metadata["uid"] = uid.clone().into();
    }
    metadata["resourceVersion"] = cached.resource_version().into();
    let patch = serde_json::json!({ "apiVersion": "v1", "kind": "Pod", "metadata": metadata });
    match api
        .patch(
            &m.pod,
            &PatchParams::apply(&field_manager(name)).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        Ok(_) => Ok(true),
        // Gone (404), changed since `cached` (409 on the UID or the version),
        // or gone so that apply would have to create it (422): not marked.
        Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 422) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Marks the holder pod if it still opted in at this moment: the pod read
/// from the cache now, and the API server checking that version ([`mark`]).
pub async fn mark_now(
    client: &kube::Client,
    pods: &PodCache,
    ns: &str,
    name: &str,
    m: &Mark,
) -> Result<(), kube::Error> {
    let marked = match pods.get(ns, &m.pod) {
        Some(cached) => mark(client, ns, name, m, &cached).await?,
        None => false,
    };
    if !marked {
        tracing::debug!(pod = %m.pod, "not marked: the pod changed, is gone or opted out");
    }
    Ok(())
}

/// Removes every mark of this TargetLease from a pod, whoever wrote it (a
/// merge patch setting the keys to null). A pod that is already gone is fine.
pub async fn unmark(
    client: &kube::Client,
    ns: &str,
    name: &str,
    pod: &str,
) -> Result<(), kube::Error> {
    send_unmark(client, ns, pod, unmark_patch(name)).await
}

/// [`unmark`], only if the pod is still the version `cached` shows (the
/// orphan sweep decided from it). `Ok(false)`: it changed; nothing was done.
pub async fn unmark_unchanged(
    client: &kube::Client,
    ns: &str,
    name: &str,
    cached: &CachedPod,
) -> Result<bool, kube::Error> {
    let mut patch = unmark_patch(name);
    patch["metadata"]["resourceVersion"] = cached.resource_version().into();
    match send_unmark(client, ns, &cached.name_any(), patch).await {
        Ok(()) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

fn unmark_patch(name: &str) -> serde_json::Value {
    let k = keys(name);
    let mut labels = serde_json::Map::new();
    let mut annotations = serde_json::Map::new();
    labels.insert(k.leader, serde_json::Value::Null);
    annotations.insert(k.token, serde_json::Value::Null);
    annotations.insert(k.expires_at, serde_json::Value::Null);
    serde_json::json!({ "metadata": { "labels": labels, "annotations": annotations } })
}

async fn send_unmark(
    client: &kube::Client,
    ns: &str,
    pod: &str,
    patch: serde_json::Value,
) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    match api
        .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::crd::Phase;
    use crate::operator::reconcile::transition::time_ms;

    fn pod(
        name: &str,
        uid: &str,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) -> CachedPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name, "uid": uid,
                "labels": labels.iter().cloned().collect::<BTreeMap<_, _>>(),
                "annotations": annotations.iter().cloned().collect::<BTreeMap<_, _>>(),
            }
        }))
        .unwrap()
    }

    fn held_status(pod: &str) -> TargetLeaseStatus {
        TargetLeaseStatus {
            phase: Some(Phase::Held),
            holder: Some(pod.into()),
            holder_pod: Some(pod.into()),
            holder_pod_uid: Some("u0".into()),
            fencing_token: Some(4),
            acquisition_id: Some("a".into()),
            expires_at: time_ms(1_000_000),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_published_held_lease_tied_to_a_pod_marks_it() {
        let m = wanted(&held_status("web-0")).unwrap();
        assert_eq!((m.pod.as_str(), m.token), ("web-0", 4));
        for phase in [
            Phase::Pending,
            Phase::Unknown,
            Phase::Lost,
            Phase::Error,
            Phase::Released,
        ] {
            let mut s = held_status("web-0");
            s.phase = Some(phase);
            assert_eq!(wanted(&s), None, "{phase:?}");
        }
        let mut s = held_status("web-0");
        s.holder_pod = None;
        assert_eq!(wanted(&s), None, "a holder identity without a pod");
    }

    #[test]
    fn stale_and_foreign_marks_are_removed_and_the_holder_is_marked_once() {
        let m = wanted(&held_status("web-1")).unwrap();
        let k = keys("tl");
        let other = keys("other-election");
        let stale = pod("web-0", "u9", &[(&k.leader, "true")], &[(&k.token, "3")]);
        let foreign = pod("web-3", "u3", &[(&other.leader, "true")], &[]);
        let holder = pod("web-1", "u0", &[], &[]);
        let pods = [&stale, &foreign, &holder];
        let p = plan("tl", Some(&m), &pods, Some("web-4"));
        assert_eq!(p.unmark, ["web-0", "web-4"]);
        assert_eq!(p.mark, Some(m.clone()));

        let marked = pod(
            "web-1",
            "u0",
            &[(&k.leader, "true")],
            &[(&k.token, "4"), (&k.expires_at, &m.expires_at)],
        );
        let p = plan("tl", Some(&m), &[&marked], Some("web-1"));
        assert_eq!(p, MarkPlan::default(), "nothing to do");

        let recreated = pod("web-1", "other-uid", &[], &[]);
        assert_eq!(plan("tl", Some(&m), &[&recreated], None).mark, None);
        let p = plan("tl", None, &[&marked], None);
        assert_eq!(p.unmark, ["web-1"]);
    }

    #[test]
    fn the_leases_that_marked_a_pod_are_read_from_its_keys() {
        let a = keys("a");
        let p = pod(
            "x",
            "u",
            &[(&a.leader, "true"), ("app", "web")],
            &[
                ("b.targetlease.dev/fencing-token", "3"),
                ("c.targetlease.dev/expires-at", "2026-01-01T00:00:00Z"),
            ],
        );
        assert_eq!(marked_by(&p), ["a", "b", "c"]);
    }

    #[test]
    fn keys_are_valid_label_and_annotation_keys() {
        let k = keys("web-leader");
        assert_eq!(k.leader, "web-leader.targetlease.dev/leader");
        let long = "a".repeat(crate::operator::crd::MAX_NAME_CHARS);
        assert!(keys(&long).leader.split('/').next().unwrap().len() <= 253);
        assert!(field_manager(&long).len() <= 128);
        assert_eq!(field_manager("web"), "targetlease-operator/web");
    }
}
