//! Steady state: API writes over the window, with a client-go-style Lease renewed beside it.

use std::time::Instant;

use super::objects::renew_lease_every_2s;
use super::process::{Operator, apiserver_metrics, renews, tl_writes};
use super::{Bench, Results, Steady};

pub(super) async fn steady(
    b: &Bench<'_>,
    ns: &str,
    op: &Operator,
    n: usize,
    results: &mut Results,
) {
    // Steady state: API writes over the window, with a client-go-style Lease beside.
    eprintln!("bench: steady state for {:?}", b.p.steady);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let before = apiserver_metrics(&b.client).await;
    let renews_before = renews(&op.metrics());
    let start = Instant::now();
    let baseline = tokio::spawn(renew_lease_every_2s(
        b.client.clone(),
        ns.to_owned(),
        stop_rx,
    ));
    tokio::time::sleep(b.p.steady).await;
    let after = apiserver_metrics(&b.client).await;
    let window = start.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    // Counted by the client: the apiserver's own identity Lease also counts as a
    // `leases` PUT in apiserver_request_total.
    let baseline_writes = baseline.await.unwrap_or(0) as f64;
    let (hwm, rss) = op.rss();
    let status_writes = tl_writes(&after, true) - tl_writes(&before, true);
    results.steady = Some(Steady {
        leases: n,
        window_secs: window,
        status_writes,
        all_tl_writes: tl_writes(&after, false) - tl_writes(&before, false),
        per_lease_per_min: status_writes / n as f64 / (window / 60.0),
        baseline_writes,
        baseline_per_min: baseline_writes / (window / 60.0),
        renews: renews(&op.metrics()) - renews_before,
        rss_hwm_kb: hwm,
        rss_kb: rss,
    });
}
