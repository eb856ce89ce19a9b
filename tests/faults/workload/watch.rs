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
use targetlease::crd::TargetLease;
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

fn publication(tl: &TargetLease, deleted: bool) -> Publication {
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
        token: s.fencing_token,
        acquisition_id: s.acquisition_id,
        acquired_at_ms: s.acquired_at.as_ref().map(time_ms),
        expires_at_ms: s.expires_at.as_ref().map(time_ms),
    }
}

fn pod_version(p: &Pod, deleted: bool) -> PodVersion {
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

/// True for the error that makes a watch relist: its revision was compacted.
fn expired(e: &watcher::Error) -> bool {
    let text = e.to_string();
    text.contains("too old resource version") || text.contains("Expired")
}

/// Hands every object version the watch on `api` delivers to `seen` (with
/// `true` for a deletion) until `stop`; returns how often the watch had to
/// relist because its revision had expired.
async fn each_version<K>(api: Api<K>, stop: Stop, mut seen: impl FnMut(&K, bool)) -> u64
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut relists: u64 = 0;
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while !stop.is_set() {
        let Ok(Some(ev)) = tokio::time::timeout(Duration::from_millis(200), events.next()).await
        else {
            continue;
        };
        match ev {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => seen(&o, false),
            Ok(watcher::Event::Delete(o)) => seen(&o, true),
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            Err(e) => relists += u64::from(expired(&e)),
        }
    }
    relists
}

/// Records every TargetLease version until `stop`; returns how often the
/// watch had to relist because its revision had expired.
pub async fn leases(api: Api<TargetLease>, rec: Recorder, holders: Holders, stop: Stop) -> u64 {
    each_version(api, stop, |tl, deleted| {
        // A deletion's phase is "Deleted": nobody acts on it.
        let p = publication(tl, deleted);
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
    each_version(api, stop, |p, deleted| {
        // A deleted pod carries no marks: nobody acts on it.
        let v = pod_version(p, deleted);
        for m in &v.marks {
            if let Some(token) = m.token {
                holders.act(&v.pod, &resource, token);
            }
        }
        rec.pod(v);
    })
    .await
}
