//! TargetLeases by target and by namespace, kept beside the lease cache (no
//! client required).
//!
//! A pass needs its target's siblings: the queue (who is served first), a
//! sibling still published as Held, the highest token published on the
//! target. Scanning the whole cache for them made every pass cost as much as
//! the cluster's TargetLeases, and a resync of `n` TargetLeases on one
//! target `n²`. Here each target keeps its members in queue order, and what
//! a pass asks of them is computed once per change of the target (the head
//! of the queue also once per change of the namespace's opted-in pods,
//! [`super::pod_index::PodIndex::epoch`]) and reused by every pass until the
//! next change.
//!
//! The index follows the same watch events as the cache, applied after the
//! cache took them, and answers only with names: objects are read from the
//! cache, so an index that runs a moment ahead or behind never makes a pass
//! plan from anything but the cache.
//!
//! It also says when a target's queue may have moved: a member stopped
//! publishing its Held token (another phase or token, whoever wrote it),
//! left the queue (being deleted, or in error), or left the target (deleted,
//! or missing from a relist). [`LeaseIndex::apply`] returns those
//! [`Withdrawn`] members, and [`LeaseIndex::wake_others`] wakes the target's
//! other members then. A waiter plans from the
//! cache, so a waiter woken only by the pass that wrote the change may still
//! see the old Held status and wait for its published expiry; woken when
//! the cache took the change, it cannot.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;

use super::name::NsName;
use super::{plan, queue};
use crate::operator::crd::TargetLease;

/// A place in a target's queue: creation time, then name (one copy, shared
/// by the tables that name the member, from its first event on).
type Place = (Option<Timestamp>, Arc<str>);

/// What a target's members publish, read once per change of the target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// Members whose status publishes Held, with the published expiry (ms).
    pub held: Vec<(Arc<str>, u64)>,
    /// The highest token any member's status publishes.
    pub max_token: u64,
}

#[derive(Default)]
struct Queue {
    /// In queue order. A sorted `Vec`: most targets have one member, which
    /// costs one 48-byte slot here against a 544-byte B-tree node (a target
    /// that once had many keeps their room until it empties); an insertion
    /// moves the members after it, a cost that matters only on targets with
    /// thousands of members (a relist of 10,000 on one target in no
    /// particular order moves about 1.2 GB: 0.15 s more than a B-tree's,
    /// measured).
    members: Vec<Place>,
    /// Changes with every event of a member (from [`Leases::counter`]).
    epoch: u64,
    /// The first member that wants the lease, for this namespace pod epoch.
    head: Option<(u64, Option<Place>)>,
    published: Option<Arc<Published>>,
}

/// A member no longer publishes the Held it did, or left its target's
/// queue or the target: the target's other members may go ahead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Withdrawn {
    /// The member's namespace.
    pub namespace: String,
    /// The target it was on.
    pub target: String,
    /// The member that withdrew (its Held, or itself).
    pub name: String,
}

/// Where a member is, the token its status publishes as Held, and whether
/// it may be in the queue ([`queue::may_queue`]).
#[derive(Clone, PartialEq, Eq)]
struct Member {
    target: Arc<str>,
    place: Place,
    held: Option<u64>,
    queues: bool,
}

/// Keyed by [`NsName`] and boxed: a map's room for 10,000 TargetLeases is
/// 16,384 slots, each as large as its key and value; a box puts the value
/// where there is one.
#[derive(Default)]
struct Table {
    /// By (namespace, target).
    targets: HashMap<NsName, Box<Queue>>,
    /// By (namespace, name).
    place: HashMap<NsName, Box<Member>>,
    /// Names by namespace.
    by_namespace: HashMap<String, BTreeSet<Arc<str>>>,
}

#[derive(Default)]
struct Leases {
    live: Table,
    /// The table being filled by a relist, swapped in when it is complete.
    relist: Option<Table>,
    counter: u64,
}

/// TargetLeases by target and namespace ([module docs](self)).
#[derive(Default)]
pub struct LeaseIndex {
    inner: Mutex<Leases>,
    /// Cache reads made to answer (for tests and the curious: a bound on work).
    reads: AtomicU64,
}

fn place_of(tl: &TargetLease) -> Place {
    let name = tl.metadata.name.as_deref().unwrap_or_default();
    (tl.creation_timestamp().map(|t| t.0), name.into())
}

/// The token `tl`'s status publishes as Held, if it does.
fn held_token(tl: &TargetLease) -> Option<u64> {
    tl.status
        .as_ref()
        .filter(|s| plan::is_published_held(s))
        .map(|s| s.fencing_token.unwrap_or(0))
}

/// Whether `now` (the same member, or `None` when it is gone) left the
/// target or the queue `was` was in, or no longer publishes the Held `was`
/// published.
fn withdrawn(was: &Member, now: Option<&Member>) -> bool {
    now.is_none_or(|now| {
        now.target != was.target
            || (was.queues && !now.queues)
            || (was.held.is_some() && now.held != was.held)
    })
}

impl Table {
    /// Takes `tl` in; the member it was before, if any.
    fn insert(&mut self, tl: &TargetLease, epoch: u64) -> Option<Member> {
        let ns = tl.metadata.namespace.as_deref().unwrap_or_default();
        let key = NsName::shared(ns, tl.metadata.name.as_deref().unwrap_or_default());
        let was = self.place.remove(&key).map(|b| *b);
        // The member's strings as it had them: one copy of each, however
        // many events it has.
        let (created, fresh_name) = place_of(tl);
        let name = was.as_ref().map_or(fresh_name, |old| old.place.1.clone());
        let target = match &was {
            Some(old) if *old.target == *tl.spec.target => old.target.clone(),
            _ => tl.spec.target.as_str().into(),
        };
        let member = Member {
            target,
            place: (created, name),
            held: held_token(tl),
            queues: queue::may_queue(tl),
        };
        if let Some(old) = &was {
            self.leave(ns, &old.target, &old.place, epoch);
        }
        let q = self
            .targets
            .entry(NsName::shared(ns, &member.target))
            .or_default();
        if let Err(at) = q.members.binary_search(&member.place) {
            if q.members.is_empty() {
                q.members.reserve_exact(1);
            }
            q.members.insert(at, member.place.clone());
        }
        q.touch(epoch);
        let name = member.place.1.clone();
        self.place.insert(key, Box::new(member));
        match self.by_namespace.get_mut(ns) {
            Some(names) => names.insert(name),
            None => self
                .by_namespace
                .entry(ns.to_owned())
                .or_default()
                .insert(name),
        };
        was
    }

    /// Lets `tl` go; the member it was, if any.
    fn remove(&mut self, tl: &TargetLease, epoch: u64) -> Option<Member> {
        let ns = tl.metadata.namespace.as_deref().unwrap_or_default();
        let name = tl.metadata.name.as_deref().unwrap_or_default();
        let was = self.place.remove(&NsName::new(ns, name)).map(|b| *b);
        if let Some(old) = &was {
            self.leave(ns, &old.target, &old.place, epoch);
        }
        if let Some(names) = self.by_namespace.get_mut(ns) {
            names.remove(name);
            if names.is_empty() {
                self.by_namespace.remove(ns);
            }
        }
        was
    }

    fn leave(&mut self, ns: &str, target: &str, place: &Place, epoch: u64) {
        let key = NsName::new(ns, target);
        if let Some(q) = self.targets.get_mut(&key) {
            if let Ok(at) = q.members.binary_search(place) {
                q.members.remove(at);
            }
            q.touch(epoch);
            if q.members.is_empty() {
                self.targets.remove(&key);
            }
        }
    }
}

impl Queue {
    fn touch(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.head = None;
        self.published = None;
    }
}

impl LeaseIndex {
    /// Takes in one event of the lease watch (after the cache took it), and
    /// says which members it withdrew (see the [module docs](self)): after a
    /// relist, every member the new list no longer has, and every Held it no
    /// longer publishes.
    pub fn apply(&self, event: &Event<TargetLease>) -> Vec<Withdrawn> {
        let mut l = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        l.counter += 1;
        let epoch = l.counter;
        let withdrew = |tl: &TargetLease, was: Option<Member>, now: Option<&Member>| {
            was.filter(|was| withdrawn(was, now))
                .map(|was| Withdrawn {
                    namespace: tl.namespace().unwrap_or_default(),
                    target: was.target.to_string(),
                    name: tl.name_any(),
                })
                .into_iter()
                .collect()
        };
        match event {
            Event::Apply(tl) => {
                let was = l.live.insert(tl, epoch);
                let ns = tl.metadata.namespace.as_deref().unwrap_or_default();
                let name = tl.metadata.name.as_deref().unwrap_or_default();
                let now = l.live.place.get(&NsName::new(ns, name));
                withdrew(tl, was, now.map(|m| &**m))
            }
            Event::Delete(tl) => {
                let was = l.live.remove(tl, epoch);
                withdrew(tl, was, None)
            }
            Event::Init => {
                l.relist = Some(Table::default());
                Vec::new()
            }
            Event::InitApply(tl) => {
                l.relist.get_or_insert_default().insert(tl, epoch);
                Vec::new()
            }
            Event::InitDone => {
                let relisted = l.relist.take().unwrap_or_default();
                let old = std::mem::replace(&mut l.live, relisted);
                old.place
                    .into_iter()
                    .filter(|(key, was)| withdrawn(was, l.live.place.get(key).map(|m| &**m)))
                    .map(|(key, was)| Withdrawn {
                        namespace: key.namespace().to_owned(),
                        target: was.target.to_string(),
                        name: key.name().to_owned(),
                    })
                    .collect()
            }
        }
    }

    /// Takes in one event of the lease watch, as [`Self::apply`], and wakes
    /// the other members of every target it withdrew a member from (through
    /// `wake`, the controller's wake-up channel).
    pub fn wake_others(
        &self,
        cache: &Store<TargetLease>,
        event: &Event<TargetLease>,
        wake: &futures::channel::mpsc::UnboundedSender<ObjectRef<TargetLease>>,
    ) {
        for w in self.apply(event) {
            for other in self.on_target(cache, &w.namespace, &w.target) {
                if other.name_any() != w.name {
                    let _ = wake.unbounded_send(ObjectRef::from_obj(&*other));
                }
            }
        }
    }

    /// Whether a cached TargetLease names `ns`/`target` (release notices
    /// for any other target wake nothing: [`crate::operator::wakeups`]).
    pub fn names_target(&self, ns: &str, target: &str) -> bool {
        // Whoever sends a notice chooses its namespace: never one a
        // Kubernetes namespace cannot be, read as another one's target.
        if ns.contains('/') {
            return false;
        }
        let l = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        l.live.targets.contains_key(&NsName::new(ns, target))
    }

    /// Cache reads made so far to answer questions (each answer is reused
    /// until its target changes, so this grows with changes, not with passes).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// The members of `ns`/`target` in queue order, and the target's epoch.
    fn members(&self, ns: &str, target: &str) -> Option<(Vec<Place>, u64)> {
        let l = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let q = l.live.targets.get(&NsName::new(ns, target))?;
        Some((q.members.clone(), q.epoch))
    }

    fn read(&self, cache: &Store<TargetLease>, ns: &str, name: &str) -> Option<Arc<TargetLease>> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        cache.get(&ObjectRef::new(name).within(ns))
    }

    /// The members of `ns`/`target` as the cache has them, in queue order.
    pub fn on_target(
        &self,
        cache: &Store<TargetLease>,
        ns: &str,
        target: &str,
    ) -> Vec<Arc<TargetLease>> {
        let Some((members, _)) = self.members(ns, target) else {
            return Vec::new();
        };
        members
            .iter()
            .filter_map(|(_, name)| self.read(cache, ns, name))
            .filter(|o| o.spec.target == target)
            .collect()
    }

    /// The TargetLeases of namespace `ns` as the cache has them.
    pub fn in_namespace(&self, cache: &Store<TargetLease>, ns: &str) -> Vec<Arc<TargetLease>> {
        let names: Vec<Arc<str>> = {
            let l = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            l.live
                .by_namespace
                .get(ns)
                .map(|n| n.iter().cloned().collect())
                .unwrap_or_default()
        };
        names
            .iter()
            .filter_map(|name| self.read(cache, ns, name))
            .collect()
    }

    /// The oldest TargetLease on `me`'s target, created before it, that wants
    /// the lease (see [`super::queue`]). `pods_epoch` is the namespace's
    /// opted-in pod epoch: `wants` is asked again only when it or the target
    /// changed.
    pub fn queued_behind(
        &self,
        cache: &Store<TargetLease>,
        me: &TargetLease,
        pods_epoch: u64,
        wants: impl Fn(&TargetLease) -> bool,
    ) -> Option<String> {
        let ns = me.namespace().unwrap_or_default();
        let target = &me.spec.target;
        let key = NsName::new(&ns, target);
        let cached = {
            let l = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            l.live
                .targets
                .get(&key)
                .and_then(|q| q.head.clone())
                .filter(|(e, _)| *e == pods_epoch)
                .map(|(_, head)| head)
        };
        let head = match cached {
            Some(head) => head,
            None => {
                let (members, epoch) = self.members(&ns, target)?;
                let head = members.into_iter().find(|(_, name)| {
                    self.read(cache, &ns, name).is_some_and(|o| {
                        o.spec.target == *target && queue::may_queue(&o) && wants(&o)
                    })
                });
                let mut l = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(q) = l.live.targets.get_mut(&key)
                    && q.epoch == epoch
                {
                    q.head = Some((pods_epoch, head.clone()));
                }
                head
            }
        };
        let mine = place_of(me);
        head.filter(|h| *h < mine && h.1 != mine.1)
            .map(|h| h.1.to_string())
    }

    /// What the members of `ns`/`target` publish (Held, tokens).
    pub fn published(&self, cache: &Store<TargetLease>, ns: &str, target: &str) -> Arc<Published> {
        let key = NsName::new(ns, target);
        {
            let l = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = l.live.targets.get(&key).and_then(|q| q.published.clone()) {
                return p;
            }
        }
        let Some((members, epoch)) = self.members(ns, target) else {
            return Arc::default();
        };
        let mut published = Published::default();
        for (_, name) in members {
            let Some(o) = self.read(cache, ns, &name) else {
                continue;
            };
            let Some(s) = o.status.as_ref().filter(|_| o.spec.target == target) else {
                continue;
            };
            published.max_token = published.max_token.max(s.fencing_token.unwrap_or(0));
            let expires = s
                .expires_at
                .as_ref()
                .and_then(|e| u64::try_from(e.0.as_millisecond()).ok());
            if let Some(expires) = expires.filter(|_| plan::is_published_held(s)) {
                published.held.push((name, expires));
            }
        }
        let published = Arc::new(published);
        let mut l = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(q) = l.live.targets.get_mut(&key)
            && q.epoch == epoch
        {
            q.published = Some(published.clone());
        }
        published
    }
}

#[cfg(test)]
mod tests;
