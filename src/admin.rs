//! The admin HTTP server: `/livez`, `/readyz`, `/metrics`.
//!
//! Live while the process serves; ready when the lease store answers and, on
//! the leader, the informer caches have synced (a standby replica is ready as
//! soon as the store answers, so a rollout does not wait on leadership).
//!
//! `targetlease_leader` follows the write gate, and only a replica whose gate
//! is open counts leases by phase: every other replica reports zeros, so a
//! sum over replicas counts each lease once.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use kube::runtime::reflector::Store;
use prometheus_client::registry::Registry;

use crate::crd::TargetLease;
use crate::leadership::Leadership;
use crate::metrics::OperatorMetrics;
use crate::store::LeaseStore;

/// What the operator loop tells the admin server.
#[derive(Default)]
pub struct RuntimeStatus {
    /// This replica currently runs the controller.
    pub leading: AtomicBool,
    /// The controller's caches have synced (meaningful while leading).
    pub synced: AtomicBool,
    /// The TargetLease cache of the running controller.
    pub leases: RwLock<Option<Store<TargetLease>>>,
}

/// Shared by the handlers.
pub struct AdminState {
    /// Every metric family.
    pub registry: Registry,
    /// Operator metrics (phase counts are refreshed on scrape).
    pub metrics: OperatorMetrics,
    /// The store to probe.
    pub store: Arc<dyn LeaseStore>,
    /// Leadership and cache state.
    pub runtime: Arc<RuntimeStatus>,
    /// The write gate.
    pub leadership: Leadership,
}

/// Serves until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    state: Arc<AdminState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn store_answers(state: &AdminState) -> bool {
    let up = matches!(
        tokio::time::timeout(Duration::from_secs(2), state.store.health()).await,
        Ok(Ok(_))
    );
    state.metrics.backend_up.set(i64::from(up));
    up
}

async fn readyz(State(state): State<Arc<AdminState>>) -> impl IntoResponse {
    if !store_answers(&state).await {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "lease store does not answer",
        );
    }
    let rt = &state.runtime;
    if rt.leading.load(Ordering::SeqCst) && !rt.synced.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "caches not synced");
    }
    (StatusCode::OK, "ok")
}

async fn metrics(State(state): State<Arc<AdminState>>) -> impl IntoResponse {
    store_answers(&state).await;
    let leading = state.leadership.is_leading();
    state.metrics.leader.set(i64::from(leading));
    let cache = state.runtime.leases.read().ok().and_then(|g| g.clone());
    match cache {
        Some(store) if leading => {
            let leases = store.state();
            state.metrics.count_phases(leases.iter().map(|l| &**l));
        }
        _ => state.metrics.count_phases(std::iter::empty()),
    }
    let mut body = String::new();
    if prometheus_client::encoding::text::encode(&mut body, &state.registry).is_err() {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            String::new(),
        );
    }
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
}
