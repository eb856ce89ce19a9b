//! Wires the reconciler to the cluster: caches, watches, wake-ups, shutdown.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};

use crate::crd::TargetLease;
use crate::floor::FloorStore;
use crate::lease_id::LeaseIdKey;
use crate::reconcile::{self, Context, pods};
use crate::store::{LeaseStore, Target};

/// Everything the operator needs, parsed once by the CLI.
pub struct OperatorConfig {
    /// Kubernetes client.
    pub client: kube::Client,
    /// The lease store.
    pub store: Arc<dyn LeaseStore>,
    /// Namespace of the ConfigMap keeping tokens of deleted leases.
    pub floor_namespace: String,
    /// Name of that ConfigMap.
    pub floor_configmap: String,
    /// Key for deriving lease ids.
    pub lease_ids: LeaseIdKey,
    /// Reconciles running at once.
    pub concurrency: u16,
    /// Only watch this namespace (all namespaces when absent).
    pub watch_namespace: Option<String>,
    /// This replica's name, for Events.
    pub instance: String,
    /// Targets that may have become free (releases from anywhere, including
    /// outside Kubernetes); their waiting TargetLeases are woken at once.
    pub release_events: BoxStream<'static, Target>,
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

/// Runs the controller until `shutdown` resolves.
pub async fn run(cfg: OperatorConfig, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let client = cfg.client.clone();
    let (pod_reader, pod_writer) = reflector::store::<Pod>();
    let pod_stream = reflector::reflector(
        pod_writer,
        watcher(
            api::<Pod>(&client, &cfg.watch_namespace),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .touched_objects();

    let controller = Controller::new(
        api::<TargetLease>(&client, &cfg.watch_namespace),
        watcher::Config::default(),
    );
    let leases = controller.store();
    let (wake_tx, wake_rx) = futures::channel::mpsc::unbounded();
    let released = {
        let leases = leases.clone();
        cfg.release_events.flat_map(move |target| {
            let waiting: Vec<_> = leases
                .state()
                .into_iter()
                .filter(|tl| tl.namespace().as_deref() == Some(target.namespace.as_str()))
                .filter(|tl| tl.spec.target == target.name)
                .map(|tl| ObjectRef::from_obj(&*tl))
                .collect();
            futures::stream::iter(waiting)
        })
    };
    let ctx = Arc::new(Context {
        client: client.clone(),
        store: cfg.store,
        leases: leases.clone(),
        pods: pod_reader,
        floors: FloorStore::new(client.clone(), &cfg.floor_namespace, &cfg.floor_configmap),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "targetlease-operator".into(),
                instance: Some(cfg.instance),
            },
        ),
        lease_ids: cfg.lease_ids,
        wake: wake_tx,
        renewed: Default::default(),
    });
    controller
        .with_config(ControllerConfig::default().concurrency(cfg.concurrency))
        .watches_stream(pod_stream, move |pod: Pod| {
            leases
                .state()
                .into_iter()
                .filter(|tl| pods::concerns(tl, &pod))
                .map(|tl| ObjectRef::from_obj(&*tl))
                .collect::<Vec<_>>()
        })
        .reconcile_on(futures::stream::select(wake_rx, released))
        .graceful_shutdown_on(shutdown)
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => tracing::debug!(lease = %obj, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile error"),
            }
        })
        .await;
}
