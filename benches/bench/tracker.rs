//! What the bench sees of TargetLeases and pods, kept current by watches, so
//! waiting for "all Held" costs no polling of the API server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use targetlease::operator::crd::{Phase, TargetLease};
use tokio::sync::watch;

/// How much later a status rewrite of a lease Held with the same token must
/// publish its expiry to count as its scheduled republish: the operator
/// rewrites `expiresAt` once per `leaseDuration - renewInterval` (60 s with
/// the defaults the bench's TargetLeases use), moving it that much later;
/// less 5 s for the renewals' timing. Measured on the published expiries
/// themselves, not on when the bench saw the lease Held: under a burst a
/// lease's first status can be published many seconds after Valkey granted
/// it, and its republish then follows its Held by less.
pub const REPUBLISH_MOVES: Duration = Duration::from_secs(55);

/// Last seen state of one TargetLease.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Seen {
    pub phase: Option<Phase>,
    pub holder: Option<String>,
    pub token: Option<u64>,
    pub expires_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    pub resource_version: Option<String>,
    /// When the bench first saw it Held with this holder and token.
    pub held_since: Option<Instant>,
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
    /// Watch events that moved a `Held` lease's published expiry at least
    /// [`REPUBLISH_MOVES`] later (same holder and token): the operator's
    /// scheduled republish of a lease it holds, not work towards a new
    /// lease's `Held`. A rewrite that moves it less is not counted here (it
    /// stays a write of the lease's way to Held).
    /// Each is kept as its resourceVersion (a number; one the API server
    /// gave in another form counts as the newest there is).
    republished: Vec<u64>,
    /// The same by the rule the bench used before: a rewrite moving the
    /// expiry later at least [`REPUBLISH_MOVES`] after the bench first saw the
    /// lease Held (kept to compare the two rules in one run).
    republished_by_age: Vec<u64>,
    /// The newest TargetLease resourceVersion the watch delivered.
    newest_version: u64,
    /// Pods carrying the leader label.
    leaders: HashMap<String, bool>,
}

impl State {
    fn lease_seen(&mut self, tl: TargetLease, deleted: bool) {
        let old = if deleted {
            self.leases.remove(&tl.name_any())
        } else {
            let st = tl.status.clone().unwrap_or_default();
            let seen = Seen {
                phase: st.phase,
                holder: st.holder,
                token: st.fencing_token,
                expires_at: st.expires_at,
                resource_version: tl.resource_version(),
                held_since: None,
            };
            let now = Instant::now();
            let version = version_number(seen.resource_version.as_deref());
            self.newest_version = self.newest_version.max(version);
            let same_grant = self.leases.get(&tl.name_any()).filter(|o| {
                o.held() && seen.held() && o.holder == seen.holder && o.token == seen.token
            });
            let mut seen = seen;
            seen.held_since = match same_grant {
                Some(old) => {
                    let moved = moved_ms(old, &seen);
                    if moved >= REPUBLISH_MOVES.as_millis() as i64 {
                        self.republished.push(version);
                    }
                    let since = old.held_since.unwrap_or(now);
                    if moved > 0 && now.saturating_duration_since(since) >= REPUBLISH_MOVES {
                        self.republished_by_age.push(version);
                    }
                    Some(since)
                }
                None => seen.held().then_some(now),
            };
            self.held += seen.held() as usize;
            self.leases.insert(tl.name_any(), seen)
        };
        self.held -= old.as_ref().is_some_and(Seen::held) as usize;
        self.changes += 1;
    }

    fn pod_seen(&mut self, p: Pod, deleted: bool) {
        if deleted {
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

/// Applies every object version the watch on `api` delivers to the shared
/// state (with `true` for a deletion), then wakes the waiters.
fn follow<K>(
    api: Api<K>,
    state: Arc<Mutex<State>>,
    bump: Arc<watch::Sender<u64>>,
    apply: fn(&mut State, K, bool),
) where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        let mut events = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = events.next().await {
            let (object, deleted) = match ev {
                Err(_) => {
                    // The watcher retries at once; don't spin while the apiserver is away.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Ok(Event::Apply(o) | Event::InitApply(o)) => (o, false),
                Ok(Event::Delete(o)) => (o, true),
                Ok(Event::Init | Event::InitDone) => continue,
            };
            apply(&mut state.lock().unwrap(), object, deleted);
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
        follow(leases, state.clone(), tx.clone(), State::lease_seen);
        follow(pods, state.clone(), tx, State::pod_seen);
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
    pub fn republished_upto(&self, version: u64) -> u64 {
        let st = self.state.lock().unwrap();
        st.republished.iter().filter(|v| **v <= version).count() as u64
    }

    /// The same by the bench's earlier rule (see `State::republished_by_age`).
    pub fn republished_by_age_upto(&self, version: u64) -> u64 {
        let st = self.state.lock().unwrap();
        st.republished_by_age
            .iter()
            .filter(|v| **v <= version)
            .count() as u64
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
