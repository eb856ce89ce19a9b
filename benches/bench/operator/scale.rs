//! Scale: N TargetLeases created at once, each scale in its own namespace with its own operator; time to Held, API writes per lease, memory.
//! The concurrency curve: the same measure at several `--concurrency` values.

use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, ListParams};
use targetlease::operator::crd::TargetLease;

use super::objects::{create_all, holder_lease};
use super::process::{
    Metrics, Operator, apiserver_metrics, store_call_means, tl_write_kinds, tl_write_ms, tl_writes,
};
use super::{Bench, Results, Scale};
use crate::tracker::Tracker;

pub(super) async fn scale(b: &Bench<'_>, results: &mut Results) -> (String, Operator, Tracker) {
    let mut last: Option<(String, Operator, Tracker)> = None;
    for (k, &n) in b.p.scales.iter().enumerate() {
        // One operator at a time, and each scale starts on an API server
        // without the earlier scales' objects (see `clear`).
        if let Some((ns, mut op, tracker)) = last.take() {
            op.stop();
            clear(b, &ns, &tracker).await;
        }
        let ns = b.cp.namespace(&format!("scale-{n}")).await;
        let (s, op, tracker) = measure(b, &ns, n, k, None).await;
        results.scales.push(s);
        last = Some((ns, op, tracker));
    }
    last.expect("at least one scale")
}

/// The curve: `curve_leases` TargetLeases at each `--concurrency` of
/// `curve_concurrencies`, each in its own namespace with its own operator;
/// each namespace's operator stops and its TargetLeases are cleared before
/// the next value starts, so no run leaves objects behind for the next.
pub(super) async fn curve(b: &Bench<'_>, results: &mut Results) {
    let n = b.p.curve_leases;
    for (k, &c) in b.p.curve_concurrencies.iter().enumerate() {
        let ns = b.cp.namespace(&format!("curve-{c}")).await;
        let flag = u16::try_from(c).expect("BENCH_CURVE_CONCURRENCY: each at most 65535");
        let (s, mut op, tracker) = measure(b, &ns, n, 50 + k, Some(flag)).await;
        results.curve.push((c, s));
        op.stop();
        clear(b, &ns, &tracker).await;
    }
}

/// Removes every TargetLease in `ns` once its operator stopped: their
/// finalizers taken off (64 patches in flight), then deleted, waited for.
/// Not through the operator, whose cleanup of each (release, token floor,
/// finalizer) is work the next scale should not share the machine with.
/// Their leases in Valkey, no longer renewed, expire within their TTL.
async fn clear(b: &Bench<'_>, ns: &str, tracker: &Tracker) {
    use futures::StreamExt;
    use kube::api::{Patch, PatchParams};
    let api: Api<TargetLease> = Api::namespaced(b.client.clone(), ns);
    let names: Vec<String> = tracker.snapshot().into_keys().collect();
    let failed = futures::stream::iter(names)
        .map(|name| {
            let api = api.clone();
            async move {
                let patch = serde_json::json!({ "metadata": { "finalizers": null } });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .err()
            }
        })
        .buffer_unordered(64)
        .filter_map(|e| async move { e })
        .count()
        .await;
    assert_eq!(failed, 0, "finalizers of {ns} not all taken off");
    // A connection the API server closed while idle can fail the request
    // (an incomplete message): ask again.
    let mut tries = 0;
    while let Err(e) = api
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
    {
        tries += 1;
        assert!(tries < 5, "delete the TargetLeases of {ns}: {e}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let gone = tracker
        .wait(Duration::from_secs(300), |t| t.snapshot().is_empty())
        .await;
    assert!(
        gone.is_some(),
        "the TargetLeases of {ns} were not all deleted"
    );
}

/// Creates `n` TargetLeases in `ns` under a new operator (number `k`, its
/// `--concurrency` when given) and measures until every one is Held.
async fn measure(
    b: &Bench<'_>,
    ns: &str,
    n: usize,
    k: usize,
    concurrency: Option<u16>,
) -> (Scale, Operator, Tracker) {
    eprintln!(
        "bench: {n} TargetLeases in {ns}{}",
        concurrency.map_or(String::new(), |c| format!(", --concurrency {c}"))
    );
    let tracker = Tracker::start(&b.client, ns);
    let op = Operator::start_with(&b.cp, &b.valkey, ns, b.dir.path(), k, concurrency);
    assert!(
        op.wait_ready(Duration::from_secs(60)).await,
        "operator not ready"
    );
    let api: Api<TargetLease> = Api::namespaced(b.client.clone(), ns);
    let objs: Vec<_> = (0..n)
        .map(|i| holder_lease(&format!("lease-{i:05}"), ns, &format!("worker-{i}")))
        .collect();
    let before = apiserver_metrics(&b.client).await;
    let first = Instant::now();
    let last_create = create_all(&api, objs, b.p.create_parallelism).await;
    let timeout = Duration::from_secs(120 + n as u64 / 20);
    let all_held = tracker
        .wait(timeout, |t| t.held_count() >= n)
        .await
        .unwrap_or_else(|| {
            panic!(
                "only {} of {n} Held after {timeout:?}",
                tracker.held_count()
            )
        });
    // The reconciles that brought them there may still be ending (their
    // status write is seen before they return): counted once the count
    // stops moving.
    let m = settled_metrics(&op).await;
    let (hwm, rss) = op.rss();
    // The writes that brought every lease to Held, and nothing after: the
    // operator is stopped (SIGSTOP), and the API server's counters are read
    // once the writes it had in flight were answered (a write is counted
    // once its reply is sent): when two reads agree. Leases Held early were
    // republished meanwhile (`leaseDuration - renewInterval` after their
    // acquisition, or when their published expiry was about to pass if
    // their renewals waited behind the acquisitions): writes of leases
    // already Held, moving their expiry later as only a renewal can, not
    // towards a new lease's Held, taken off. The watch has delivered every one of them
    // once it delivers a write the bench makes after the counters were read
    // (an annotation, itself not counted).
    op.pause();
    let paused = Instant::now();
    tokio::time::sleep(COUNTED_AFTER).await;
    let after = settled_counters(&b.client).await;
    let mark = annotate(&api, "lease-00000").await;
    let caught_up = tracker
        .wait(Duration::from_secs(30), |t| t.newest_version() >= mark)
        .await;
    assert!(
        caught_up.is_some(),
        "the watch did not deliver the bench's own write (version {mark}) in 30 s"
    );
    let moves = tracker.republished_upto(mark);
    // A republish that followed another of the same grant within a renewal
    // interval stays counted (see `Republishes::doubled`).
    let republished = moves.taken_off() as f64;
    // A write the API server answered only after the counters were read
    // (slower than two reads apart) would be subtracted above if it is a
    // republish, yet not counted: read them again now that the watch is
    // past the annotation, which is the one write expected since.
    let again = apiserver_metrics(&b.client).await;
    let late = tl_writes(&again, false) - tl_writes(&after, false) - 1.0;
    assert!(late >= 0.0, "the bench's annotation was not counted");
    if late > 0.0 {
        eprintln!(
            "bench: {late:.0} TargetLease writes answered after the counters were read: counted"
        );
    }
    let counted = tl_writes(&again, false) - 1.0 - tl_writes(&before, false);
    eprintln!(
        "bench: {n} leases: {counted:.0} TargetLease writes counted, {republished:.0} republishes \
         taken off (expiry moved later: {} by 55 s or more, {} by 25 to 55 s, {} by less; {} \
         doubled, left counted)",
        moves.moved_55, moves.moved_25, moves.moved_less, moves.doubled
    );
    op.resume();
    // Renewals that fell due while it was stopped run at once: not in the
    // next step's window.
    tokio::time::sleep(SETTLE).await;
    eprintln!("bench: {n} Held; operator VmHWM {hwm} kB, VmRSS {rss} kB");
    let reconciles = m.sum("targetlease_reconcile_duration_seconds_count", &[]);
    let s = Scale {
        leases: n,
        create_secs: (last_create - first).as_secs_f64(),
        last_create_to_all_held_secs: all_held
            .saturating_duration_since(last_create)
            .as_secs_f64(),
        first_create_to_all_held_secs: (all_held - first).as_secs_f64(),
        counted_secs: (paused - first).as_secs_f64(),
        rss_hwm_kb: hwm,
        rss_kb: rss,
        writes_per_lease_to_held: (counted - republished) / n as f64,
        republished: moves,
        write_kinds: tl_write_kinds(&before, &after),
        api_write_ms: tl_write_ms(&before, &after),
        store_calls: store_call_means(&m),
        reconcile_mean_ms: m.sum("targetlease_reconcile_duration_seconds_sum", &[]) * 1e3
            / reconciles.max(1.0),
        reconciles,
    };
    (s, op, tracker)
}

/// How long the API server is given to answer the writes a stopped operator
/// had in flight before its counters are read.
const COUNTED_AFTER: Duration = Duration::from_millis(500);

/// How long the operator is left to catch up after a pause before the next
/// step measures anything.
const SETTLE: Duration = Duration::from_secs(5);

/// The operator's metrics once its reconcile count stopped moving (two reads
/// 200 ms apart agree; at most 5 s).
async fn settled_metrics(op: &Operator) -> Metrics {
    let count = |m: &Metrics| {
        let c = m.sum("targetlease_reconcile_duration_seconds_count", &[]);
        assert!(c > 0.0, "the operator's metrics have no reconcile count");
        c
    };
    let mut m = op.metrics();
    for _ in 0..25 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let next = op.metrics();
        if count(&next) == count(&m) {
            return next;
        }
        m = next;
    }
    eprintln!("bench: the reconcile count was still moving after 5 s: counted as it was then");
    m
}

/// The API server's counters once two reads 250 ms apart agree on the
/// TargetLease writes (at most 20 reads).
async fn settled_counters(client: &kube::Client) -> Metrics {
    let mut m = apiserver_metrics(client).await;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let next = apiserver_metrics(client).await;
        if tl_writes(&next, false) == tl_writes(&m, false) {
            return next;
        }
        m = next;
    }
    panic!("the API server's TargetLease write counters kept moving with the operator stopped")
}

/// Writes an annotation on the TargetLease `name` and returns the version the
/// write gave it: every TargetLease write before it has an older version.
async fn annotate(api: &Api<TargetLease>, name: &str) -> u64 {
    use kube::api::{Patch, PatchParams};
    let patch = serde_json::json!({
        "metadata": { "annotations": { "bench.targetlease.dev/counted": "true" } }
    });
    // A connection the API server closed while idle can fail the request
    // (an incomplete message): ask again.
    let mut tries = 0;
    let tl = loop {
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(tl) => break tl,
            Err(e) => {
                tries += 1;
                assert!(tries < 5, "annotate the TargetLease {name}: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let version = tl.metadata.resource_version.unwrap_or_default();
    version
        .parse()
        .unwrap_or_else(|_| panic!("a write's resourceVersion {version:?} is not a number"))
}
