use std::time::Duration;

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::Event;

use super::*;
use crate::store::memory::MemoryStore;

fn object(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn whole_list(names: &[&str]) -> Vec<Event<ConfigMap>> {
    let mut events = vec![Event::Init];
    events.extend(names.iter().map(|n| Event::InitApply(object(n))));
    events.push(Event::InitDone);
    events
}

/// Feeds `events` to a fresh cache the way the controller's streams do
/// (reflector, then `watching`), calling `after` with the store after each.
async fn fill(
    caches: &CacheSync,
    cache: Cache,
    events: Vec<Event<ConfigMap>>,
    mut after: impl FnMut(&Event<ConfigMap>, &Store<ConfigMap>),
) -> Store<ConfigMap> {
    let (reader, writer) = reflector::store::<ConfigMap>();
    let mut fed = reflector::reflector(writer, stream::iter(events).map(Ok::<_, watcher::Error>))
        .inspect_ok(caches.watching(cache))
        .boxed();
    while let Some(event) = fed.next().await {
        after(&event.unwrap(), &reader);
    }
    reader
}

async fn sync_all(caches: &CacheSync) {
    for cache in [Cache::Leases, Cache::Pods, Cache::Floors] {
        fill(caches, cache, whole_list(&["a"]), |_, _| {}).await;
    }
}

#[tokio::test]
async fn the_caches_are_synced_only_once_each_has_its_whole_list_in_its_store() {
    let caches = CacheSync::default();
    fill(&caches, Cache::Leases, whole_list(&["a", "b"]), |_, _| {}).await;
    fill(&caches, Cache::Pods, whole_list(&[]), |_, _| {}).await;
    // A list that ends half way (the watch broke) syncs nothing.
    fill(
        &caches,
        Cache::Floors,
        whole_list(&["f"])[..2].to_vec(),
        |_, _| {},
    )
    .await;
    assert!(!caches.all_synced());

    let mut seen = Vec::new();
    let floors = fill(
        &caches,
        Cache::Floors,
        whole_list(&["f", "g"]),
        |event, store| {
            seen.push((
                matches!(event, Event::InitDone),
                caches.all_synced(),
                store.state().len(),
            ))
        },
    )
    .await;
    // Synced at the end of the list and not before, with the list in the store.
    assert_eq!(
        seen,
        [
            (false, false, 0),
            (false, false, 0),
            (false, false, 0),
            (true, true, 2)
        ]
    );
    assert_eq!(floors.state().len(), 2);

    // A relist later does not take it back (as with kube's own stores).
    fill(&caches, Cache::Pods, vec![Event::Init], |_, _| {}).await;
    assert!(caches.all_synced());
}

#[tokio::test]
async fn every_waiter_wakes_however_many_wait_and_whenever_they_start() {
    let caches = CacheSync::default();
    let early: Vec<_> = (0..3)
        .map(|_| {
            let caches = caches.clone();
            tokio::spawn(async move { caches.wait().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(early.iter().all(|w| !w.is_finished()));
    sync_all(&caches).await;
    for waiter in early {
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("a waiter that started before the caches synced wakes")
            .unwrap();
    }
    tokio::time::timeout(Duration::from_secs(1), caches.wait())
        .await
        .expect("a waiter that starts after the caches synced returns at once");
}

#[tokio::test]
async fn ready_once_the_caches_synced_and_the_clock_was_read() {
    let caches = CacheSync::default();
    let (clock, synced) = (Arc::new(ServerClock::new()), Ready::default());
    let runtime = Arc::new(RuntimeStatus::default());
    let waiter = {
        let synced = synced.clone();
        tokio::spawn(async move { synced.wait().await })
    };
    let ready = tokio::spawn(become_ready(
        caches.clone(),
        Arc::new(MemoryStore::default()),
        clock.clone(),
        synced.clone(),
        runtime.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!synced.is_ready() && !runtime.synced.load(Ordering::SeqCst));
    assert!(!waiter.is_finished(), "a reconcile waits for the caches");
    assert!(!clock.is_anchored());

    sync_all(&caches).await;
    tokio::time::timeout(Duration::from_secs(5), ready)
        .await
        .expect("ready soon after the last cache synced")
        .unwrap();
    assert!(synced.is_ready() && runtime.synced.load(Ordering::SeqCst));
    tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("a reconcile that waited goes on once ready")
        .unwrap();
    assert!(
        clock.is_anchored(),
        "the clock is read before the first pass"
    );
}
