//! The admin HTTP server: `/livez`, `/readyz`, `/metrics`; over HTTPS only
//! when given a certificate ([`tls`]).
//!
//! Live while the process serves; ready when the lease store answers and, on
//! the leader, the informer caches have synced (a standby replica is ready as
//! soon as the store answers, so a rollout does not wait on leadership).
//!
//! The store is probed at most once per [`PROBE_TTL`], however often
//! Prometheus scrapes and the kubelet probes: a scrape never adds a Valkey
//! round trip of its own.
//!
//! `targetlease_leader` follows the write gate, and only a replica whose gate
//! is open counts leases by phase: every other replica reports zeros, so a
//! sum over replicas counts each lease once.

pub mod limits;
pub mod tls;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use kube::runtime::reflector::Store;
use prometheus_client::registry::Registry;

use crate::operator::crd::TargetLease;
use crate::operator::leadership::Leadership;
use crate::operator::metrics::OperatorMetrics;
use crate::operator::readiness::CacheSync;
use crate::store::LeaseStore;

/// How long one health probe's answer is reused.
pub const PROBE_TTL: Duration = Duration::from_secs(5);

/// What the operator loop tells the admin server.
#[derive(Default)]
pub struct RuntimeStatus {
    /// This replica currently runs the controller.
    pub leading: AtomicBool,
    /// The controller's caches have synced (meaningful while leading).
    pub synced: AtomicBool,
    /// The TargetLease cache of the running controller.
    pub leases: RwLock<Option<Store<TargetLease>>>,
    /// Which of the running controller's caches have synced.
    pub caches: RwLock<Option<CacheSync>>,
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
    /// The last probe: when it finished and whether the store answered.
    pub probed: tokio::sync::Mutex<Option<(Instant, bool)>>,
}

impl AdminState {
    /// State with no probe made yet.
    pub fn new(
        registry: Registry,
        metrics: OperatorMetrics,
        store: Arc<dyn LeaseStore>,
        runtime: Arc<RuntimeStatus>,
        leadership: Leadership,
    ) -> Self {
        Self {
            registry,
            metrics,
            store,
            runtime,
            leadership,
            probed: tokio::sync::Mutex::new(None),
        }
    }
}

/// Binds the admin listener. `[::]:PORT` listens on IPv6 and IPv4 alike
/// (dual stack, whatever `net.ipv6.bindv6only` says), and falls back to
/// `0.0.0.0:PORT` on a node without IPv6; any other address is bound as given.
pub fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let open = |addr: SocketAddr| -> std::io::Result<std::net::TcpListener> {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        if addr.is_ipv6() && addr.ip().is_unspecified() {
            socket.set_only_v6(false)?;
        }
        socket.set_reuse_address(true)?;
        socket.bind(&addr.into())?;
        socket.listen(1024)?;
        socket.set_nonblocking(true)?;
        Ok(socket.into())
    };
    match open(addr) {
        Err(e) if addr.is_ipv6() && addr.ip().is_unspecified() => {
            let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), addr.port());
            tracing::info!(error = %e, fallback = %v4, "no IPv6 here; the admin server listens on IPv4 only");
            open(v4)
        }
        other => other,
    }
}

/// The admin routes.
pub fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Serves until `shutdown` resolves: HTTPS only with `tls`, HTTP without.
pub async fn serve(
    addr: SocketAddr,
    tls: Option<tls::AdminTls>,
    state: Arc<AdminState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(bind(addr)?)?;
    serve_on(listener, tls, limits::Limits::default(), state, shutdown).await
}

/// [`serve`] on a bound listener, within `limits` ([`limits`]).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    tls: Option<tls::AdminTls>,
    limits: limits::Limits,
    state: Arc<AdminState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use limits::Bounded;
    match tls {
        None => {
            axum::serve(Bounded::new(listener, limits), router(state))
                .with_graceful_shutdown(shutdown)
                .await
        }
        Some(tls) => {
            let listener = Bounded::new(tls.listen(listener, limits)?, limits);
            axum::serve(listener, router(state))
                .with_graceful_shutdown(shutdown)
                .await
        }
    }
}

/// Whether the store answers, probing it only when the last answer is older
/// than [`PROBE_TTL`] (concurrent callers wait for the one probe in flight).
async fn store_answers(state: &AdminState) -> bool {
    let mut probed = state.probed.lock().await;
    if let Some((at, up)) = *probed
        && at.elapsed() < PROBE_TTL
    {
        return up;
    }
    let up = matches!(
        tokio::time::timeout(Duration::from_secs(2), state.store.health()).await,
        Ok(Ok(_))
    );
    state.metrics.backend_up.set(i64::from(up));
    *probed = Some((Instant::now(), up));
    up
}

async fn readyz(State(state): State<Arc<AdminState>>) -> impl IntoResponse {
    if !store_answers(&state).await {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "lease store does not answer".to_string(),
        );
    }
    let rt = &state.runtime;
    if rt.leading.load(Ordering::SeqCst) && !rt.synced.load(Ordering::SeqCst) {
        let waiting = rt
            .caches
            .read()
            .ok()
            .and_then(|c| c.as_ref().map(CacheSync::waiting))
            .unwrap_or_default();
        let why = if waiting.is_empty() {
            "caches synced; reading the lease store's clock".to_string()
        } else {
            format!("caches not synced: {}", waiting.join(", "))
        };
        return (StatusCode::SERVICE_UNAVAILABLE, why);
    }
    (StatusCode::OK, "ok".to_string())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::readiness::Cache;
    use crate::store::memory::MemoryStore;
    use crate::store::metrics::{MeteredStore, StoreMetrics};
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    fn state() -> (Arc<AdminState>, StoreMetrics) {
        let store_metrics = StoreMetrics::default();
        let store = MeteredStore::new(Arc::new(MemoryStore::default()), store_metrics.clone());
        let metrics = OperatorMetrics::default();
        let registry = crate::operator::metrics::registry(&metrics, &store_metrics);
        let state = AdminState::new(
            registry,
            metrics,
            Arc::new(store),
            Arc::new(RuntimeStatus::default()),
            Leadership::always(),
        );
        (Arc::new(state), store_metrics)
    }

    async fn get(state: &Arc<AdminState>, path: &str) -> (StatusCode, String) {
        let res = router(state.clone())
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = res.status();
        let body = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn scrapes_and_probes_share_one_health_probe_per_ttl() {
        let (state, store_metrics) = state();
        for _ in 0..10 {
            let (status, body) = get(&state, "/metrics").await;
            assert_eq!(status, StatusCode::OK);
            assert!(body.contains("targetlease_backend_up 1"), "{body}");
            assert_eq!(get(&state, "/readyz").await.0, StatusCode::OK);
        }
        assert_eq!(
            store_metrics.count("health", "ok"),
            1,
            "one probe for 20 requests"
        );
        // Once the answer is older than the TTL, the next request probes again.
        let past = Instant::now() - PROBE_TTL - Duration::from_millis(1);
        *state.probed.lock().await = Some((past, true));
        get(&state, "/metrics").await;
        assert_eq!(store_metrics.count("health", "ok"), 2);
    }

    #[tokio::test]
    async fn readyz_names_the_caches_that_have_not_synced() {
        let (state, _) = state();
        let caches = CacheSync::default();
        *state.runtime.caches.write().unwrap() = Some(caches.clone());
        state.runtime.leading.store(true, Ordering::SeqCst);
        caches.watching::<()>(Cache::Leases)(&kube::runtime::watcher::Event::InitDone);
        let (status, body) = get(&state, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "caches not synced: pods, token floor configmaps");
        caches.watching::<()>(Cache::Pods)(&kube::runtime::watcher::Event::InitDone);
        caches.watching::<()>(Cache::Floors)(&kube::runtime::watcher::Event::InitDone);
        let (_, body) = get(&state, "/readyz").await;
        assert_eq!(body, "caches synced; reading the lease store's clock");
        state.runtime.synced.store(true, Ordering::SeqCst);
        assert_eq!(get(&state, "/readyz").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn the_unspecified_ipv6_address_serves_ipv4_and_ipv6() {
        let listener = bind("[::]:0".parse().unwrap()).expect("bind [::]:0");
        let port = listener.local_addr().unwrap().port();
        let (state, _) = state();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        tokio::spawn(async move { axum::serve(listener, router(state)).await });
        for host in ["127.0.0.1", "[::1]"] {
            let mut conn = tokio::net::TcpStream::connect(format!("{host}:{port}"))
                .await
                .unwrap_or_else(|e| panic!("connect to {host}:{port}: {e}"));
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            conn.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut reply = String::new();
            conn.read_to_string(&mut reply).await.unwrap();
            assert!(reply.starts_with("HTTP/1.1 200"), "{host}: {reply}");
        }
    }
}
