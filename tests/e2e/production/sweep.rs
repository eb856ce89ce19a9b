//! The minute sweep, one sweep at a time on a real kube-apiserver: what a
//! TargetLease that vanished without a last reconcile (a finalizer removed by
//! hand) leaves behind — this process's memory of it, the keeper's renewals,
//! its pod marks — goes once two sweeps in a row missed it, and the marks go
//! only from the pod version the sweep judged.

use std::sync::Arc;
use std::time::Instant;

use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher;
use targetlease::operator::events::Recorder;
use targetlease::operator::floor::FloorStore;
use targetlease::operator::leadership::Leadership;
use targetlease::operator::reconcile::clock::ServerClock;
use targetlease::operator::reconcile::keeper::{Keeper, Kept};
use targetlease::operator::reconcile::name::NsName;
use targetlease::operator::reconcile::pods::CachedPod;
use targetlease::operator::reconcile::{Carryover, Context};
use targetlease::operator::sweep::Sweep;
use targetlease::store::LeaseHandle;

use super::*;

/// A pod as the operator's cache holds it.
async fn cached_pod(env: &OperatorEnv, name: &str) -> CachedPod {
    let pods: Api<CachedPod> = Api::namespaced(env.client.clone(), &env.ns);
    let mut pod = pods.get(name).await.expect("read the pod");
    pod.slim();
    pod
}

/// Marks pod `pod` for TargetLease `tl`, as the operator would.
async fn mark(env: &OperatorEnv, pod: &str, tl: &str) {
    let patch = json!({ "metadata": {
        "labels": { format!("{tl}.targetlease.dev/leader"): "true" },
        "annotations": {
            format!("{tl}.targetlease.dev/fencing-token"): "3",
            format!("{tl}.targetlease.dev/expires-at"): "2030-01-01T00:00:00Z",
        },
    }});
    env.pods()
        .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("mark the pod");
}

/// A lease the keeper keeps for `tl` (never due: the test runs no keeper).
fn kept(env: &OperatorEnv, tl: &str) -> Kept {
    let handle = LeaseHandle {
        owner: tl.into(),
        lease_id: env.lease_id_key().derive(&format!("first-{tl}")),
        token: 3,
    };
    let durations = (Duration::from_secs(90), Duration::from_secs(30));
    Kept::new(
        Target::new(&env.ns, tl),
        handle,
        durations,
        Instant::now(),
        (u64::MAX, None),
    )
}

#[tokio::test]
async fn the_sweep_forgets_a_vanished_lease_and_unmarks_only_the_pod_it_judged() {
    let env = OperatorEnv::start_without_operator("sweep").await;
    let client = env.client.clone();
    let store: Arc<dyn LeaseStore> = Arc::new(env.store().await);
    env.create("here", lease_for("t").identity("here")).await;
    env.create_pod("w", &[("app", "w")], true).await;
    mark(&env, "w", "gone").await;
    mark(&env, "w", "here").await;

    let (leases, mut lease_writer) = reflector::store::<TargetLease>();
    let here = env.api().get("here").await.unwrap();
    lease_writer.apply_watcher_event(&watcher::Event::Apply(here));
    let (pods, mut pod_writer) = reflector::store::<CachedPod>();
    let pod_index = Arc::new(targetlease::operator::reconcile::pod_index::PodIndex::default());
    let w = watcher::Event::Apply(cached_pod(&env, "w").await);
    pod_writer.apply_watcher_event(&w);
    pod_index.apply(&w);
    let (floor_cache, _) = reflector::store();
    let clock = Arc::new(ServerClock::new());
    let (wake, _woken) = futures::channel::mpsc::unbounded();
    let ctx = Context {
        client: client.clone(),
        store: store.clone(),
        leases,
        lease_index: Default::default(),
        pods: targetlease::operator::reconcile::pod_index::PodCache {
            store: pods,
            index: pod_index,
        },
        selectors: Default::default(),
        slots: targetlease::operator::reconcile::slots::FairSlots::new(1),
        floors: FloorStore::new(client.clone(), &env.ns, "floors", floor_cache),
        recorder: Recorder::new(client.clone(), "sweep-test", None),
        lease_ids: env.lease_id_key(),
        echoes: targetlease::operator::reconcile::echoes::Echoes::new(wake.clone()),
        wake,
        metrics: Default::default(),
        leadership: Leadership::always(),
        ready: targetlease::operator::readiness::Ready::already(),
        carryover: Default::default(),
        published: Default::default(),
        clock: clock.clone(),
        keeper: Arc::new(Keeper::new(store, clock)),
        renewals: Default::default(),
    };
    let (gone, present) = (
        ObjectRef::<TargetLease>::new("gone").within(&env.ns),
        ObjectRef::<TargetLease>::new("here").within(&env.ns),
    );
    for key in [&gone, &present] {
        ctx.carryover
            .lock()
            .unwrap()
            .insert(NsName::of(key), Box::<Carryover>::default());
        ctx.keeper
            .confirmed(key, kept(&env, &key.name), ctx.keeper.term());
    }
    let remembered = |ctx: &Context| {
        let mut m: Vec<_> = ctx
            .carryover
            .lock()
            .unwrap()
            .keys()
            .map(|k| k.name().to_owned())
            .collect();
        m.sort();
        m
    };
    let kept_keys = |ctx: &Context| {
        let mut k: Vec<_> = ctx
            .keeper
            .keys()
            .into_iter()
            .map(|k| k.name().to_owned())
            .collect();
        k.sort();
        k
    };

    // First sweep: "gone" is missing once; the cache may only lag behind.
    let mut sweep = Sweep::default();
    sweep.once(&ctx).await;
    assert_eq!(remembered(&ctx), ["gone", "here"]);
    assert_eq!(kept_keys(&ctx), ["gone", "here"]);
    assert_eq!(env.marks("w", "gone").await.0.as_deref(), Some("true"));

    // The pod changes after the sweep judged it (the cache has not caught up).
    let touch = json!({ "metadata": { "labels": { "touched": "1" } } });
    env.pods()
        .patch("w", &PatchParams::default(), &Patch::Merge(&touch))
        .await
        .unwrap();

    // Second sweep: "gone" is forgotten and no longer kept alive; its marks
    // stay, since the pod is no longer the version the sweep judged.
    sweep.once(&ctx).await;
    assert_eq!(remembered(&ctx), ["here"]);
    assert_eq!(kept_keys(&ctx), ["here"]);
    assert_eq!(
        env.marks("w", "gone").await.0.as_deref(),
        Some("true"),
        "unmarked a pod version the sweep never saw"
    );

    // The cache catches up: the next sweep removes the marks, and only those.
    pod_writer.apply_watcher_event(&watcher::Event::Apply(cached_pod(&env, "w").await));
    sweep.once(&ctx).await;
    assert_eq!(env.marks("w", "gone").await, (None, None, None));
    let here_marks = env.marks("w", "here").await;
    assert_eq!(here_marks.0.as_deref(), Some("true"));
    assert_eq!(here_marks.1.as_deref(), Some("3"));
    let pod = env.pods().get("w").await.unwrap();
    assert_eq!(pod.labels().get("touched").map(String::as_str), Some("1"));
    assert_eq!(remembered(&ctx), ["here"]);
}
