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

/// An API server holding one namespace's floor ConfigMap, enough for
/// `FloorStore::raise`: GET, POST (create) and PUT (replace, refused with a
/// conflict unless it names the current version). Every write waits for
/// `gate` (a permit per write) and the first `fail` writes are refused.
#[derive(Default)]
struct MockApi {
    cm: Option<serde_json::Value>,
    version: u64,
    /// Reads, writes that reached the gate, and writes that passed it.
    reads: usize,
    arrived: usize,
    writes: usize,
    fail: usize,
}

type Mock = std::sync::Arc<Mutex<MockApi>>;

fn answer(code: u16, v: &serde_json::Value) -> http::Response<kube::client::Body> {
    http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(v).unwrap()))
        .unwrap()
}

fn status(code: u16, reason: &str) -> http::Response<kube::client::Body> {
    let v = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": reason, "reason": reason, "code": code,
    });
    answer(code, &v)
}

async fn serve(
    api: Mock,
    gate: std::sync::Arc<tokio::sync::Semaphore>,
    req: http::Request<kube::client::Body>,
) -> Result<http::Response<kube::client::Body>, std::convert::Infallible> {
    let method = req.method().clone();
    let mut body = req.into_body();
    let mut bytes = Vec::new();
    while let Some(frame) =
        std::future::poll_fn(|cx| http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx))
            .await
    {
        if let Ok(data) = frame.expect("a request body").into_data() {
            bytes.extend_from_slice(&data);
        }
    }
    if method == http::Method::GET {
        let mut api = api.lock().unwrap();
        api.reads += 1;
        return Ok(match &api.cm {
            Some(cm) => answer(200, cm),
            None => status(404, "NotFound"),
        });
    }
    api.lock().unwrap().arrived += 1;
    gate.acquire().await.unwrap().forget();
    let mut api = api.lock().unwrap();
    api.writes += 1;
    if api.fail > 0 {
        api.fail -= 1;
        return Ok(status(500, "InternalError"));
    }
    let mut cm: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let named = cm["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_owned);
    let current = api.cm.as_ref().map(|_| api.version.to_string());
    if named != current {
        return Ok(status(409, "Conflict"));
    }
    api.version += 1;
    cm["metadata"]["resourceVersion"] = serde_json::json!(api.version.to_string());
    api.cm = Some(cm.clone());
    Ok(answer(if current.is_none() { 201 } else { 200 }, &cm))
}

/// A floor store in namespace `ns` over the mock, its writes held by `gate`.
fn on_mock(ns: &str) -> (FloorStore, Mock, std::sync::Arc<tokio::sync::Semaphore>) {
    let api = Mock::default();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let (a, g) = (api.clone(), gate.clone());
    let svc = tower::service_fn(move |req| serve(a.clone(), g.clone(), req));
    let (cache, _writer) = reflector::store();
    let store = FloorStore::new(kube::Client::new(svc, ns), ns, "floors", cache);
    (store, api, gate)
}

fn floor_of(api: &Mock, ns: &str, target: &str) -> u64 {
    let api = api.lock().unwrap();
    let data: BTreeMap<String, String> = api
        .cm
        .as_ref()
        .map(|cm| serde_json::from_value(cm["data"].clone()).unwrap())
        .unwrap_or_default();
    ledger::floor_in(&data, &floor_key(ns, target))
}

/// Waits until `n` writes have reached the gate.
async fn arrived(api: &Mock, n: usize) {
    while api.lock().unwrap().arrived < n {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// Lets the writes through, one permit at a time, until `done` resolves.
async fn open_gate_until<T>(gate: &tokio::sync::Semaphore, done: impl Future<Output = T>) -> T {
    tokio::pin!(done);
    loop {
        tokio::select! {
            out = &mut done => return out,
            () = tokio::time::sleep(std::time::Duration::from_millis(5)) => gate.add_permits(1),
        }
    }
}

/// Deletions that raise floors while a write is under way share the next
/// write: 20 raises at once take two writes (the first raise's, then one
/// for the 19 that waited), not one each, and every floor is in the
/// ConfigMap when its raise returns.
#[tokio::test]
async fn raises_arriving_together_share_one_write_and_keep_every_floor() {
    let (store, api, gate) = on_mock("ns");
    let store = std::sync::Arc::new(store);
    let raises: Vec<_> = (0..20u64)
        .map(|i| {
            let (store, api) = (store.clone(), api.clone());
            tokio::spawn(async move {
                let target = format!("t-{i}");
                store.raise("ns", &target, 10 + i).await.unwrap();
                // Written when its raise returns, not only at the end.
                assert_eq!(floor_of(&api, "ns", &target), 10 + i, "{target} on return");
            })
        })
        .collect();
    arrived(&api, 1).await; // the first raise's write waits at the gate
    tokio::task::yield_now().await; // the other 19 take their tickets
    let all = open_gate_until(&gate, futures::future::join_all(raises)).await;
    for r in all {
        r.unwrap();
    }
    for i in 0..20u64 {
        assert_eq!(
            store.get("ns", &format!("t-{i}")),
            10 + i,
            "t-{i} as this process knows it"
        );
    }
    let (reads, writes) = {
        let api = api.lock().unwrap();
        (api.reads, api.writes)
    };
    assert_eq!(
        (reads, writes),
        (2, 2),
        "20 raises arriving together: reads and writes"
    );
}

/// A write that fails fails every raise whose floor it carried, at once
/// (not each trying again in turn); the floors wait for the next raise,
/// which writes them with its own.
#[tokio::test]
async fn a_failed_write_fails_the_raises_it_carried_and_the_next_raise_writes_their_floors() {
    let (store, api, gate) = on_mock("ns");
    let store = std::sync::Arc::new(store);
    let spawn = |target: &'static str, token: u64| {
        let store = store.clone();
        tokio::spawn(async move { store.raise("ns", target, token).await })
    };
    let first = spawn("a", 3);
    arrived(&api, 1).await; // the first writes alone
    let (b, c) = (spawn("b", 5), spawn("c", 6));
    tokio::task::yield_now().await; // b and c wait for the turn
    gate.add_permits(1);
    first.await.unwrap().unwrap();
    arrived(&api, 2).await; // b's write carries b and c
    api.lock().unwrap().fail = 1;
    gate.add_permits(1);
    assert!(b.await.unwrap().is_err(), "the raise whose write failed");
    // At once: c does not wait for a write of its own (the gate would hold it).
    let c = tokio::time::timeout(std::time::Duration::from_secs(5), c)
        .await
        .expect("c answered without a write of its own");
    assert!(
        c.unwrap().is_err(),
        "a raise the failed write carried fails too"
    );
    assert_eq!(
        api.lock().unwrap().writes,
        2,
        "c did not write again on its own"
    );
    let d = spawn("d", 7);
    open_gate_until(&gate, d).await.unwrap().unwrap();
    for (target, token) in [("a", 3), ("b", 5), ("c", 6), ("d", 7)] {
        assert_eq!(floor_of(&api, "ns", target), token, "{target}");
    }
}

/// A write that fails fails the raise that made it only; the floors it
/// carried are written by the raise that waited behind it.
#[tokio::test]
async fn a_failed_write_leaves_its_floors_to_the_next_raise() {
    let (store, api, gate) = on_mock("ns");
    api.lock().unwrap().fail = 1;
    let store = std::sync::Arc::new(store);
    let (s1, s2) = (store.clone(), store.clone());
    let first = tokio::spawn(async move { s1.raise("ns", "a", 5).await });
    arrived(&api, 1).await; // the first holds the turn and writes
    let second = tokio::spawn(async move { s2.raise("ns", "b", 7).await });
    let (first, second) = open_gate_until(&gate, async { (first.await, second.await) }).await;
    assert!(
        first.unwrap().is_err(),
        "the raise whose write failed says so"
    );
    second.unwrap().unwrap();
    assert_eq!(
        floor_of(&api, "ns", "a"),
        5,
        "the failed write's floor, written by the next"
    );
    assert_eq!(floor_of(&api, "ns", "b"), 7);
}

/// A raise dropped while its write is under way (its reconcile cancelled)
/// gives its floors back: the raise waiting behind it writes them, so no
/// raise returns with a floor that no write holds.
#[tokio::test]
async fn a_raise_dropped_mid_write_leaves_its_floors_to_the_next() {
    let (store, api, gate) = on_mock("ns");
    let store = std::sync::Arc::new(store);
    let (s1, s2) = (store.clone(), store.clone());
    // The first raise's write waits at the gate (no permit yet).
    let first = tokio::spawn(async move { s1.raise("ns", "a", 5).await });
    arrived(&api, 1).await;
    let second = tokio::spawn(async move { s2.raise("ns", "b", 7).await });
    tokio::task::yield_now().await; // the second waits for its turn
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    open_gate_until(&gate, second).await.unwrap().unwrap();
    assert_eq!(
        floor_of(&api, "ns", "a"),
        5,
        "the dropped raise's floor, written by the next"
    );
    assert_eq!(floor_of(&api, "ns", "b"), 7);
}
