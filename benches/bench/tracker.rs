//! What the bench sees of TargetLeases and pods, kept current by watches, so
//! waiting for "all Held" costs no polling of the API server.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use targetlease::operator::crd::{Phase, TargetLease};
use tokio::sync::watch;

/// How much later the operator's scheduled republish moves a lease's
/// published expiry: it rewrites `expiresAt` once per `leaseDuration -
/// renewInterval` (60 s with the defaults the bench's TargetLeases use), less
/// 5 s for the renewals' timing. A republish moving it less is one made as
/// the published expiry was about to pass, publishing the later expiry a
/// renewal had obtained meanwhile (its renewals waited behind the
/// acquisitions). Only for the report's breakdown: every rewrite that moves
/// a `Held` lease's expiry later is a republish ([`State::republished`]).
pub const SCHEDULED_MOVE: Duration = Duration::from_secs(55);
/// One `renewInterval` (30 s with the bench's defaults) less 5 s: how far
/// the report's middle band of republishes reaches down, and how soon after
/// another republish of the same grant a republish is one too many
/// ([`Republishes::doubled`]).
pub const ONE_RENEWAL: Duration = Duration::from_secs(25);

/// Republishes counted up to some version, by how far each moved the
/// published expiry later.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Republishes {
    /// Moved it at least [`SCHEDULED_MOVE`] later.
    pub moved_55: u64,
    /// At least [`ONE_RENEWAL`], less than [`SCHEDULED_MOVE`].
    pub moved_25: u64,
    /// Less than [`ONE_RENEWAL`].
    pub moved_less: u64,
    /// Of all these, republishes that came less than [`ONE_RENEWAL`] after
    /// the bench saw another republish of the same grant (a late republish
    /// that left too little time, written again after the renewal that
    /// followed): one write of each such pair is not taken off.
    pub doubled: u64,
}

impl Republishes {
    pub fn total(&self) -> u64 {
        self.moved_55 + self.moved_25 + self.moved_less
    }

    /// The writes taken off the count towards `Held`: every republish but
    /// the doubled ones.
    pub fn taken_off(&self) -> u64 {
        self.total() - self.doubled
    }

    fn add(&mut self, r: &Republish) {
        if r.moved_ms >= SCHEDULED_MOVE.as_millis() as i64 {
            self.moved_55 += 1;
        } else if r.moved_ms >= ONE_RENEWAL.as_millis() as i64 {
            self.moved_25 += 1;
        } else {
            self.moved_less += 1;
        }
        self.doubled += r.doubled as u64;
    }
}

/// One republish the watch delivered.
struct Republish {
    /// Its resourceVersion (a number; one the API server gave in another
    /// form counts as the newest there is).
    version: u64,
    /// How much later it published the expiry (ms).
    moved_ms: i64,
    /// Less than [`ONE_RENEWAL`] after the previous republish of the grant.
    doubled: bool,
}

/// What a watch event did to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// Created or modified.
    Applied,
    /// Listed again after the watch restarted: several writes may lie
    /// between it and the version seen before.
    Relisted,
    Deleted,
}

/// Last seen state of one TargetLease.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Seen {
    pub phase: Option<Phase>,
    pub holder: Option<String>,
    pub token: Option<u64>,
    pub expires_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    pub resource_version: Option<String>,
    /// When the bench last saw this grant republished.
    pub republished_at: Option<Instant>,
}

impl Seen {
    pub fn held(&self) -> bool {
        self.phase == Some(Phase::Held) && self.token.is_some()
    }
}

#[derive(Default)]
struct State {
    leases: HashMap<String, Seen>,
    held: usize,
    /// Watch events that changed a lease (object modifications seen).
    changes: u64,
    /// Watch events that moved a `Held` lease's published expiry later (same
    /// holder and token): the operator's republishes of leases it holds
    /// (renewal work, judged by the steady state's writes per minute), not
    /// work towards a new lease's `Held`. No acquisition moves it: an
    /// acquire is planned only from a status that is not `Held`, and its
    /// write is conditional on the version it planned from; with the spec
    /// unchanged, as in the bench, only a renewal gives a later expiry. A
    /// rewrite that does not move it later (a status written twice, a
    /// conflict retried, `Held` withdrawn and published again) is not
    /// counted here: it stays a write of the lease's way to `Held`. Nor is a
    /// version seen only in a relist.
    republished: Vec<Republish>,
    /// The newest TargetLease resourceVersion the watch delivered.
    newest_version: u64,
    /// Pods carrying the leader label.
    leaders: HashMap<String, bool>,
}

impl State {
    fn lease_seen(&mut self, tl: TargetLease, change: Change) {
        let old = if change == Change::Deleted {
            self.leases.remove(&tl.name_any())
        } else {
            let st = tl.status.clone().unwrap_or_default();
            let mut seen = Seen {
                phase: st.phase,
                holder: st.holder,
                token: st.fencing_token,
                expires_at: st.expires_at,
                resource_version: tl.resource_version(),
                republished_at: None,
            };
            let version = version_number(seen.resource_version.as_deref());
            self.newest_version = self.newest_version.max(version);
            let same_grant = self.leases.get(&tl.name_any()).filter(|o| {
                o.held() && seen.held() && o.holder == seen.holder && o.token == seen.token
            });
            if let Some(old) = same_grant {
                seen.republished_at = old.republished_at;
                let moved_ms = moved_ms(old, &seen);
                if moved_ms > 0 {
                    let now = Instant::now();
                    // Seen only in a relist: not taken off, yet a republish
                    // right after it is one too many all the same.
                    if change == Change::Applied {
                        let doubled = old
                            .republished_at
                            .is_some_and(|at| now.saturating_duration_since(at) < ONE_RENEWAL);
                        self.republished.push(Republish {
                            version,
                            moved_ms,
                            doubled,
                        });
                    }
                    seen.republished_at = Some(now);
                }
            }
            self.held += seen.held() as usize;
            let version = seen.resource_version.clone();
            let old = self.leases.insert(tl.name_any(), seen);
            // A relist hands every object over again: only a new version is a change.
            if change == Change::Relisted
                && old.as_ref().is_some_and(|o| o.resource_version == version)
            {
                self.held -= old.as_ref().is_some_and(Seen::held) as usize;
                return;
            }
            old
        };
        self.held -= old.as_ref().is_some_and(Seen::held) as usize;
        self.changes += 1;
    }

    /// After a relist: forgets the leases it did not list (deleted while
    /// the watch was away), as a deletion would.
    fn leases_relisted(&mut self, listed: &HashSet<String>) {
        let gone: Vec<String> = self
            .leases
            .keys()
            .filter(|name| !listed.contains(*name))
            .cloned()
            .collect();
        for name in gone {
            if self.leases.remove(&name).is_some_and(|s| s.held()) {
                self.held -= 1;
            }
            self.changes += 1;
        }
    }

    fn pods_relisted(&mut self, listed: &HashSet<String>) {
        self.leaders.retain(|name, _| listed.contains(name));
    }

    fn pod_seen(&mut self, p: Pod, change: Change) {
        if change == Change::Deleted {
            self.leaders.remove(&p.name_any());
        } else {
            // Any election's leader label (`<name>.targetlease.dev/leader`).
            let leader = p
                .labels()
                .iter()
                .any(|(k, v)| k.ends_with(".targetlease.dev/leader") && v == "true");
            self.leaders.insert(p.name_any(), leader);
        }
    }
}

/// How many milliseconds later `new` publishes the lease's expiry than `old`
/// (0 when either publishes none).
fn moved_ms(old: &Seen, new: &Seen) -> i64 {
    match (&old.expires_at, &new.expires_at) {
        (Some(o), Some(n)) => n.0.as_millisecond() - o.0.as_millisecond(),
        _ => 0,
    }
}

/// A resourceVersion as a number (etcd's revision, which the API server
/// hands out in order); anything else sorts after every number.
pub fn version_number(v: Option<&str>) -> u64 {
    v.and_then(|v| v.parse().ok()).unwrap_or(u64::MAX)
}

/// What a watch's events do to the state: one object version, and the end
/// of a relist (the names it listed).
type Handlers<K> = (fn(&mut State, K, Change), fn(&mut State, &HashSet<String>));

/// Applies every object version the watch on `api` delivers to the shared
/// state (with what the event did; after a relist, `relisted` with the
/// names it listed), then wakes the waiters.
fn follow<K>(
    api: Api<K>,
    state: Arc<Mutex<State>>,
    bump: Arc<watch::Sender<u64>>,
    (apply, relisted): Handlers<K>,
) where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        let mut events = watcher::watcher(api, watcher::Config::default()).boxed();
        let mut listed = HashSet::new();
        while let Some(ev) = events.next().await {
            let (object, change) = match ev {
                Err(_) => {
                    // The watcher retries at once; don't spin while the apiserver is away.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Ok(Event::Apply(o)) => (o, Change::Applied),
                Ok(Event::InitApply(o)) => {
                    listed.insert(o.name_any());
                    (o, Change::Relisted)
                }
                Ok(Event::Delete(o)) => (o, Change::Deleted),
                Ok(Event::Init) => {
                    listed.clear();
                    continue;
                }
                Ok(Event::InitDone) => {
                    relisted(&mut state.lock().unwrap(), &std::mem::take(&mut listed));
                    bump.send_modify(|n| *n += 1);
                    continue;
                }
            };
            apply(&mut state.lock().unwrap(), object, change);
            bump.send_modify(|n| *n += 1);
        }
    });
}

/// Watches TargetLeases and pods of one namespace.
#[derive(Clone)]
pub struct Tracker {
    state: Arc<Mutex<State>>,
    bump: watch::Receiver<u64>,
}

impl Tracker {
    pub fn start(client: &Client, ns: &str) -> Tracker {
        let state = Arc::new(Mutex::new(State::default()));
        let (tx, rx) = watch::channel(0u64);
        let tx = Arc::new(tx);
        let leases: Api<TargetLease> = Api::namespaced(client.clone(), ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let lease_events: Handlers<TargetLease> = (State::lease_seen, State::leases_relisted);
        follow(leases, state.clone(), tx.clone(), lease_events);
        let pod_events: Handlers<Pod> = (State::pod_seen, State::pods_relisted);
        follow(pods, state.clone(), tx, pod_events);
        Tracker { state, bump: rx }
    }

    pub fn held_count(&self) -> usize {
        self.state.lock().unwrap().held
    }

    pub fn changes(&self) -> u64 {
        self.state.lock().unwrap().changes
    }

    /// Republishes (see `State::republished`) seen so far whose
    /// resourceVersion is at most `version`.
    pub fn republished_upto(&self, version: u64) -> Republishes {
        let st = self.state.lock().unwrap();
        let mut r = Republishes::default();
        for p in st.republished.iter().filter(|p| p.version <= version) {
            r.add(p);
        }
        r
    }

    /// The newest TargetLease resourceVersion the watch delivered.
    pub fn newest_version(&self) -> u64 {
        self.state.lock().unwrap().newest_version
    }

    pub fn get(&self, name: &str) -> Option<Seen> {
        self.state.lock().unwrap().leases.get(name).cloned()
    }

    pub fn snapshot(&self) -> HashMap<String, Seen> {
        self.state.lock().unwrap().leases.clone()
    }

    pub fn is_leader(&self, pod: &str) -> bool {
        self.state
            .lock()
            .unwrap()
            .leaders
            .get(pod)
            .copied()
            .unwrap_or(false)
    }

    /// Waits until `cond` holds; returns the instant it was first seen, or
    /// None after `timeout`.
    pub async fn wait(
        &self,
        timeout: Duration,
        cond: impl Fn(&Tracker) -> bool,
    ) -> Option<Instant> {
        let mut rx = self.bump.clone();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            if cond(self) {
                return Some(Instant::now());
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return cond(self).then(Instant::now),
            }
        }
    }
}
