//! Token floors under concurrent deletions and past a namespace's cap.

use std::sync::{Arc, Mutex};

use http::{Method, Request, Response};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::{reflector, watcher};
use targetlease::operator::floor::{FloorPolicy, FloorStore, floor_key, ledger};

use super::*;

const NAME: &str = "floors";

/// Two targets of one namespace: their floors share its ConfigMap.
fn same_namespace_pair() -> (String, String) {
    ("t-0".to_string(), "t-1".to_string())
}

/// Operator `i`'s count `metric` of floor writes (0 when not counted yet).
fn floor_count(env: &OperatorEnv, i: usize, metric: &str) -> f64 {
    let (_, metrics) = support::operator_env::http_get(env.admin_port(i), "/metrics")
        .expect("the operator's /metrics");
    let prefix = format!("{metric}{{kind=\"floor\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or(0.0)
}

/// Holds the next ConfigMap write (create or replace) of a client until
/// released, after telling the test it got there; counts the conflicts its
/// client was answered.
#[derive(Clone, Default)]
struct HoldNextWrite {
    armed: Arc<Mutex<Option<tokio::sync::oneshot::Receiver<()>>>>,
    arrived: Arc<tokio::sync::Notify>,
    conflicts: Arc<Mutex<usize>>,
}

impl HoldNextWrite {
    fn arm(&self) -> tokio::sync::oneshot::Sender<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        *self.armed.lock().unwrap() = Some(rx);
        tx
    }

    fn conflicts(&self) -> usize {
        *self.conflicts.lock().unwrap()
    }
}

impl<S> tower::Layer<S> for HoldNextWrite {
    type Service = Held<S>;
    fn layer(&self, inner: S) -> Held<S> {
        Held {
            inner,
            hold: self.clone(),
        }
    }
}

struct Held<S> {
    inner: S,
    hold: HoldNextWrite,
}

impl<S, B, R> tower::Service<Request<B>> for Held<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let write = matches!(*req.method(), Method::PUT | Method::POST)
            && req.uri().path().contains("/configmaps");
        let held = write
            .then(|| self.hold.armed.lock().unwrap().take())
            .flatten();
        let (arrived, conflicts) = (self.hold.arrived.clone(), self.hold.conflicts.clone());
        // The client's request is only sent when its future is first polled.
        let sent = self.inner.call(req);
        Box::pin(async move {
            if let Some(release) = held {
                arrived.notify_one();
                let _ = release.await;
            }
            let response = sent.await?;
            if response.status() == http::StatusCode::CONFLICT {
                *conflicts.lock().unwrap() += 1;
            }
            Ok(response)
        })
    }
}

/// A floor store whose client holds writes on `hold`, with an empty cache
/// (every raise reads the ConfigMap from the API server).
fn floor_store(env: &OperatorEnv, hold: &HoldNextWrite) -> FloorStore {
    let client = kube::client::ClientBuilder::try_from(env.cp.config())
        .unwrap()
        .with_layer(hold)
        .build();
    let (cache, _writer) = reflector::store();
    FloorStore::new(client, &env.ns, NAME, cache)
}

/// A floor store reading through a watch cache, as a freshly started operator does.
async fn fresh_reader(env: &OperatorEnv) -> (FloorStore, tokio::task::JoinHandle<()>) {
    let (cache, writer) = reflector::store();
    let api = Api::<ConfigMap>::namespaced(env.client.clone(), &env.ns);
    let config = watcher::Config::default().labels(&FloorStore::selector(NAME));
    let task =
        tokio::spawn(reflector::reflector(writer, watcher(api, config)).for_each(|_| async {}));
    cache.wait_until_ready().await.unwrap();
    (
        FloorStore::new(env.client.clone(), &env.ns, NAME, cache),
        task,
    )
}

/// The data of the floor ConfigMap `<prefix>.<namespace>` in the env's namespace.
async fn floors_of(env: &OperatorEnv, prefix: &str) -> std::collections::BTreeMap<String, String> {
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let name = format!("{prefix}.{}", env.ns);
    cms.get(&name).await.unwrap().data.unwrap_or_default()
}

/// Promise: "a published token is never lower than one published before for
/// the same target", across deletions. Two TargetLeases on two targets of
/// one namespace (their floors share its ConfigMap) are deleted at once: each
/// deletion reads the ConfigMap, and the second writer's write (created or replaced from what it
/// read) is refused with a conflict. Whichever goes first, the retry re-reads
/// and keeps the other's floor; a fresh reader sees both.
#[tokio::test]
async fn concurrent_deletions_in_one_namespace_keep_both_floors() {
    let env = OperatorEnv::start_without_operator("floor-race").await;
    let (t, u) = same_namespace_pair();
    let (hold_t, hold_u) = (HoldNextWrite::default(), HoldNextWrite::default());
    let stores = Arc::new((floor_store(&env, &hold_t), floor_store(&env, &hold_u)));
    // (held target, its token, the other target, its token): the first round
    // creates the ConfigMap, the others replace it; both orders.
    let rounds = [(&t, 5, &u, 8), (&u, 9, &t, 6), (&t, 7, &u, 10)];
    for (i, (held, held_token, other, other_token)) in rounds.into_iter().enumerate() {
        let hold = if held == &t { &hold_t } else { &hold_u };
        let before = hold.conflicts();
        let release = hold.arm();
        let (ns, held_target) = (env.ns.clone(), held.clone());
        let s = stores.clone();
        let stalled = tokio::spawn(async move {
            let store = if held_target.ends_with("-0") {
                &s.0
            } else {
                &s.1
            };
            store.raise(&ns, &held_target, held_token).await
        });
        // The held deletion read the ConfigMap and is about to write it.
        hold.arrived.notified().await;
        let other_store = if other == &t { &stores.0 } else { &stores.1 };
        other_store
            .raise(&env.ns, other, other_token)
            .await
            .unwrap_or_else(|e| panic!("round {i}: raise {other}: {e}"));
        release.send(()).unwrap();
        stalled
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("round {i}: raise {held}: {e}"));
        assert_eq!(
            hold.conflicts() - before,
            1,
            "round {i}: the held write was refused once and retried"
        );
        let data = floors_of(&env, NAME).await;
        for (target, token) in [(held, held_token), (other, other_token)] {
            assert_eq!(
                ledger::floor_in(&data, &floor_key(&env.ns, target)),
                token,
                "round {i}: floor of {target} in {data:?}"
            );
        }
    }
    let (fresh, task) = fresh_reader(&env).await;
    assert_eq!(
        (fresh.get(&env.ns, &t), fresh.get(&env.ns, &u)),
        (7, 10),
        "a fresh reader reads both floors back"
    );
    task.abort();
}

/// The same promise end to end: a bulk delete (`kubectl delete tl --all`) of
/// TargetLeases whose floors all share one ConfigMap (the namespace's,
/// which an earlier deletion created, so every floor write of the bulk
/// delete replaces it) — their cleanups raise floors at once, and the
/// operator writes them one write at a time, those that arrive together in
/// one (none refused: one process never races itself on the ConfigMap) —
/// then Valkey forgets everything and a fresh operator starts: every target's next token is above the last one it published,
/// the earlier deletion's too.
#[tokio::test]
async fn a_bulk_delete_keeps_every_floor_and_a_fresh_operator_reads_them_back() {
    let mut env = OperatorEnv::start("floor-bulk").await;
    let mut targets: Vec<String> = (0..8).map(|i| format!("t-{i}")).collect();
    targets.extend(["a".into(), "b".into(), "c".into()]);
    let first = "first".to_string();
    for (i, target) in targets.iter().chain([&first]).enumerate() {
        env.create(&format!("l{i}"), lease_for(target).identity("job"))
            .await;
    }
    let mut tokens = Vec::new();
    for i in 0..=targets.len() {
        let tl = env.wait_phase(&format!("l{i}"), Phase::Held, SOON).await;
        tokens.push(summary(&tl).2.unwrap());
    }
    let first_token = tokens.pop().unwrap();
    let last = format!("l{}", targets.len());
    env.delete(&last).await;
    env.wait_gone(&last, SOON).await;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let floors = format!("targetlease-token-floors.{}", env.ns);
    let before = cms
        .get(&floors)
        .await
        .expect("the first deletion's ConfigMap");
    assert!(
        ledger::floor_in(
            &before.data.clone().unwrap_or_default(),
            &floor_key(&env.ns, &first)
        ) >= first_token
    );
    let conflicts_before = floor_count(&env, 0, "targetlease_api_write_conflicts_total");
    let writes_before = floor_count(&env, 0, "targetlease_api_writes_total");

    env.api()
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    for i in 0..targets.len() {
        env.wait_gone(&format!("l{i}"), SOON).await;
    }
    let after = cms.get(&floors).await.unwrap();
    assert_eq!(
        after.metadata.uid, before.metadata.uid,
        "the same ConfigMap, replaced, never created again"
    );
    let conflicts =
        floor_count(&env, 0, "targetlease_api_write_conflicts_total") - conflicts_before;
    let writes = floor_count(&env, 0, "targetlease_api_writes_total") - writes_before;
    println!(
        "{writes} floor writes and {conflicts} conflicts for {} deletions",
        targets.len()
    );
    // At most one write per deletion (those that arrive together share one:
    // `floor::tests::raises_arriving_together_share_one_write_and_keep_every_floor`).
    assert!(
        writes >= 1.0 && writes <= targets.len() as f64,
        "{writes} floor writes for {} deletions",
        targets.len()
    );
    assert_eq!(
        conflicts, 0.0,
        "one operator's floor writes never race each other"
    );
    targets.push(first);
    tokens.push(first_token);
    for (target, token) in targets.iter().zip(&tokens) {
        let key = floor_key(&env.ns, target);
        let data = floors_of(&env, "targetlease-token-floors").await;
        assert!(
            ledger::floor_in(&data, &key) >= *token,
            "the floor of {target} covers token {token}: {data:?}"
        );
    }
    env.kill_operator(0);
    env.valkey.restart(); // no persistence: every counter is gone
    env.start_operator();
    for (i, (target, token)) in targets.iter().zip(&tokens).enumerate() {
        env.create(&format!("n{i}"), lease_for(target).identity("again"))
            .await;
        let tl = env.wait_phase(&format!("n{i}"), Phase::Held, SOON).await;
        assert_eq!(
            summary(&tl).2,
            Some(token + 1),
            "{target}: above the floor {token}"
        );
    }
}

/// Promise (docs/operator.md "Token floor"): a namespace's ConfigMap stays
/// under its cap, and so far below the 1 MiB object limit. One already past
/// it and near that limit (written by hand, say, every entry without a
/// time, so the oldest) takes one more floor: the write succeeds, folds the
/// oldest entries into the namespace's base down to three quarters of the
/// cap, says what it folded, and no target's floor is lower than before.
#[tokio::test]
async fn a_namespace_past_its_cap_is_folded_by_its_next_write_without_lowering_a_floor() {
    let env = OperatorEnv::start_without_operator("floor-full").await;
    let target = "the-last-one";
    let key = floor_key(&env.ns, target);
    let mut data = std::collections::BTreeMap::new();
    let mut i = 0u64;
    while ledger::bytes(&data) < 1_000_000 {
        data.insert(
            format!("t-{i:040x}"),
            (1_000_000_000_000 + (i * 7919) % 1_000_003).to_string(),
        );
        i += 1;
    }
    let before = data.clone();
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": format!("{NAME}.{}", env.ns),
            "labels": { targetlease::operator::floor::FLOOR_LABEL: NAME },
        },
        "data": data,
    }))
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    cms.create(&PostParams::default(), &cm).await.unwrap();

    let policy = FloorPolicy {
        max_entries: 1_000,
        ..FloorPolicy::default()
    };
    let store = floor_store(&env, &HoldNextWrite::default()).with_policy(policy);
    let fold = store.raise(&env.ns, target, 5).await.unwrap();
    let after = floors_of(&env, NAME).await;
    assert_eq!(ledger::entries(&after), 750, "three quarters of the cap");
    assert_eq!(
        fold.map(|f| (f.folded, f.kept)),
        Some((before.len() + 1 - 750, 750)),
        "the raise says what it folded"
    );
    let (fresh, task) = fresh_reader(&env).await;
    assert!(fresh.get(&env.ns, target) >= 5);
    assert!(ledger::floor_in(&after, &key) >= 5);
    for (k, v) in &before {
        let was: u64 = v.parse().unwrap();
        assert!(
            ledger::floor_in(&after, k) >= was,
            "{k} lowered below {was}"
        );
    }
    println!(
        "a namespace of {} entries ({} bytes) folded to {} entries ({} bytes), base {:?}",
        before.len(),
        ledger::bytes(&before),
        ledger::entries(&after),
        ledger::bytes(&after),
        after.get(ledger::BASE_KEY)
    );
    task.abort();
}
