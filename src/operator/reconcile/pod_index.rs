//! Pods by namespace and by the TargetLeases they opted in to, kept beside
//! the pod cache (no client required).
//!
//! Electing a leader reads only the pods that opted in to the election
//! ([`super::pods::opt_in_label`]), and publishing marks only the pods of
//! the lease's namespace, instead of every pod of the cluster. The
//! namespace's [`PodIndex::epoch`] changes only when a pod that opted in to
//! something (before or after the change) changes: nothing else can change
//! who qualifies to hold a lease, so answers built on it are reused until
//! then ([`super::index::LeaseIndex::queued_behind`]).
//!
//! Like [`super::index`], it answers with names; pods are read from the cache.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;

use super::pods::{CachedPod, OPT_IN_SUFFIX};

/// The TargetLeases `pod` opted in to.
fn opted_in_to(pod: &CachedPod) -> Vec<String> {
    pod.labels()
        .iter()
        .filter(|(_, v)| v.as_str() == "true")
        .filter_map(|(k, _)| k.strip_suffix(OPT_IN_SUFFIX))
        .map(str::to_owned)
        .collect()
}

#[derive(Default)]
struct Table {
    /// Pod names by namespace.
    by_namespace: HashMap<String, BTreeSet<String>>,
    /// Pod names by (namespace, TargetLease) they opted in to.
    opted: HashMap<(String, String), BTreeSet<String>>,
    /// What each pod (namespace, name) opted in to.
    opts_of: HashMap<(String, String), Vec<String>>,
    /// Epoch by namespace; [`Table::base`] for one not listed.
    epochs: HashMap<String, u64>,
    base: u64,
}

impl Table {
    fn remove(&mut self, ns: &str, name: &str) -> Vec<String> {
        if let Some(names) = self.by_namespace.get_mut(ns) {
            names.remove(name);
            if names.is_empty() {
                self.by_namespace.remove(ns);
            }
        }
        let old = self
            .opts_of
            .remove(&(ns.to_owned(), name.to_owned()))
            .unwrap_or_default();
        for lease in &old {
            let key = (ns.to_owned(), lease.clone());
            if let Some(pods) = self.opted.get_mut(&key) {
                pods.remove(name);
                if pods.is_empty() {
                    self.opted.remove(&key);
                }
            }
        }
        old
    }

    fn insert(&mut self, pod: &CachedPod) -> bool {
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let old = self.remove(&ns, &name);
        let opts = opted_in_to(pod);
        self.by_namespace
            .entry(ns.clone())
            .or_default()
            .insert(name.clone());
        for lease in &opts {
            self.opted
                .entry((ns.clone(), lease.clone()))
                .or_default()
                .insert(name.clone());
        }
        let matters = !old.is_empty() || !opts.is_empty();
        if !opts.is_empty() {
            self.opts_of.insert((ns, name), opts);
        }
        matters
    }
}

#[derive(Default)]
struct Pods {
    live: Table,
    relist: Option<Table>,
    counter: u64,
}

/// Pods by namespace and opt-in ([module docs](self)).
#[derive(Default)]
pub struct PodIndex {
    inner: Mutex<Pods>,
}

impl PodIndex {
    /// Takes in one event of the pod watch (after the cache took it).
    pub fn apply(&self, event: &Event<CachedPod>) {
        let mut p = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        p.counter += 1;
        let epoch = p.counter;
        let (ns, matters) = match event {
            Event::Apply(pod) => (pod.namespace(), p.live.insert(pod)),
            Event::Delete(pod) => {
                let ns = pod.namespace().unwrap_or_default();
                let old = p.live.remove(&ns, &pod.name_any());
                (Some(ns), !old.is_empty())
            }
            Event::Init => {
                p.relist = Some(Table::default());
                (None, false)
            }
            Event::InitApply(pod) => {
                p.relist.get_or_insert_default().insert(pod);
                (None, false)
            }
            Event::InitDone => {
                p.live = p.relist.take().unwrap_or_default();
                p.live.base = epoch;
                (None, false)
            }
        };
        if let (Some(ns), true) = (ns, matters) {
            p.live.epochs.insert(ns, epoch);
        }
    }

    /// Changes whenever a pod of `ns` that opted in to anything (before or
    /// after) changes, and after every relist.
    pub fn epoch(&self, ns: &str) -> u64 {
        let p = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        p.live.epochs.get(ns).copied().unwrap_or(p.live.base)
    }

    fn names(&self, f: impl FnOnce(&Table) -> Option<&BTreeSet<String>>) -> Vec<String> {
        let p = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&p.live)
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// The pod cache with its index: what the planner and the marks read.
#[derive(Clone)]
pub struct PodCache {
    /// Every cached pod.
    pub store: Store<CachedPod>,
    /// By namespace and opt-in.
    pub index: Arc<PodIndex>,
}

impl PodCache {
    /// Pod `name` of namespace `ns`.
    pub fn get(&self, ns: &str, name: &str) -> Option<Arc<CachedPod>> {
        self.store.get(&ObjectRef::new(name).within(ns))
    }

    /// The pods of `ns` that opted in to TargetLease `lease`.
    pub fn opted_in(&self, ns: &str, lease: &str) -> Vec<Arc<CachedPod>> {
        let names = self
            .index
            .names(|t| t.opted.get(&(ns.to_owned(), lease.to_owned())));
        names.iter().filter_map(|n| self.get(ns, n)).collect()
    }

    /// The pods of namespace `ns`.
    pub fn in_namespace(&self, ns: &str) -> Vec<Arc<CachedPod>> {
        let names = self.index.names(|t| t.by_namespace.get(ns));
        names.iter().filter_map(|n| self.get(ns, n)).collect()
    }

    /// See [`PodIndex::epoch`].
    pub fn epoch(&self, ns: &str) -> u64 {
        self.index.epoch(ns)
    }

    /// A cache and index filled with `pods` (for tests).
    #[cfg(test)]
    pub fn of(pods: Vec<CachedPod>) -> Self {
        let (store, mut writer) = kube::runtime::reflector::store();
        let index = Arc::new(PodIndex::default());
        for p in pods {
            let event = Event::Apply(p);
            writer.apply_watcher_event(&event);
            index.apply(&event);
        }
        PodCache { store, index }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, labels: &[(&str, &str)]) -> CachedPod {
        let mut p = CachedPod::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p
    }

    fn names(pods: Vec<Arc<CachedPod>>) -> Vec<String> {
        pods.iter().map(|p| p.name_any()).collect()
    }

    /// Candidates come from the opt-in index, per namespace; the epoch moves
    /// only for pods that opted in to something, before or after.
    #[test]
    fn opted_in_pods_by_lease_and_an_epoch_that_moves_only_for_them() {
        let opted = ("web.targetlease.dev/candidate", "true");
        let mut cache = PodCache::of(vec![
            pod("a", "web-0", &[("app", "web"), opted]),
            pod(
                "a",
                "web-1",
                &[("app", "web"), ("web.targetlease.dev/candidate", "yes")],
            ),
            pod("a", "other", &[("app", "web")]),
            pod("b", "web-0", &[opted]),
        ]);
        assert_eq!(names(cache.opted_in("a", "web")), ["web-0"]);
        assert_eq!(names(cache.opted_in("b", "web")), ["web-0"]);
        assert_eq!(cache.in_namespace("a").len(), 3);
        let (store, mut writer) = kube::runtime::reflector::store();
        cache.store = store;
        let mut send = |e: Event<CachedPod>| {
            writer.apply_watcher_event(&e);
            cache.index.apply(&e);
        };
        send(Event::Apply(pod("a", "web-0", &[("app", "web"), opted])));
        let before = cache.epoch("a");
        // A pod that opted in to nothing, before or after: no change.
        send(Event::Apply(pod("a", "other", &[("app", "api")])));
        assert_eq!(cache.epoch("a"), before);
        // One that opts out: the epoch moves, it is no longer a candidate.
        send(Event::Apply(pod("a", "web-0", &[("app", "web")])));
        let after = cache.epoch("a");
        assert_ne!(after, before);
        assert!(cache.opted_in("a", "web").is_empty());
        // Another namespace's pods do not move this one's epoch.
        send(Event::Delete(pod("b", "web-0", &[opted])));
        assert_eq!(cache.epoch("a"), after);
        assert_ne!(cache.epoch("b"), after);
        // A relist moves every epoch.
        send(Event::Init);
        send(Event::InitDone);
        assert!(cache.epoch("a") > after);
        assert!(cache.in_namespace("a").is_empty());
    }
}
