use super::*;
use kube::runtime::{reflector, watcher};

/// A floor store on a cache the test writes, whose client reaches no
/// API server (pruning reads only the cache).
fn on_cache(ns: &str) -> (FloorStore, reflector::store::Writer<ConfigMap>) {
    let svc = tower::service_fn(|req: http::Request<kube::client::Body>| async move {
        let refused = format!("no API server here: {} {}", req.method(), req.uri());
        Err::<http::Response<kube::client::Body>, _>(std::io::Error::other(refused))
    });
    let client = kube::Client::new(svc, ns);
    let (cache, writer) = reflector::store();
    (FloorStore::new(client, ns, "floors", cache), writer)
}

fn ledger_of(store: &FloorStore, ns: &str, tenant: &str, data: &[(&str, u64)]) -> ConfigMap {
    let data = data.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    let name = store.config_map_name(tenant);
    let mut cm = store.config_map(&name, data.collect(), Some("1".into()));
    cm.metadata.namespace = Some(ns.into());
    cm
}

fn remember(store: &FloorStore, ns: &str, target: &str, token: u64) {
    store
        .lock()
        .insert((ns.into(), floor_key(ns, target)), token);
}

/// Raises are forgotten once the cache shows them (the entry or the
/// namespace's base at least as high), never before.
#[tokio::test]
async fn raises_are_pruned_once_the_cache_shows_them_and_never_before() {
    let (store, mut writer) = on_cache("ops");
    let (a, b) = (floor_key("team", "a"), floor_key("team", "b"));
    remember(&store, "team", "a", 5);
    remember(&store, "team", "b", 7);
    assert_eq!(store.prune(), 2, "the cache shows neither yet");
    assert_eq!((store.get("team", "a"), store.get("team", "b")), (5, 7));

    // The cache shows a's raise, and b's entry lower than this process raised it.
    let cm = ledger_of(&store, "ops", "team", &[(a.as_str(), 5), (b.as_str(), 6)]);
    writer.apply_watcher_event(&watcher::Event::Apply(cm));
    assert_eq!(store.prune(), 1, "only b's raise is still pending");
    assert_eq!(store.get("team", "a"), 5, "now from the cache");
    assert_eq!(store.get("team", "b"), 7, "never the lower cached 6");

    // A base that covers b counts as showing it.
    let cm = ledger_of(&store, "ops", "team", &[(ledger::BASE_KEY, 9)]);
    writer.apply_watcher_event(&watcher::Event::Apply(cm));
    assert_eq!(store.prune(), 0);
    assert_eq!(store.get("team", "b"), 9);
}

/// A namespace reads only its own ConfigMap: another namespace's entries
/// and base never reach it, whatever they hold.
#[tokio::test]
async fn a_namespace_reads_only_its_own_floors() {
    let (store, mut writer) = on_cache("ops");
    let theirs = floor_key("mallory", "x");
    let cm = ledger_of(
        &store,
        "ops",
        "mallory",
        &[(theirs.as_str(), 1_000), (ledger::BASE_KEY, 1 << 40)],
    );
    writer.apply_watcher_event(&watcher::Event::Apply(cm));
    assert_eq!(store.get("mallory", "anything"), 1 << 40);
    assert_eq!(store.get("alice", "x"), 0);
    assert_eq!(store.get("alice", "anything"), 0);
    assert_eq!(store.config_map_name("alice"), "floors.alice");
    let f = store.figures();
    assert_eq!((f.objects, f.entries), (1, 1));
}

#[test]
fn keys_are_valid_configmap_keys_and_do_not_collide() {
    let a = floor_key("a:b", "c");
    let b = floor_key("a", "b:c");
    assert_ne!(a, b);
    assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    assert_eq!(a.len(), 42);
}
