//! When the leader's controller may act, and when `/readyz` says so: once
//! every cache has listed its objects whole and Valkey's clock has been read.
//! Until then reconciles, the sweeper and floor retention wait.
//!
//! A cache has synced once its stream passed the end of its first list
//! (`watcher::Event::InitDone`), which the reflector has swapped into the
//! store by then. Each stream reports it into one `watch` channel that keeps
//! the latest state, so whoever waits sees it however late they look. Not
//! kube's `Store::wait_until_ready`: its waiters share one wake-up slot, and
//! the controller itself waits on the TargetLease store, so a second waiter
//! could sleep through the moment.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::runtime::watcher;
use tokio::sync::watch;

use super::admin::RuntimeStatus;
use super::reconcile::clock::ServerClock;
use crate::store::LeaseStore;

/// How long a new leader waits for Valkey's `TIME` before it plans with the
/// local wall clock instead (only when Valkey does not answer).
const CLOCK_WAIT: Duration = Duration::from_secs(5);

/// One of the controller's caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cache {
    /// The TargetLeases.
    Leases,
    /// The (slimmed) pods.
    Pods,
    /// The token floors' ConfigMaps.
    Floors,
}

impl Cache {
    const ALL: u8 = 0b111;

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// Which of the controller's caches have synced; cloned into the stream
/// that feeds each cache and into whoever waits.
#[derive(Clone, Debug)]
pub struct CacheSync(watch::Sender<u8>);

impl Default for CacheSync {
    fn default() -> Self {
        Self(watch::Sender::new(0))
    }
}

impl CacheSync {
    /// What the stream feeding `cache` inspects each event with, after the
    /// reflector applied it: the end of a whole list marks `cache` synced
    /// (for good: a later relist does not take it back, as with kube's
    /// stores).
    pub fn watching<K>(&self, cache: Cache) -> impl Fn(&watcher::Event<K>) + use<K> {
        let synced = self.0.clone();
        move |event| {
            if matches!(event, watcher::Event::InitDone) {
                synced.send_if_modified(|s| {
                    let before = *s;
                    *s |= cache.bit();
                    *s != before
                });
            }
        }
    }

    /// Every cache has synced.
    pub fn all_synced(&self) -> bool {
        *self.0.borrow() == Cache::ALL
    }

    /// The caches that have not synced yet, by name.
    pub fn waiting(&self) -> Vec<&'static str> {
        let synced = *self.0.borrow();
        [
            (Cache::Leases, "targetleases"),
            (Cache::Pods, "pods"),
            (Cache::Floors, "token floor configmaps"),
        ]
        .into_iter()
        .filter(|(c, _)| synced & c.bit() == 0)
        .map(|(_, name)| name)
        .collect()
    }

    /// Resolves once every cache has synced.
    pub async fn wait(&self) {
        let mut synced = self.0.subscribe();
        // Cannot fail: `self` keeps the sender.
        let _ = synced.wait_for(|s| *s == Cache::ALL).await;
    }
}

/// The controller may act: every cache synced and the store's clock was
/// read. Set once per term; whoever waits is woken when it is.
#[derive(Clone, Debug)]
pub struct Ready(watch::Sender<bool>);

impl Default for Ready {
    fn default() -> Self {
        Self(watch::Sender::new(false))
    }
}

impl Ready {
    /// A controller that may act at once (what a test of what it does then
    /// starts from).
    pub fn already() -> Self {
        Self(watch::Sender::new(true))
    }

    fn set(&self) {
        self.0.send_replace(true);
    }

    /// Whether the controller may act now.
    pub fn is_ready(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the controller may act.
    pub async fn wait(&self) {
        let mut ready = self.0.subscribe();
        // Cannot fail: `self` keeps the sender.
        let _ = ready.wait_for(|r| *r).await;
    }
}

/// Waits until every cache synced, then reads Valkey's clock, then marks the
/// controller (`ready`) and the admin server's status as synced.
pub async fn become_ready(
    caches: CacheSync,
    store: Arc<dyn LeaseStore>,
    clock: Arc<ServerClock>,
    ready: Ready,
    runtime: Arc<RuntimeStatus>,
) {
    caches.wait().await;
    // Expiry is judged on Valkey's clock from the first pass on.
    read_server_time(&*store, &clock).await;
    tracing::debug!("caches synced");
    ready.set();
    runtime.synced.store(true, Ordering::SeqCst);
}

/// Reads Valkey's `TIME` (a health probe) into `clock`, retrying for up to
/// [`CLOCK_WAIT`]; the wall clock stands in until an answer comes.
async fn read_server_time(store: &dyn LeaseStore, clock: &ServerClock) {
    let give_up = tokio::time::Instant::now() + CLOCK_WAIT;
    loop {
        let sent = std::time::Instant::now();
        match tokio::time::timeout_at(give_up, store.health()).await {
            Ok(Ok(h)) => return clock.anchor(h.server_time_ms, sent),
            Ok(Err(e)) if tokio::time::Instant::now() < give_up => {
                tracing::debug!(error = %e, "no Valkey TIME yet");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            _ => {
                if !clock.is_anchored() {
                    tracing::warn!(
                        "Valkey did not answer; judging expiry by the local clock until it does"
                    );
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
