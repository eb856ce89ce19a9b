//! Watches TargetLeases and pods of one namespace and records every version
//! it is delivered (status, pod marks) with its resourceVersion — etcd's
//! revision, one counter for both kinds. The watches relist by themselves
//! after an expired revision (etcd compaction); each such relist is counted.
//!
//! The workloads behind the published leases are played here too: whenever
//! a new (lease, token) shows up as Held status or as a pod's marks, a
//! "holder" writes to PostgreSQL with that token at once and again a little
//! later (possibly stale by then: the recipe must refuse it if a newer
//! token has written).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use targetlease::operator::crd::TargetLease;
use tokio::sync::Mutex;

use super::Stop;
use crate::history::{Mark, PodVersion, Publication, Recorder, now_ms};
use crate::sink::PgWriter;

const LABEL_SUFFIX: &str = ".targetlease.dev/leader";

fn rv<K: Resource>(o: &K) -> u64 {
    o.meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn time_ms(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> u64 {
    t.0.as_millisecond().max(0) as u64
}

fn rfc3339_ms(s: &str) -> Option<u64> {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond().max(0) as u64)
}

fn publication(tl: &TargetLease, deleted: bool, after_gap: bool) -> Publication {
    let s = tl.status.clone().unwrap_or_default();
    Publication {
        name: tl.name_any(),
        target: tl.spec.target.clone(),
        rv: rv(tl),
        seen_ms: now_ms(),
        phase: if deleted {
            "Deleted".into()
        } else {
            s.phase.map(|p| p.as_str().to_string()).unwrap_or_default()
        },
        after_gap,
        token: s.fencing_token,
        acquisition_id: s.acquisition_id,
        holder_pod: s.holder_pod,
        acquired_at_ms: s.acquired_at.as_ref().map(time_ms),
        expires_at_ms: s.expires_at.as_ref().map(time_ms),
    }
}

fn pod_version(p: &Pod, deleted: bool, after_gap: bool) -> PodVersion {
    let marks = if deleted {
        Vec::new()
    } else {
        p.labels()
            .iter()
            .filter_map(|(k, v)| {
                let lease = k.strip_suffix(LABEL_SUFFIX)?;
                (v == "true").then(|| {
                    let ann = |what: &str| {
                        p.annotations()
                            .get(&format!("{lease}.targetlease.dev/{what}"))
                            .cloned()
                    };
                    Mark {
                        lease: lease.to_string(),
                        token: ann("fencing-token").and_then(|t| t.parse().ok()),
                        expires_at_ms: ann("expires-at").as_deref().and_then(rfc3339_ms),
                    }
                })
            })
            .collect()
    };
    PodVersion {
        pod: p.name_any(),
        rv: rv(p),
        seen_ms: now_ms(),
        marks,
        after_gap,
    }
}

/// Plays the holder of a newly published token: writes now and once more later.
#[derive(Clone)]
pub struct Holders {
    writer: Arc<Mutex<PgWriter>>,
    rec: Recorder,
    seen: Arc<std::sync::Mutex<HashSet<(String, u64)>>>,
    seq: Arc<AtomicU64>,
    /// The writes still in flight: awaited (`settle`) before the final read
    /// of the downstream, or an acknowledged write could land after it.
    writes: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Holders {
    pub fn new(writer: PgWriter, rec: Recorder) -> Self {
        Self {
            writer: Arc::new(Mutex::new(writer)),
            rec,
            seen: Default::default(),
            seq: Default::default(),
            writes: Default::default(),
        }
    }

    /// Waits for every write started so far (each ends within its delay
    /// plus one downstream call).
    pub async fn settle(&self) {
        loop {
            let pending: Vec<_> =
                std::mem::take(&mut *self.writes.lock().unwrap_or_else(|p| p.into_inner()));
            if pending.is_empty() {
                return;
            }
            for w in pending {
                w.await.expect("holder write task");
            }
        }
    }

    fn act(&self, who: &str, resource: &str, token: u64) {
        let new = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((who.to_string(), token));
        if !new {
            return;
        }
        let me = self.clone();
        let (who, resource) = (who.to_string(), resource.to_string());
        let write = tokio::spawn(async move {
            for delay in [0, 2500] {
                tokio::time::sleep(Duration::from_millis(delay)).await;
                let id = format!("{who}-{token}-{}", me.seq.fetch_add(1, Ordering::SeqCst));
                let w = me.writer.lock().await.write(&resource, token, &id).await;
                me.rec.write(w);
            }
        });
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(write);
    }
}

/// Hands every object version the watch on `api` delivers to `seen` (with
/// `true` for a deletion, then `true` for a version a relist delivered: the
/// versions before it are unknown) until `stop`; returns how often the watch
/// listed again after its first list (an expired revision, a restarted
/// server).
async fn each_version<K>(api: Api<K>, stop: Stop, mut seen: impl FnMut(&K, bool, bool)) -> u64
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut lists: u64 = 0;
    let mut listing = false;
    // The last version of every live object, and what the current list delivered.
    let mut known: std::collections::HashMap<String, K> = Default::default();
    let mut listed: HashSet<String> = HashSet::new();
    // Back within half a second once the API server is: kube's default
    // backoff grows to 30 s over an outage, and the recorder would then see
    // the operator's work again long after the operator did it (recovery
    // is judged on what these watches see).
    let backoff = watcher::ExponentialBackoff::from(
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_millis(500))
            .with_factor(2.0)
            .without_max_times(),
    );
    let mut events = watcher(api, watcher::Config::default())
        .backoff(backoff)
        .boxed();
    while !stop.is_set() {
        let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(200), events.next()).await
        else {
            continue;
        };
        match ev {
            Ok(watcher::Event::Apply(o)) => {
                seen(&o, false, false);
                known.insert(o.name_any(), o);
            }
            Ok(watcher::Event::InitApply(o)) => {
                seen(&o, false, listing && lists > 1);
                listed.insert(o.name_any());
                known.insert(o.name_any(), o);
            }
            Ok(watcher::Event::Delete(o)) => {
                seen(&o, true, false);
                known.remove(&o.name_any());
            }
            Ok(watcher::Event::Init) => {
                lists += 1;
                listing = true;
                listed.clear();
            }
            Ok(watcher::Event::InitDone) => {
                listing = false;
                // Deleted while the watch was away: gone by the list's revision
                // (at least the newest version it delivered), when exactly is unknown.
                let at = known.values().map(|o| rv(o)).max().unwrap_or(0);
                let gone: Vec<String> = known
                    .keys()
                    .filter(|n| !listed.contains(*n))
                    .cloned()
                    .collect();
                for name in gone {
                    if let Some(mut o) = known.remove(&name) {
                        o.meta_mut().resource_version = Some(at.to_string());
                        seen(&o, true, true);
                    }
                }
            }
            Err(_) => {}
        }
    }
    lists.saturating_sub(1)
}

/// Records every TargetLease version until `stop`; returns how often the
/// watch had to relist because its revision had expired.
pub async fn leases(api: Api<TargetLease>, rec: Recorder, holders: Holders, stop: Stop) -> u64 {
    each_version(api, stop, |tl, deleted, after_gap| {
        // A deletion's phase is "Deleted": nobody acts on it.
        let p = publication(tl, deleted, after_gap);
        if let (true, Some(token)) = (p.phase == "Held", p.token) {
            holders.act(&p.name, &p.target, token);
        }
        rec.publication(p);
    })
    .await
}

/// Records every pod version until `stop`; `resource` names the election's
/// downstream resource. Returns how often the watch had to relist.
pub async fn pods(
    api: Api<Pod>,
    rec: Recorder,
    holders: Holders,
    resource: String,
    stop: Stop,
) -> u64 {
    each_version(api, stop, |p, deleted, after_gap| {
        // A deleted pod carries no marks: nobody acts on it.
        let v = pod_version(p, deleted, after_gap);
        for m in &v.marks {
            if let Some(token) = m.token {
                holders.act(&v.pod, &resource, token);
            }
        }
        rec.pod(v);
    })
    .await
}
