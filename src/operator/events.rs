//! The operator's Kubernetes Events (`events.k8s.io/v1`), an Event that
//! says again what one said within [`SERIES_TTL`] folded into its series.
//!
//! kube's `Recorder` does the same, but keeps every Event it sent, whole,
//! for six minutes to fold the next one into it: about 3.5 KB per Event
//! (the Event and the key it is found by, each with its own copy of the
//! object reference). A new TargetLease gets an `Acquired` Event, so 10,000
//! new TargetLeases kept 35 MB of them, more than a third of the operator's
//! heap at its peak. It also went through all of them on every Event to
//! drop the old ones. This one keeps what a series needs (the Event's name
//! and namespace, its count and when it was last seen: about 300 bytes with
//! its key) and drops the old ones at most once a minute, when it publishes.
//! It remembers at most [`SERIES_KEPT`] series (client-go's legacy event
//! correlator keeps as many), so 10,000 new TargetLeases do not keep 10,000
//! series for six minutes: past that, it forgets the series remembered
//! earliest, keeping the latest half, and an Event whose series was
//! forgotten starts a new one.
//!
//! Events fold when they are about the same object (by UID) and share type,
//! reason and action; the operator's actions carry a digest of the note
//! ([`crate::operator::reconcile::transition::event_action`]), so only
//! Events that say the same thing fold. Unlike kube's, the key leaves out
//! the object's resourceVersion: a Warning repeated while the operator
//! keeps writing the object's status still folds into one series.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// How long after an Event was last seen the same Event folds into it
/// (kube's Recorder uses the same six minutes).
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// How often Events older than [`SERIES_TTL`] are forgotten.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// The most series remembered at once (client-go's legacy event correlator
/// keeps as many); past that, the ones remembered earliest are forgotten
/// ([`Recent::bound`]).
pub const SERIES_KEPT: usize = 4096;

/// One Event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Warning rather than Normal.
    pub warning: bool,
    /// Why (`Acquired`, `LeaseLost`, ...).
    pub reason: &'static str,
    /// What the operator did; Events of one object fold only when their
    /// type, reason and action are the same.
    pub action: String,
    /// One sentence for people.
    pub note: String,
}

/// What makes two Events one series.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    /// The object's UID (kind, namespace and name when it has none).
    regarding: Box<str>,
    warning: bool,
    reason: &'static str,
    action: Box<str>,
}

/// An Event already sent: where it is and how often it was seen.
struct Series {
    namespace: Box<str>,
    name: Box<str>,
    /// How many times it was seen (1: only created).
    count: i32,
    /// When it was last seen (on this process's monotonic clock).
    seen: Instant,
    /// When it was last remembered, counted ([`Recent::keep`]).
    order: u64,
}

#[derive(Default)]
struct Recent {
    series: HashMap<Key, Series>,
    pruned: Option<Instant>,
    /// Series remembered so far.
    kept: u64,
}

impl Recent {
    /// The Event `key` folds into at `now`, if one was seen within
    /// [`SERIES_TTL`] (pruned or not): its namespace, name and next count.
    fn folds_into(&self, key: &Key, now: Instant) -> Option<(Box<str>, Box<str>, i32)> {
        self.series
            .get(key)
            .filter(|s| now.saturating_duration_since(s.seen) < SERIES_TTL)
            .map(|s| (s.namespace.clone(), s.name.clone(), s.count + 1))
    }

    /// Forgets the Events last seen more than [`SERIES_TTL`] ago, at most
    /// once per [`PRUNE_EVERY`].
    fn prune(&mut self, now: Instant) {
        if self
            .pruned
            .is_some_and(|at| now.saturating_duration_since(at) < PRUNE_EVERY)
        {
            return;
        }
        self.pruned = Some(now);
        self.series
            .retain(|_, s| now.saturating_duration_since(s.seen) < SERIES_TTL);
        if self.series.capacity() > 64 && self.series.len() * 4 < self.series.capacity() {
            self.series.shrink_to_fit();
        }
    }

    /// Remembers `series` under `key`, as the latest remembered.
    fn keep(&mut self, key: Key, mut series: Series) {
        self.kept += 1;
        series.order = self.kept;
        self.series.insert(key, series);
        self.bound();
    }

    /// Past [`SERIES_KEPT`] series, keeps only the [`SERIES_KEPT`] / 2 last
    /// remembered (by when they were remembered, not when their Event was
    /// seen: a publish that waited long on the API server is not forgotten
    /// as soon as it is remembered). One pass per [`SERIES_KEPT`] / 2 new
    /// series, so a burst of new Events costs a constant time each.
    fn bound(&mut self) {
        if self.series.len() <= SERIES_KEPT {
            return;
        }
        let mut order: Vec<u64> = self.series.values().map(|s| s.order).collect();
        let at = order.len() - SERIES_KEPT / 2;
        let (_, cut, _) = order.select_nth_unstable(at - 1);
        let cut = *cut;
        self.series.retain(|_, s| s.order > cut);
    }
}

/// Publishes the operator's Events ([module docs](self)).
pub struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    recent: Mutex<Recent>,
}

impl Recorder {
    /// Events reported by `controller` (`reportingController`), from
    /// `instance` (`reportingInstance`; the controller's name when `None`).
    pub fn new(client: Client, controller: &str, instance: Option<&str>) -> Self {
        Self {
            client,
            controller: controller.to_owned(),
            instance: instance.unwrap_or(controller).to_owned(),
            recent: Mutex::default(),
        }
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Events remembered for folding (for tests and the curious).
    pub fn remembered(&self) -> usize {
        self.recent().series.len()
    }

    /// Publishes `ev` about `regarding`: a new Event, or the next count of
    /// the series of the same Event seen within [`SERIES_TTL`].
    ///
    /// # Errors
    ///
    /// The API server refused the Event or did not answer.
    pub async fn publish(&self, ev: Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let key = Key {
            regarding: identity(regarding).into(),
            warning: ev.warning,
            reason: ev.reason,
            action: ev.action.as_str().into(),
        };
        let now = Instant::now();
        let folded = {
            let mut recent = self.recent();
            recent.prune(now);
            recent.folds_into(&key, now)
        };
        if let Some((namespace, name, count)) = folded {
            match self.fold(&namespace, &name, count).await {
                Ok(()) => {
                    self.remember(key, namespace, name, count, now);
                    return Ok(());
                }
                // Gone (deleted, or expired on the API server): start anew.
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    self.recent().series.remove(&key);
                }
                Err(e) => return Err(e),
            }
        }
        let (namespace, name) = self.create(ev, regarding).await?;
        self.remember(key, namespace.into(), name.into(), 1, now);
        Ok(())
    }

    fn remember(&self, key: Key, namespace: Box<str>, name: Box<str>, count: i32, seen: Instant) {
        self.recent().keep(
            key,
            Series {
                namespace,
                name,
                count,
                seen,
                order: 0,
            },
        );
    }

    /// Creates the Event; its namespace and name.
    async fn create(
        &self,
        ev: Event,
        regarding: &ObjectReference,
    ) -> Result<(String, String), kube::Error> {
        let now = Timestamp::now();
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or(&self.controller),
            now.as_nanosecond()
        );
        let event = K8sEvent {
            action: Some(ev.action),
            reason: Some(ev.reason.to_owned()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            note: Some(ev.note),
            metadata: ObjectMeta {
                namespace: Some(namespace.clone()),
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(if ev.warning { "Warning" } else { "Normal" }.to_owned()),
            ..K8sEvent::default()
        };
        Api::<K8sEvent>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await?;
        Ok((namespace, name))
    }

    /// Sets the series of an Event already sent to `count`, seen now.
    async fn fold(&self, namespace: &str, name: &str, count: i32) -> Result<(), kube::Error> {
        let patch = serde_json::json!({
            "series": EventSeries {
                count,
                last_observed_time: MicroTime(Timestamp::now()),
            }
        });
        Api::<K8sEvent>::namespaced(self.client.clone(), namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
    }
}

/// Which object an Event is about: its UID, or its kind, namespace and name.
fn identity(r: &ObjectReference) -> String {
    match &r.uid {
        Some(uid) => uid.clone(),
        None => format!(
            "{}/{}/{}",
            r.kind.as_deref().unwrap_or_default(),
            r.namespace.as_deref().unwrap_or_default(),
            r.name.as_deref().unwrap_or_default()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(action: &str) -> Key {
        Key {
            regarding: "uid-1".into(),
            warning: false,
            reason: "Acquired",
            action: action.into(),
        }
    }

    fn series(seen: Instant) -> Series {
        Series {
            namespace: "ns".into(),
            name: "tl.1".into(),
            count: 1,
            seen,
            order: 0,
        }
    }

    #[test]
    fn events_older_than_the_ttl_are_forgotten_once_a_minute() {
        let start = Instant::now();
        let mut r = Recent::default();
        r.series.insert(key("old"), series(start));
        r.prune(start);
        assert_eq!(r.series.len(), 1, "a fresh Event is kept");
        let later = start + SERIES_TTL;
        r.series.insert(key("new"), series(later));
        r.prune(later);
        assert_eq!(r.series.len(), 1, "the old one is dropped");
        assert!(r.series.contains_key(&key("new")));
        // Not again within a minute, however old they are by then.
        r.series.get_mut(&key("new")).unwrap().seen = start;
        r.prune(later + PRUNE_EVERY - Duration::from_secs(1));
        assert_eq!(r.series.len(), 1);
        r.prune(later + PRUNE_EVERY);
        assert!(r.series.is_empty());
    }

    #[test]
    fn an_event_folds_only_within_the_ttl_of_when_it_was_last_seen() {
        let start = Instant::now();
        let mut r = Recent::default();
        r.series.insert(key("a"), series(start));
        let within = start + SERIES_TTL - Duration::from_secs(1);
        assert_eq!(
            r.folds_into(&key("a"), within),
            Some(("ns".into(), "tl.1".into(), 2))
        );
        assert_eq!(r.folds_into(&key("b"), within), None, "another action");
        // Too old, even before a prune drops it.
        assert_eq!(r.folds_into(&key("a"), start + SERIES_TTL), None);
    }

    #[test]
    fn an_object_without_a_uid_is_known_by_kind_namespace_and_name() {
        let r = ObjectReference {
            kind: Some("TargetLease".into()),
            namespace: Some("apps".into()),
            name: Some("db".into()),
            ..ObjectReference::default()
        };
        assert_eq!(identity(&r), "TargetLease/apps/db");
        let with_uid = ObjectReference {
            uid: Some("u-1".into()),
            ..r
        };
        assert_eq!(identity(&with_uid), "u-1");
    }

    #[test]
    fn past_the_bound_the_series_remembered_last_are_kept() {
        let start = Instant::now();
        let mut r = Recent::default();
        // Seen in the opposite order to the one they are remembered in (a
        // publish that waited long on the API server): what counts is when
        // each was remembered.
        let seen = |i: usize| start + Duration::from_millis((SERIES_KEPT - i) as u64);
        for i in 0..=SERIES_KEPT {
            r.keep(key(&i.to_string()), series(seen(i)));
            assert!(r.series.len() <= SERIES_KEPT, "never more than the bound");
        }
        assert_eq!(r.series.len(), SERIES_KEPT / 2, "the latest half is kept");
        let kept = |i: usize| r.series.contains_key(&key(&i.to_string()));
        assert!(kept(SERIES_KEPT), "the one just remembered");
        assert!(
            (0..=SERIES_KEPT / 2).all(|i| !kept(i)),
            "the earliest are gone"
        );
        assert!((SERIES_KEPT / 2 + 1..=SERIES_KEPT).all(kept));
    }

    #[tokio::test]
    async fn the_recorder_never_remembers_more_than_the_bound() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let recorder = Recorder::new(Client::try_from(config).unwrap(), "test", None);
        let start = Instant::now();
        for i in 0..SERIES_KEPT * 2 {
            let seen = start + Duration::from_millis(i as u64);
            recorder.remember(key(&i.to_string()), "ns".into(), "tl.1".into(), 1, seen);
            assert!(recorder.remembered() <= SERIES_KEPT);
        }
    }

    #[test]
    fn what_it_keeps_per_event_is_small() {
        // The point of this module: a remembered Event costs its key and
        // series (plus five short strings), not a whole Event twice.
        let per_entry = std::mem::size_of::<Key>() + std::mem::size_of::<Series>();
        assert!(per_entry <= 128, "{per_entry} bytes per remembered Event");
    }
}
