//! When the leader's controller may act, and when `/readyz` says so: once
//! every cache has listed its objects whole and Valkey's clock has been read.
//! Until then reconciles, the sweeper and floor retention wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::Store;

use super::admin::RuntimeStatus;
use super::crd::TargetLease;
use super::reconcile::clock::ServerClock;
use super::reconcile::pods::CachedPod;
use crate::store::LeaseStore;

/// How long a new leader waits for Valkey's `TIME` before it plans with the
/// local wall clock instead (only when Valkey does not answer).
const CLOCK_WAIT: Duration = Duration::from_secs(5);

/// The controller's caches, read by the reconciler.
pub struct Caches {
    /// The TargetLeases.
    pub leases: Store<TargetLease>,
    /// The (slimmed) pods.
    pub pods: Store<CachedPod>,
    /// The token floors' ConfigMaps.
    pub floors: Store<ConfigMap>,
}

/// Waits until every cache synced, then reads Valkey's clock, then marks the
/// controller (`synced`) and the admin server's status as synced.
pub async fn become_ready(
    caches: Caches,
    store: Arc<dyn LeaseStore>,
    clock: Arc<ServerClock>,
    synced: Arc<AtomicBool>,
    runtime: Arc<RuntimeStatus>,
) {
    let Caches {
        leases,
        pods,
        floors: floor_cache,
    } = caches;
    // Several tasks wait on these stores and a waiter's wake-up can be lost,
    // so ask again every 100ms instead of awaiting once.
    loop {
        let ready = |s: Result<Result<(), _>, _>| matches!(s, Ok(Ok(())));
        let tick = Duration::from_millis(100);
        let l = tokio::time::timeout(tick, leases.wait_until_ready()).await;
        let p = tokio::time::timeout(tick, pods.wait_until_ready()).await;
        let f = tokio::time::timeout(tick, floor_cache.wait_until_ready()).await;
        if ready(l) && ready(p) && ready(f) {
            break;
        }
    }
    // Expiry is judged on Valkey's clock from the first pass on.
    read_server_time(&*store, &clock).await;
    tracing::debug!("caches synced");
    synced.store(true, Ordering::SeqCst);
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
