//! What the bench sees of TargetLeases and pods, kept current by watches, so
//! waiting for "all Held" costs no polling of the API server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use targetlease::crd::{Phase, TargetLease};
use tokio::sync::watch;

/// Last seen state of one TargetLease.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Seen {
    pub phase: Option<Phase>,
    pub holder: Option<String>,
    pub token: Option<u64>,
    pub resource_version: Option<String>,
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
    /// Pods carrying the leader label.
    leaders: HashMap<String, bool>,
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
        {
            let (state, tx) = (state.clone(), tx.clone());
            tokio::spawn(async move {
                let mut events = watcher::watcher(leases, watcher::Config::default()).boxed();
                while let Some(ev) = events.next().await {
                    if ev.is_err() {
                        // The watcher retries at once; don't spin while the apiserver is away.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                    let mut s = state.lock().unwrap();
                    match ev {
                        Ok(Event::Apply(tl)) | Ok(Event::InitApply(tl)) => {
                            let st = tl.status.clone().unwrap_or_default();
                            let seen = Seen {
                                phase: st.phase,
                                holder: st.holder,
                                token: st.fencing_token,
                                resource_version: tl.resource_version(),
                            };
                            let now_held = seen.held();
                            let old = s.leases.insert(tl.name_any(), seen);
                            let was_held = old.as_ref().is_some_and(Seen::held);
                            s.held = s.held + now_held as usize - was_held as usize;
                            s.changes += 1;
                        }
                        Ok(Event::Delete(tl)) => {
                            if let Some(old) = s.leases.remove(&tl.name_any()) {
                                s.held -= old.held() as usize;
                            }
                            s.changes += 1;
                        }
                        _ => continue,
                    }
                    drop(s);
                    tx.send_modify(|n| *n += 1);
                }
            });
        }
        {
            let (state, tx) = (state.clone(), tx.clone());
            tokio::spawn(async move {
                let mut events = watcher::watcher(pods, watcher::Config::default()).boxed();
                while let Some(ev) = events.next().await {
                    if ev.is_err() {
                        // The watcher retries at once; don't spin while the apiserver is away.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                    let mut s = state.lock().unwrap();
                    match ev {
                        Ok(Event::Apply(p)) | Ok(Event::InitApply(p)) => {
                            // Any election's leader label (`<name>.targetlease.dev/leader`).
                            let leader = p.labels().iter().any(|(k, v)| {
                                k.ends_with(".targetlease.dev/leader") && v == "true"
                            });
                            s.leaders.insert(p.name_any(), leader);
                        }
                        Ok(Event::Delete(p)) => {
                            s.leaders.remove(&p.name_any());
                        }
                        _ => continue,
                    }
                    drop(s);
                    tx.send_modify(|n| *n += 1);
                }
            });
        }
        Tracker { state, bump: rx }
    }

    pub fn held_count(&self) -> usize {
        self.state.lock().unwrap().held
    }

    pub fn changes(&self) -> u64 {
        self.state.lock().unwrap().changes
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
