//! Every version of every Pod and TargetLease of a namespace, as two watches
//! delivered them, merged in the API server's global order (resourceVersion:
//! both kinds share one etcd revision counter), and replayed to check what the
//! operator published at every instant.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher;
use targetlease::operator::crd::{Phase, TargetLease};

/// One change, at one revision.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Change {
    Pod(String, Option<Pod>),
    Lease(String, Option<TargetLease>),
}

#[derive(Clone, Debug)]
pub struct Entry {
    pub rv: u64,
    /// Wall clock when the watch delivered it (for "how late" questions).
    pub seen: SystemTime,
    pub change: Change,
}

pub struct Timeline {
    seen: Arc<Mutex<Vec<Entry>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn rv_of(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl Timeline {
    pub fn record(client: &kube::Client, ns: &str) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let leases: Api<TargetLease> = Api::namespaced(client.clone(), ns);
        let sink = seen.clone();
        let pod_task = tokio::spawn(async move {
            let mut events = watcher::watcher(pods, watcher::Config::default()).boxed();
            while let Some(ev) = events.next().await {
                let (obj, gone) = match ev {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
                    Ok(watcher::Event::Delete(p)) => (p, true),
                    _ => continue,
                };
                let entry = Entry {
                    rv: rv_of(&obj.metadata),
                    seen: SystemTime::now(),
                    change: Change::Pod(obj.name_any(), (!gone).then_some(obj)),
                };
                sink.lock().unwrap().push(entry);
            }
        });
        let sink = seen.clone();
        let lease_task = tokio::spawn(async move {
            let mut events = watcher::watcher(leases, watcher::Config::default()).boxed();
            while let Some(ev) = events.next().await {
                let (obj, gone) = match ev {
                    Ok(watcher::Event::Apply(t) | watcher::Event::InitApply(t)) => (t, false),
                    Ok(watcher::Event::Delete(t)) => (t, true),
                    _ => continue,
                };
                let entry = Entry {
                    rv: rv_of(&obj.metadata),
                    seen: SystemTime::now(),
                    change: Change::Lease(obj.name_any(), (!gone).then_some(obj)),
                };
                sink.lock().unwrap().push(entry);
            }
        });
        Self {
            seen,
            tasks: vec![pod_task, lease_task],
        }
    }

    /// Everything seen so far, in revision order.
    pub fn entries(&self) -> Vec<Entry> {
        let mut all = self.seen.lock().unwrap().clone();
        all.sort_by_key(|e| e.rv);
        all
    }

    /// Versions of one TargetLease (None: deleted), in revision order.
    pub fn lease_versions(&self, name: &str) -> Vec<(u64, SystemTime, Option<TargetLease>)> {
        self.entries()
            .into_iter()
            .filter_map(|e| match e.change {
                Change::Lease(n, tl) if n == name => Some((e.rv, e.seen, tl)),
                _ => None,
            })
            .collect()
    }

    /// Replays every revision and returns each instant at which a pod got
    /// marks of a TargetLease it had not opted in to, carried
    /// marks its TargetLease's status did not name, two pods carried one
    /// election's leader label, an expires-at annotation was later than the
    /// status's, or a published token went below one published before for
    /// the same target.
    pub fn violations(&self) -> Vec<String> {
        let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
        let mut leases: BTreeMap<String, TargetLease> = BTreeMap::new();
        let mut highest: BTreeMap<String, (u64, String)> = BTreeMap::new();
        let mut out = Vec::new();
        let mut reported = BTreeSet::new();
        for e in self.entries() {
            match &e.change {
                Change::Pod(n, Some(p)) => {
                    for lease in marked_without_opting_in(pods.get(n), p) {
                        out.push(format!(
                            "rv {}: pod {n} got marks of TargetLease {lease} without the label {lease}.targetlease.dev/candidate: \"true\"",
                            e.rv
                        ));
                    }
                    pods.insert(n.clone(), p.clone());
                }
                Change::Pod(n, None) => {
                    pods.remove(n);
                }
                Change::Lease(n, Some(t)) => {
                    let st = t.status.clone().unwrap_or_default();
                    if let Some(token) = st.fencing_token {
                        let target = t.spec.target.clone();
                        if let Some((high, by)) = highest.get(&target)
                            && token < *high
                        {
                            out.push(format!(
                                "rv {}: {n} publishes token {token} on target {target}, below {high} published before by {by}",
                                e.rv
                            ));
                        }
                        let slot = highest.entry(target).or_insert((0, n.clone()));
                        if token >= slot.0 {
                            *slot = (token, n.clone());
                        }
                    }
                    leases.insert(n.clone(), t.clone());
                }
                Change::Lease(n, None) => {
                    leases.remove(n);
                }
            }
            for v in instant_violations(&pods, &leases) {
                // One line per distinct violation, at the first revision it appears.
                if reported.insert(v.clone()) {
                    out.push(format!("rv {} ({:?}): {v}", e.rv, describe(&e.change)));
                }
            }
        }
        out
    }
}

fn describe(c: &Change) -> String {
    match c {
        Change::Pod(n, Some(_)) => format!("pod {n} changed"),
        Change::Pod(n, None) => format!("pod {n} deleted"),
        Change::Lease(n, Some(t)) => {
            let s = t.status.clone().unwrap_or_default();
            format!(
                "TargetLease {n} -> {:?} holderPod={:?} token={:?} expiresAt={:?}",
                s.phase,
                s.holder_pod,
                s.fencing_token,
                s.expires_at.map(|t| t.0.to_string())
            )
        }
        Change::Lease(n, None) => format!("TargetLease {n} deleted"),
    }
}

const SUFFIXES: [&str; 3] = [
    ".targetlease.dev/leader",
    ".targetlease.dev/fencing-token",
    ".targetlease.dev/expires-at",
];

fn owner_of(key: &str) -> Option<&str> {
    SUFFIXES.iter().find_map(|s| key.strip_suffix(s))
}

/// The TargetLeases whose marks `now` gained or changed since `before`
/// (a new pod: every mark it carries) although `now` has not opted in to
/// them. Marks a pod keeps after losing its opt-in label are not counted:
/// taking them off takes the operator a moment.
pub fn marked_without_opting_in(before: Option<&Pod>, now: &Pod) -> Vec<String> {
    let keys = |p: &Pod| -> BTreeMap<String, String> {
        p.labels()
            .iter()
            .chain(p.annotations().iter())
            .filter(|(k, _)| owner_of(k).is_some())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let old = before.map(keys).unwrap_or_default();
    let mut out: Vec<String> = keys(now)
        .into_iter()
        .filter(|(k, v)| old.get(k) != Some(v))
        .filter_map(|(k, _)| owner_of(&k).map(str::to_owned))
        .filter(|lease| {
            now.labels()
                .get(&format!("{lease}.targetlease.dev/candidate"))
                .map(String::as_str)
                != Some("true")
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn ms(rfc3339: &str) -> Option<i64> {
    rfc3339
        .parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}

fn instant_violations(
    pods: &BTreeMap<String, Pod>,
    leases: &BTreeMap<String, TargetLease>,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut leaders: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (pod_name, pod) in pods {
        let mut owners: BTreeSet<&str> = BTreeSet::new();
        for k in pod.labels().keys().chain(pod.annotations().keys()) {
            if let Some(o) = owner_of(k) {
                owners.insert(o);
            }
        }
        for owner in owners {
            let label = pod.labels().get(&format!("{owner}.targetlease.dev/leader"));
            if label.map(String::as_str) == Some("true") {
                leaders
                    .entry(owner.to_owned())
                    .or_default()
                    .push(pod_name.clone());
            }
            let Some(tl) = leases.get(owner) else {
                out.push(format!(
                    "pod {pod_name} carries marks of {owner}, which does not exist"
                ));
                continue;
            };
            let st = tl.status.clone().unwrap_or_default();
            if st.phase != Some(Phase::Held) {
                out.push(format!(
                    "pod {pod_name} carries marks of {owner} whose status is {:?}",
                    st.phase
                ));
                continue;
            }
            if st.holder_pod.as_deref() != Some(pod_name.as_str()) {
                out.push(format!(
                    "pod {pod_name} carries marks of {owner} whose status names pod {:?}",
                    st.holder_pod
                ));
                continue;
            }
            if let (Some(uid), Some(pod_uid)) = (st.holder_pod_uid.as_deref(), pod.uid())
                && uid != pod_uid
            {
                out.push(format!(
                    "pod {pod_name} (uid {pod_uid}) carries marks of {owner} whose status names uid {uid}"
                ));
            }
            let token = pod
                .annotations()
                .get(&format!("{owner}.targetlease.dev/fencing-token"));
            if let Some(token) = token
                && Some(token.clone()) != st.fencing_token.map(|t| t.to_string())
            {
                out.push(format!(
                    "pod {pod_name} carries token {token} of {owner} whose status says {:?}",
                    st.fencing_token
                ));
            }
            let annotated = pod
                .annotations()
                .get(&format!("{owner}.targetlease.dev/expires-at"))
                .and_then(|v| ms(v));
            let published = st.expires_at.as_ref().map(|t| t.0.as_millisecond());
            // Status times have one-second resolution; the annotation is written
            // from the unrounded value (see the test of that), so compare seconds.
            if let (Some(a), Some(p)) = (annotated, published)
                && a.div_euclid(1000) * 1000 > p
            {
                out.push(format!(
                    "pod {pod_name} carries expires-at of {owner} {a} later than its status's {p} (by {} ms)",
                    a - p
                ));
            }
        }
    }
    for (owner, pods) in leaders {
        if pods.len() > 1 {
            out.push(format!(
                "{owner} leader label on {} pods: {pods:?}",
                pods.len()
            ));
        }
    }
    out
}

impl Drop for Timeline {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
