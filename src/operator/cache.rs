//! What the operator's watch caches decode: objects without `managedFields`,
//! and TargetLeases without labels and annotations.
//!
//! The API server sends every object with its managed fields, a tree of
//! field paths per writer that the operator never reads and that decodes
//! into several KB of maps per object. The caches' types skip it while
//! decoding, so it is neither kept nor allocated on every list page and
//! watch event. The same goes for a TargetLease's labels and annotations:
//! the operator never reads them (it plans from spec and status, and writes
//! only status and its finalizer), and whoever may create TargetLeases
//! chooses their size (annotations up to 256 KiB per object), so they would
//! let one tenant grow the shared operator's memory. Pods keep their labels
//! (selectors read them); of their annotations only the operator's marks are
//! decoded ([`pod_metadata`]), and [`crate::operator::reconcile::pods::CachedPod`]
//! slims each pod as it is decoded, before the next one of a page is.
//!
//! A list reply is still held whole while it is decoded, so every list is
//! made in pages of [`LIST_PAGE`] objects.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::runtime::watcher;
use serde::{Deserialize, Deserializer};

use crate::operator::crd::{TargetLease, TargetLeaseSpec, TargetLeaseStatus};
use crate::operator::reconcile::pods::{MAX_KEPT_LABELS, is_mark_annotation};

/// Objects per page of every list the operator makes (the watches' initial
/// lists and relists, and the pods an election asks about). A reply is held
/// whole (twice, while it is read) until it is decoded, and the API server
/// takes objects up to about 1.5 MB: 20 of them bound what a page costs
/// however many objects there are (100 pods of about 1 MB raised the
/// operator's peak memory by 69 MB in pages of 20, by 195 MB in pages of
/// 500), at the cost of one request per 20 objects (500 for 10,000 pods at
/// a start or a relist).
pub const LIST_PAGE: u32 = 20;

/// A TargetLease's metadata as the cache keeps it: no managed fields, labels
/// or annotations (skipped unread).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeaseMetadata {
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

/// A pod's metadata as the cache keeps it: no managed fields, owner
/// references, finalizers or generated name (skipped unread), and of the
/// annotations only the operator's marks ([`Marks`]).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodMetadata {
    annotations: Option<Marks>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

/// The mark annotations of a pod, filtered while they are decoded: any other
/// annotation (up to 256 KiB each) is skipped unread, and of the marks the
/// first [`MAX_KEPT_LABELS`] by key are kept.
struct Marks(BTreeMap<String, String>);

impl<'de> Deserialize<'de> for Marks {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Marks;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of annotations")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Marks, A::Error> {
                let mut kept = BTreeMap::new();
                while let Some(key) = map.next_key::<String>()? {
                    if !is_mark_annotation(&key, None) {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        continue;
                    }
                    let value: String = map.next_value()?;
                    if is_mark_annotation(&key, Some(&value)) {
                        kept.insert(key, value);
                        if kept.len() > MAX_KEPT_LABELS {
                            kept.pop_last();
                        }
                    }
                }
                Ok(Marks(kept))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// Decodes a pod's metadata as the cache keeps it ([`PodMetadata`]).
pub fn pod_metadata<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = PodMetadata::deserialize(d)?;
    Ok(ObjectMeta {
        annotations: m.annotations.map(|a| a.0),
        creation_timestamp: m.creation_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: m.deletion_timestamp,
        generation: m.generation,
        labels: m.labels,
        name: m.name,
        namespace: m.namespace,
        resource_version: m.resource_version,
        self_link: m.self_link,
        uid: m.uid,
        ..ObjectMeta::default()
    })
}

/// Decodes a TargetLease's metadata without its managed fields, labels and
/// annotations.
pub fn lease_metadata<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = LeaseMetadata::deserialize(d)?;
    Ok(ObjectMeta {
        annotations: None,
        creation_timestamp: m.creation_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: m.deletion_timestamp,
        finalizers: m.finalizers,
        generate_name: m.generate_name,
        generation: m.generation,
        labels: None,
        managed_fields: None,
        name: m.name,
        namespace: m.namespace,
        owner_references: m.owner_references,
        resource_version: m.resource_version,
        self_link: m.self_link,
        uid: m.uid,
    })
}

/// A TargetLease as the watch decodes it; the cache holds it as a
/// [`TargetLease`] ([`lease_event`]).
#[derive(kube::Resource, Clone, Debug, Deserialize)]
#[resource(inherit = "TargetLease")]
pub struct WatchedLease {
    /// The metadata, without managed fields, labels and annotations.
    #[serde(deserialize_with = "lease_metadata")]
    pub metadata: ObjectMeta,
    /// The spec.
    pub spec: TargetLeaseSpec,
    /// The status.
    #[serde(default)]
    pub status: Option<TargetLeaseStatus>,
}

impl From<WatchedLease> for TargetLease {
    fn from(w: WatchedLease) -> Self {
        TargetLease {
            metadata: w.metadata,
            spec: w.spec,
            status: w.status,
        }
    }
}

/// A watch event of [`WatchedLease`]s as one of [`TargetLease`]s.
pub fn lease_event(event: watcher::Event<WatchedLease>) -> watcher::Event<TargetLease> {
    use watcher::Event;
    match event {
        Event::Apply(w) => Event::Apply(w.into()),
        Event::Delete(w) => Event::Delete(w.into()),
        Event::Init => Event::Init,
        Event::InitApply(w) => Event::InitApply(w.into()),
        Event::InitDone => Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_decodes_whole_but_for_its_managed_fields_labels_and_annotations() {
        let json = serde_json::json!({
            "apiVersion": "targetlease.dev/v1alpha1",
            "kind": "TargetLease",
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "u-1", "generation": 3,
                "resourceVersion": "42", "creationTimestamp": "2026-01-01T00:00:00Z",
                "deletionTimestamp": "2026-01-02T00:00:00Z", "deletionGracePeriodSeconds": 0,
                "finalizers": ["targetlease.dev/release"],
                "labels": { "app": "web" }, "annotations": { "note": "x" },
                "ownerReferences": [{ "apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "o-1" }],
                "managedFields": [{ "manager": "targetlease-operator", "operation": "Apply",
                                    "fieldsType": "FieldsV1", "fieldsV1": { "f:status": {} } }],
            },
            "spec": { "target": "db", "holder": { "identity": "worker-1" } },
            "status": { "phase": "Held", "fencingToken": 9007199254740993u64 },
        });
        let full: TargetLease = serde_json::from_value(json.clone()).unwrap();
        let watched: WatchedLease = serde_json::from_value(json).unwrap();
        let cached = TargetLease::from(watched);
        assert!(full.metadata.managed_fields.is_some());
        assert!(full.metadata.labels.is_some() && full.metadata.annotations.is_some());
        assert_eq!(cached.metadata.managed_fields, None);
        assert_eq!(cached.metadata.labels, None, "labels are not kept");
        assert_eq!(
            cached.metadata.annotations, None,
            "annotations are not kept"
        );
        let mut expected = full;
        expected.metadata.managed_fields = None;
        expected.metadata.labels = None;
        expected.metadata.annotations = None;
        assert_eq!(
            cached.metadata, expected.metadata,
            "the rest as the API server sent it"
        );
        assert_eq!(
            (&cached.spec, &cached.status),
            (&expected.spec, &expected.status)
        );
    }
}
