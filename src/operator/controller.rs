//! The controller and its caches: watches TargetLeases, (slimmed) pods and
//! the token floors' ConfigMaps, maps pod changes and release notices to
//! TargetLeases, and runs the reconciler with its side tasks (readiness, the
//! sweeper, floor retention) until told to stop.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Config as ControllerConfig, Controller, Error as ControllerError};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::utils::ResetTimerBackoff;
use kube::runtime::{WatchStreamExt, watcher};

use super::admin::RuntimeStatus;
use super::cache::{LIST_PAGE, WatchedLease, lease_event};
use super::crd::TargetLease;
use super::events::Recorder;
use super::floor::{FloorPolicy, FloorStore};
use super::leadership::Leadership;
use super::lease_id::LeaseIdKey;
use super::metrics::OperatorMetrics;
use super::readiness::{self, Cache, CacheSync};
use super::reconcile::clock::ServerClock;
use super::reconcile::echoes::Echoes;
use super::reconcile::index::LeaseIndex;
use super::reconcile::keeper::Keeper;
use super::reconcile::pod_index::{PodCache, PodIndex};
use super::reconcile::pods::CachedPod;
use super::reconcile::selectors::Selectors;
use super::reconcile::slots::FairSlots;
use super::reconcile::{self, Context, pods};
use super::{retention, sweep, wakeups};
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

/// The controller's triggers are never paused. kube's controller would pause
/// all of them together (wake-ups, slot turns, renewals coming due) while any
/// one watch backs off after an error; each watch backs off on its own
/// instead, so one failing watch (a pod list refused, say) holds back no
/// renewal.
struct NeverPaused;

impl Iterator for NeverPaused {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::ZERO)
    }
}

impl kube::runtime::utils::Backoff for NeverPaused {
    fn reset(&mut self) {}
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
    // default waits up to 30 s after a few failures). Each watch backs off
    // on its own; the controller's triggers never pause (`NeverPaused`).
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
    // Each cache's stream says when its first whole list is in (`readiness`).
    let caches = CacheSync::default();
    if let Ok(mut slot) = cfg.runtime.caches.write() {
        *slot = Some(caches.clone());
    }
    let (pod_reader, pod_writer) = reflector::store::<CachedPod>();
    let pod_index = Arc::new(PodIndex::default());
    let pod_stream = reflector::reflector(
        pod_writer,
        // Each pod is slimmed as it is decoded (`CachedPod`).
        watcher(api::<CachedPod>(&client, &cfg.watch_namespace), watching()),
    )
    // A failing watch waits before it lists again; only that watch waits
    // (see `NeverPaused`).
    .backoff(backoff())
    // After the cache took the event (see `index`).
    .inspect_ok({
        let index = pod_index.clone();
        move |event| index.apply(event)
    })
    .inspect_ok(caches.watching(Cache::Pods))
    .touched_objects();
    let (floor_reader, floor_writer) = reflector::store::<ConfigMap>();
    let floor_stream = reflector::reflector(
        floor_writer,
        watcher(
            Api::<ConfigMap>::namespaced(client.clone(), &cfg.floor_namespace),
            watching().labels(&FloorStore::selector(&cfg.floor_configmap)),
        ),
    )
    .inspect_ok(caches.watching(Cache::Floors))
    .backoff(backoff())
    .for_each(|_| futures::future::ready(()));
    let floor_task = tokio::spawn(floor_stream);

    let (wake_tx, wake_rx) = futures::channel::mpsc::unbounded();
    let echoes = Echoes::new(wake_tx.clone());
    let (leases, lease_writer) = reflector::store::<TargetLease>();
    let lease_index = Arc::new(LeaseIndex::default());
    let lease_stream = reflector::reflector(
        lease_writer,
        watcher(
            api::<WatchedLease>(&client, &cfg.watch_namespace),
            watching(),
        )
        .map_ok(lease_event),
    )
    .backoff(backoff())
    // A member that stops publishing Held or leaves the queue wakes its
    // target's others, once the cache shows it (see `LeaseIndex`): whoever
    // wrote it, and even though the operator's own writes trigger no
    // reconcile.
    .inspect_ok({
        let index = lease_index.clone();
        let leases = leases.clone();
        let wake = wake_tx.clone();
        move |event| index.wake_others(&leases, event, &wake)
    })
    .inspect_ok(caches.watching(Cache::Leases))
    .touched_objects()
    // The operator's own writes trigger no reconcile (see `echoes`).
    .try_filter({
        let echoes = echoes.clone();
        move |tl| futures::future::ready(echoes.triggers(tl))
    });
    let controller = Controller::for_stream(lease_stream, leases.clone());
    if let Ok(mut slot) = cfg.runtime.leases.write() {
        *slot = Some(leases.clone());
    }
    let ready = readiness::Ready::default();
    let floors = FloorStore::new(
        client.clone(),
        &cfg.floor_namespace,
        &cfg.floor_configmap,
        floor_reader,
    )
    .with_policy(cfg.floor_policy);
    let sync_task = tokio::spawn(readiness::become_ready(
        caches.clone(),
        cfg.store.clone(),
        cfg.clock.clone(),
        ready.clone(),
        cfg.runtime.clone(),
    ));
    let selectors = Arc::new(Selectors::default());
    let (slots, slot_turns) = FairSlots::with_wakes(cfg.concurrency.into());
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
        slots: slots.clone(),
        floors,
        recorder: Recorder::new(client.clone(), "targetlease-operator", Some(&cfg.instance)),
        lease_ids: cfg.lease_ids.clone(),
        wake: wake_tx,
        echoes,
        metrics: cfg.metrics.clone(),
        leadership: cfg.leadership.clone(),
        ready,
        carryover: Default::default(),
        published: Default::default(),
        clock: cfg.clock.clone(),
        keeper: cfg.keeper.clone(),
        renewals: Default::default(),
    });
    cfg.keeper.wake_through(Some(ctx.wake.clone()));
    let sweeper = tokio::spawn(sweep::sweep(ctx.clone()));
    let take_back = tokio::spawn(slots.clone().take_back_unused());
    let retention = tokio::spawn(retention::expire_floors(ctx.clone(), cfg.floor_policy));
    let released = {
        let ctx = ctx.clone();
        // Anyone allowed to publish can send notices: bounded before they wake anything.
        wakeups::bounded(
            release_notices,
            lease_index.clone(),
            cfg.metrics.clone(),
            wakeups::Limits::default(),
        )
        .flat_map(move |target| futures::stream::iter(ctx.released(&target)))
    };
    // Every wake-up from outside the object takes a slot at once.
    let woken = {
        let ctx = ctx.clone();
        futures::stream::select(wake_rx, released).inspect(move |key| ctx.woken(key))
    };
    // ...and so does every key whose turn for a slot came (one is set aside).
    let triggers = futures::stream::select(woken, slot_turns);
    // Renewals come due here, not from the controller's scheduler (see `renewals`).
    let triggers = futures::stream::select(triggers, ctx.renewals.clone().come_due());
    let mapped = ctx.clone();
    controller
        // Every due reconcile starts at once and takes one of the
        // `concurrency` slots, or leaves its key in its namespace's line
        // and returns (`FairSlots`): the controller's own limit would serve
        // them by due time, letting one namespace's backlog delay every
        // other namespace's renewals.
        .with_config(ControllerConfig::default())
        .trigger_backoff(NeverPaused)
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
                .inspect(|key| mapped.woken(key))
                .collect::<Vec<_>>()
        })
        .reconcile_on(triggers)
        .graceful_shutdown_on(stop)
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|result| {
            match result {
                Ok((obj, _)) => tracing::debug!(lease = %obj, "reconciled"),
                // A slot set aside for it goes on at once.
                Err(ControllerError::ObjectNotFound(obj)) => {
                    let mut key = ObjectRef::new(&obj.name);
                    key.namespace = obj.namespace;
                    slots.not_coming(&key);
                }
                Err(e) => tracing::debug!(error = %e, "reconcile error"),
            }
            futures::future::ready(())
        })
        .await;
    cfg.keeper.wake_through(None);
    sync_task.abort();
    // Wait until it is gone, so it cannot report this term ready after it ended.
    let _ = sync_task.await;
    floor_task.abort();
    sweeper.abort();
    take_back.abort();
    retention.abort();
    cfg.runtime.synced.store(false, Ordering::SeqCst);
    if let Ok(mut slot) = cfg.runtime.leases.write() {
        *slot = None;
    }
    if let Ok(mut slot) = cfg.runtime.caches.write() {
        *slot = None;
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
