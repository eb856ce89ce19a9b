//! One namespace's load against another's leases: the operator's reconcile
//! slots are shared fairly among namespaces.

use super::*;

use futures::StreamExt;
use kube::Api;

/// What the sampler saw of the quiet lease at one instant.
struct Sample {
    at_ms: i64,
    phase: Option<Phase>,
    token: Option<u64>,
    expires_ms: Option<i64>,
}

/// `targetlease_reconcile_queue_seconds`: (count, count of waits up to `le`).
fn queue_waits(port: u16, le: &str) -> (u64, u64) {
    let (_, text) = support::operator_env::http_get(port, "/metrics").expect("metrics");
    let value = |prefix: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{prefix} in\n{text}"))
    };
    (
        value("targetlease_reconcile_queue_seconds_count "),
        value(&format!(
            "targetlease_reconcile_queue_seconds_bucket{{le=\"{le}\"}}"
        )),
    )
}

/// A flood in one namespace — hundreds of TargetLeases created at once, each
/// renewed every second — keeps both reconcile slots of the operator
/// (`--concurrency 2`) busy for many seconds. A lease in another namespace,
/// with a short `leaseDuration` (12s, renewed every 4s: its published expiry
/// is refreshed when less than 5s is left), stays Held with the same token
/// throughout, and its published expiry keeps moving and never passes: its
/// renewals take their turn instead of waiting behind the flood's backlog.
#[tokio::test]
async fn one_namespace_flooding_the_operator_leaves_another_namespaces_lease_renewed() {
    const FLOOD: usize = 400;
    let mut env = OperatorEnv::start_on_own_control_plane("noisy").await;
    env.watch_every_namespace();
    env.start_operator_with(&["--concurrency", "2"]);
    let quiet = env.cp.namespace("quiet").await;
    let quiet_api: Api<TargetLease> = Api::namespaced(env.client.clone(), &quiet);
    let steady: TargetLease = serde_json::from_value(json!({
        "apiVersion": "targetlease.dev/v1alpha1", "kind": "TargetLease",
        "metadata": { "name": "steady" },
        "spec": serde_json::Value::from(lease_for("db").identity("job").durations("12s", "4s")),
    }))
    .unwrap();
    quiet_api
        .create(&Default::default(), &steady)
        .await
        .expect("create the quiet lease");
    let held = eventually("the quiet lease Held", SOON, || async {
        let tl = quiet_api.get("steady").await.ok()?;
        (summary(&tl).0 == Some(Phase::Held)).then_some(tl)
    })
    .await;
    let token = summary(&held).2;

    // Every 100 ms, what the quiet lease publishes.
    let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Sample>::new()));
    let sampler = {
        let (api, samples) = (quiet_api.clone(), samples.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(tl) = api.get("steady").await {
                    let s = tl.status.unwrap_or_default();
                    samples.lock().unwrap().push(Sample {
                        at_ms: now_ms(),
                        phase: s.phase,
                        token: s.fencing_token,
                        expires_ms: ms(&s.expires_at),
                    });
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    // The flood: all at once (64 creates in flight), each on its own target.
    let flood_started = std::time::Instant::now();
    let noisy = env.api();
    futures::stream::iter(0..FLOOD)
        .map(|i| {
            let noisy = noisy.clone();
            async move {
                let tl: TargetLease = serde_json::from_value(json!({
                    "apiVersion": "targetlease.dev/v1alpha1", "kind": "TargetLease",
                    "metadata": { "name": format!("flood-{i}") },
                    "spec": serde_json::Value::from(
                        lease_for(&format!("t-{i}")).identity("noisy").durations("4s", "1s"),
                    ),
                }))
                .unwrap();
                noisy
                    .create(&Default::default(), &tl)
                    .await
                    .expect("create a flood lease");
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    let created = flood_started.elapsed();
    // Until the whole flood is Held, and a few renewals more.
    let all_held = eventually("the whole flood Held", Duration::from_secs(180), || async {
        let list = noisy.list(&Default::default()).await.ok()?;
        let held = list
            .items
            .iter()
            .filter(|tl| summary(tl).0 == Some(Phase::Held))
            .count();
        (held == FLOOD).then(|| flood_started.elapsed())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    sampler.abort();
    let (waits, quick) = queue_waits(env.admin_port(0), "0.512");

    let samples = std::mem::take(&mut *samples.lock().unwrap());
    let mut expiries: Vec<i64> = samples.iter().filter_map(|s| s.expires_ms).collect();
    expiries.dedup();
    let least_left = samples
        .iter()
        .map(|s| s.expires_ms.unwrap_or(0) - s.at_ms)
        .min()
        .unwrap();
    eprintln!(
        "flood of {FLOOD}: created in {created:?}, all Held after {all_held:?}; \
         {} of {waits} reconciles waited over 0.5 s for a slot; the quiet lease: \
         {} samples, {} published expiries, least time left {least_left} ms",
        waits - quick,
        samples.len(),
        expiries.len()
    );
    assert!(
        waits - quick >= 100,
        "the flood kept the slots busy: {} of {waits} reconciles waited over 0.5 s",
        waits - quick
    );
    for s in &samples {
        assert_eq!(
            (s.phase, s.token),
            (Some(Phase::Held), token),
            "the quiet lease stays Held with its token (at {} ms)",
            s.at_ms
        );
        assert!(
            s.expires_ms.is_some_and(|e| e > s.at_ms),
            "the quiet lease's published expiry {:?} passed at {} ms",
            s.expires_ms,
            s.at_ms
        );
    }
    // Republished when less than renewInterval + 1 s is left: about every 8 s.
    let span_s = (samples.last().unwrap().at_ms - samples[0].at_ms) / 1000;
    assert!(
        expiries.windows(2).all(|w| w[0] < w[1]) && expiries.len() as i64 >= span_s / 10,
        "the published expiry moves forward, at least every 10 s over {span_s} s: {expiries:?}"
    );
}
