//! Wires the reconciler to the cluster: caches, watches, wake-ups, leader
//! election among replicas, and shutdown.

pub mod admin;
pub mod api_timeout;
pub mod cache;
pub mod conditions;
pub mod config_error;
pub mod crd;
pub mod election;
pub mod floor;
pub mod leadership;
pub mod lease_id;
pub mod metrics;
pub mod reconcile;
pub mod retention;
pub mod subscribe;
pub mod sweep;
pub mod wakeups;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::utils::ResetTimerBackoff;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use crate::operator::admin::RuntimeStatus;
use crate::operator::cache::{LIST_PAGE, WatchedLease, lease_event};
use crate::operator::crd::TargetLease;
use crate::operator::election::{Elector, Timings};
use crate::operator::floor::{FloorPolicy, FloorStore};
use crate::operator::leadership::Leadership;
use crate::operator::lease_id::LeaseIdKey;
use crate::operator::metrics::OperatorMetrics;
use crate::operator::reconcile::clock::ServerClock;
use crate::operator::reconcile::index::LeaseIndex;
use crate::operator::reconcile::keeper::Keeper;
use crate::operator::reconcile::pod_index::{PodCache, PodIndex};
use crate::operator::reconcile::pods::CachedPod;
use crate::operator::reconcile::selectors::Selectors;
use crate::operator::reconcile::slots::FairSlots;
use crate::operator::reconcile::{Context, pods};
use crate::store::{LeaseStore, Target};

/// Everything the controller needs, parsed once by the CLI.
pub struct OperatorConfig {
    /// Kubernetes client.
    pub client: kube::Client,
    /// The lease store.
    pub store: Arc<dyn LeaseStore>,
    /// Namespace of the ConfigMaps keeping tokens of deleted leases.
    pub floor_namespace: String,
    /// What the names of those ConfigMaps (one per namespace) start with.
    pub floor_configmap: String,
    /// How many floors a namespace keeps, and for how long.
    pub floor_policy: FloorPolicy,
    /// Key for deriving lease ids.
    pub lease_ids: LeaseIdKey,
    /// Reconciles running at once (shared fairly among namespaces).
    pub concurrency: u16,
    /// Only watch this namespace (all namespaces when absent).
    pub watch_namespace: Option<String>,
    /// This replica's name, for Events and leader election.
    pub instance: String,
    /// Reconcile metrics.
    pub metrics: OperatorMetrics,
    /// Leadership and cache state, read by the admin server.
    pub runtime: Arc<RuntimeStatus>,
    /// Open while this replica may write (always, without leader election).
    pub leadership: Leadership,
    /// Valkey's clock as this process estimates it.
    pub clock: Arc<ServerClock>,
    /// Renews published leases whose reconcile is late; lives across terms.
    pub keeper: Arc<Keeper>,
    /// How long the API server keeps a watch open before it ends it; a watch
    /// silent for longer (plus a margin) is taken for dead and made again.
    pub watch_timeout: Duration,
}

/// How long a new leader waits for Valkey's `TIME` before it plans with the
/// local wall clock instead (only when Valkey does not answer).
const CLOCK_WAIT: Duration = Duration::from_secs(5);

fn api<K>(client: &kube::Client, namespace: &Option<String>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// How every cache watches: in pages of [`LIST_PAGE`] (a cluster with many
/// pods is listed in pages, never in one reply the API server and the
/// operator would each hold whole), each watch ended by
/// the API server after `timeout` (and made again).
fn watching(timeout: Duration) -> watcher::Config {
    watcher::Config::default()
        .timeout(timeout.as_secs().clamp(1, 3600) as u32)
        .page_size(LIST_PAGE)
}

/// Runs the controller until `stop` resolves. `release_notices` are targets that
/// may have become free (releases from anywhere, including outside
/// Kubernetes); their TargetLeases are woken at once.
pub async fn control(
    cfg: &OperatorConfig,
    release_notices: BoxStream<'static, Target>,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = cfg.client.clone();
    let watching = || watching(cfg.watch_timeout);
    // Back on watching within seconds once the API server is back (kube's
    // default waits up to 30 s after a few failures, and pauses every
    // trigger of the controller meanwhile, leaving caches stale).
    let backoff = || {
        ResetTimerBackoff::new(
            watcher::ExponentialBackoff::from(
                backon::ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(500))
                    .with_max_delay(Duration::from_secs(3))
                    .with_factor(2.0)
                    .with_jitter()
                    .without_max_times(),
            ),
            Duration::from_secs(60),
        )
    };
    let (pod_reader, pod_writer) = reflector::store::<CachedPod>();
    let pod_index = Arc::new(PodIndex::default());
    let pod_stream = reflector::reflector(
        pod_writer,
        // Each pod is slimmed as it is decoded (`CachedPod`).
        watcher(api::<CachedPod>(&client, &cfg.watch_namespace), watching()),
    )
    // After the cache took the event (see `index`).
    .inspect_ok({
        let index = pod_index.clone();
        move |event| index.apply(event)
    })
    .touched_objects();
    let (floor_reader, floor_writer) = reflector::store::<ConfigMap>();
    let floor_stream = reflector::reflector(
        floor_writer,
        watcher(
            Api::<ConfigMap>::namespaced(client.clone(), &cfg.floor_namespace),
            watching().labels(&FloorStore::selector(&cfg.floor_configmap)),
        ),
    )
    .backoff(backoff())
    .for_each(|_| futures::future::ready(()));
    let floor_task = tokio::spawn(floor_stream);

    let (leases, lease_writer) = reflector::store::<TargetLease>();
    let lease_index = Arc::new(LeaseIndex::default());
    // The targets release notices may wake (see `wakeups`).
    let known = wakeups::Known::default();
    let lease_stream = reflector::reflector(
        lease_writer,
        watcher(
            api::<WatchedLease>(&client, &cfg.watch_namespace),
            watching(),
        )
        .map_ok(lease_event),
    )
    .inspect_ok({
        let index = lease_index.clone();
        move |event| index.apply(event)
    })
    .touched_objects()
    .inspect_ok({
        let known = known.clone();
        move |tl| known.saw(tl)
    });
    let controller = Controller::for_stream(lease_stream, leases.clone());
    if let Ok(mut slot) = cfg.runtime.leases.write() {
        *slot = Some(leases.clone());
    }
    let synced = Arc::new(AtomicBool::new(false));
    let floors = FloorStore::new(
        client.clone(),
        &cfg.floor_namespace,
        &cfg.floor_configmap,
        floor_reader.clone(),
    )
    .with_policy(cfg.floor_policy);
    let sync_task = {
        let (leases, pods, floor_cache) = (leases.clone(), pod_reader.clone(), floor_reader);
        let (runtime, synced) = (cfg.runtime.clone(), synced.clone());
        let (store, clock) = (cfg.store.clone(), cfg.clock.clone());
        tokio::spawn(async move {
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
        })
    };
    let (wake_tx, wake_rx) = futures::channel::mpsc::unbounded();
    let selectors = Arc::new(Selectors::default());
    let ctx = Arc::new(Context {
        client: client.clone(),
        store: cfg.store.clone(),
        leases: leases.clone(),
        lease_index: lease_index.clone(),
        pods: PodCache {
            store: pod_reader,
            index: pod_index,
        },
        selectors: selectors.clone(),
        slots: FairSlots::new(cfg.concurrency.into()),
        floors,
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "targetlease-operator".into(),
                instance: Some(cfg.instance.clone()),
            },
        ),
        lease_ids: cfg.lease_ids.clone(),
        wake: wake_tx,
        metrics: cfg.metrics.clone(),
        leadership: cfg.leadership.clone(),
        synced,
        memory: Default::default(),
        published: Default::default(),
        clock: cfg.clock.clone(),
        keeper: cfg.keeper.clone(),
    });
    cfg.keeper.wake_through(Some(ctx.wake.clone()));
    let sweeper = tokio::spawn(sweep::sweep(ctx.clone()));
    let retention = tokio::spawn(retention::expire_floors(ctx.clone(), cfg.floor_policy));
    let released = {
        let ctx = ctx.clone();
        // Anyone allowed to publish can send notices: bounded before they wake anything.
        wakeups::bounded(
            release_notices,
            known,
            leases.clone(),
            cfg.metrics.clone(),
            wakeups::Limits::default(),
        )
        .flat_map(move |target| futures::stream::iter(ctx.released(&target)))
    };
    controller
        // Every due reconcile starts at once and waits for one of the
        // `concurrency` slots in its namespace's turn (`FairSlots`): the
        // controller's own limit would serve them by due time, letting one
        // namespace's backlog delay every other namespace's renewals.
        .with_config(ControllerConfig::default())
        .trigger_backoff(backoff())
        .watches_stream(pod_stream, move |pod: CachedPod| {
            // The pod's own TargetLeases (of its namespace), and every lease
            // queued on their targets: a head of queue that stops wanting the
            // lease must wake the next one.
            let ns = pod.namespace().unwrap_or_default();
            let mut targets: Vec<String> = lease_index
                .in_namespace(&leases, &ns)
                .iter()
                .filter(|tl| pods::concerns(tl, &pod, &selectors))
                .map(|tl| tl.spec.target.clone())
                .collect();
            targets.sort();
            targets.dedup();
            targets
                .iter()
                .flat_map(|t| lease_index.on_target(&leases, &ns, t))
                .map(|tl| ObjectRef::from_obj(&*tl))
                .collect::<Vec<_>>()
        })
        .reconcile_on(futures::stream::select(wake_rx, released))
        .graceful_shutdown_on(stop)
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => tracing::debug!(lease = %obj, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile error"),
            }
        })
        .await;
    cfg.keeper.wake_through(None);
    sync_task.abort();
    floor_task.abort();
    sweeper.abort();
    retention.abort();
    cfg.runtime.synced.store(false, Ordering::SeqCst);
    if let Ok(mut slot) = cfg.runtime.leases.write() {
        *slot = None;
    }
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

/// Leader election among operator replicas, on a `coordination.k8s.io` Lease.
pub struct Election {
    /// Client for the Lease. Without the write gate: the elector's own writes
    /// are what open it.
    pub client: kube::Client,
    /// Namespace of the Lease (the operator's own).
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// Lease duration, renew deadline and retry period.
    pub timings: Timings,
}

/// Runs the controller only while this replica leads, until `shutdown` resolves.
///
/// The controller starts when this replica takes the Lease and stops when it
/// cannot prove it still holds it (the gate has closed by then); the replica
/// then stands by again in the same process. On shutdown the gate closes, the
/// controller stops, and the Lease is given up so another replica takes over
/// at once. Workload leases are never released on shutdown: the next leader
/// re-adopts them (same tokens).
pub async fn control_while_leading(
    cfg: OperatorConfig,
    election: Election,
    mut release_notices: impl FnMut() -> BoxStream<'static, Target>,
    mut shutdown: watch::Receiver<bool>,
) {
    let timings = election.timings;
    let (handing, taking) = (cfg.keeper.clone(), cfg.keeper.clone());
    let mut elector = Elector::new(
        election.client,
        &election.namespace,
        &election.lease_name,
        &cfg.instance,
        timings,
    )
    .on_other_leader(move || handing.hand_over())
    .on_takeover(move || taking.take_over());
    tracing::info!(identity = %elector.identity(), lease = %election.lease_name, "joining the leader election");
    loop {
        let valid_until = tokio::select! {
            until = elector.acquire(&cfg.leadership) => until,
            _ = shutdown.wait_for(|s| *s) => break,
        };
        tracing::info!(identity = %elector.identity(), "became the operator leader");
        cfg.runtime.leading.store(true, Ordering::SeqCst);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let controller = control(&cfg, release_notices(), async move {
            let _ = stop_rx.await;
        });
        tokio::pin!(controller);
        let mut shutting_down = false;
        tokio::select! {
            // Ends with the gate closed, at the latest at the renew deadline.
            _ = elector.keep_leading(&cfg.leadership, valid_until) => {},
            _ = shutdown.wait_for(|s| *s) => shutting_down = true,
            _ = &mut controller => tracing::error!("the controller stopped by itself"),
        }
        cfg.leadership.step_down();
        let _ = stop_tx.send(());
        // In-flight reconciles finish (their writes refused by the gate)
        // before the Lease can be given up.
        let stopped = tokio::time::timeout(timings.renew_deadline, &mut controller)
            .await
            .is_ok();
        if shutting_down {
            cfg.runtime.leading.store(false, Ordering::SeqCst);
            if stopped {
                give_up(&mut elector, timings).await;
            } else {
                tracing::warn!("the controller did not stop in time; the Lease is left to expire");
            }
            return;
        }
        if !stopped {
            tracing::warn!("waiting for the controller's in-flight requests to end");
            controller.await;
        }
        cfg.runtime.leading.store(false, Ordering::SeqCst);
        tracing::info!(identity = %elector.identity(), "stopped leading; standing by");
    }
    give_up(&mut elector, timings).await;
}

/// Clears the holder of the Lease (if still ours), bounded in time: a replica
/// that cannot reach the API server leaves it to expire.
async fn give_up(elector: &mut Elector, timings: Timings) {
    match tokio::time::timeout(timings.renew_deadline, elector.release()).await {
        Ok(Ok(true)) => tracing::info!("gave the leader election Lease up"),
        Ok(Ok(false)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "could not give the leader election Lease up"),
        Err(_) => tracing::warn!("giving the leader election Lease up timed out"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_watch_lists_in_pages() {
        let c = watching(Duration::from_secs(290));
        assert_eq!(c.page_size, Some(LIST_PAGE));
        assert_eq!(c.timeout, Some(290));
        assert_eq!(watching(Duration::ZERO).timeout, Some(1));
    }
}
