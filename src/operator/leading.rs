//! Leader election among operator replicas: the controller runs only while
//! this replica leads, and the Lease is given up on shutdown.

use std::sync::atomic::Ordering;

use futures::stream::BoxStream;
use tokio::sync::watch;

use super::controller::{OperatorConfig, control};
use super::election::{Elector, Timings};
use crate::store::Target;

/// Leader election among operator replicas, on a `coordination.k8s.io` Lease.
pub struct Election {
    /// Client for the Lease. Without the write gate: the elector's own writes
    /// are what open it.
    pub client: kube::Client,
    /// Namespace of the Lease (the operator's own).
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// Lease duration, renew deadline and retry period.
    pub timings: Timings,
}

/// Runs the controller only while this replica leads, until `shutdown` resolves.
///
/// The controller starts when this replica takes the Lease and stops when it
/// cannot prove it still holds it (the gate has closed by then); the replica
/// then stands by again in the same process. On shutdown the gate closes, the
/// controller stops, and the Lease is given up so another replica takes over
/// at once. Workload leases are never released on shutdown: the next leader
/// re-adopts them (same tokens).
pub async fn control_while_leading(
    cfg: OperatorConfig,
    election: Election,
    mut release_notices: impl FnMut() -> BoxStream<'static, Target>,
    mut shutdown: watch::Receiver<bool>,
) {
    let timings = election.timings;
    let (handing, taking) = (cfg.keeper.clone(), cfg.keeper.clone());
    let mut elector = Elector::new(
        election.client,
        &election.namespace,
        &election.lease_name,
        &cfg.instance,
        timings,
    )
    .on_other_leader(move || handing.hand_over())
    .on_takeover(move || taking.take_over());
    tracing::info!(identity = %elector.identity(), lease = %election.lease_name, "joining the leader election");
    loop {
        let valid_until = tokio::select! {
            until = elector.acquire(&cfg.leadership) => until,
            _ = shutdown.wait_for(|s| *s) => break,
        };
        tracing::info!(identity = %elector.identity(), "became the operator leader");
        cfg.runtime.leading.store(true, Ordering::SeqCst);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let controller = control(&cfg, release_notices(), async move {
            let _ = stop_rx.await;
        });
        tokio::pin!(controller);
        let mut shutting_down = false;
        tokio::select! {
            // Ends with the gate closed, at the latest at the renew deadline.
            _ = elector.keep_leading(&cfg.leadership, valid_until) => {},
            _ = shutdown.wait_for(|s| *s) => shutting_down = true,
            _ = &mut controller => tracing::error!("the controller stopped by itself"),
        }
        cfg.leadership.step_down();
        let _ = stop_tx.send(());
        // In-flight reconciles finish (their writes refused by the gate)
        // before the Lease can be given up.
        let stopped = tokio::time::timeout(timings.renew_deadline, &mut controller)
            .await
            .is_ok();
        if shutting_down {
            cfg.runtime.leading.store(false, Ordering::SeqCst);
            if stopped {
                give_up(&mut elector, timings).await;
            } else {
                tracing::warn!("the controller did not stop in time; the Lease is left to expire");
            }
            return;
        }
        if !stopped {
            tracing::warn!("waiting for the controller's in-flight requests to end");
            controller.await;
        }
        cfg.runtime.leading.store(false, Ordering::SeqCst);
        tracing::info!(identity = %elector.identity(), "stopped leading; standing by");
    }
    give_up(&mut elector, timings).await;
}

/// Clears the holder of the Lease (if still ours), bounded in time: a replica
/// that cannot reach the API server leaves it to expire.
async fn give_up(elector: &mut Elector, timings: Timings) {
    match tokio::time::timeout(timings.renew_deadline, elector.release()).await {
        Ok(Ok(true)) => tracing::info!("gave the leader election Lease up"),
        Ok(Ok(false)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "could not give the leader election Lease up"),
        Err(_) => tracing::warn!("giving the leader election Lease up timed out"),
    }
}
