//! Metrics for any [`LeaseStore`]: a wrapper that counts and times every call.
//!
//! Labels are bounded by construction: the operation is one of seven fixed
//! names and the result is an [`Outcome::as_str`] or a
//! [`StoreError::category`], never free text.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::{
    AcquireRequest, CommitRequest, Health, LeaseStore, Outcome, ReadReply, ReleaseRequest,
    RenewRequest, Reply, RevokeRequest, StoreError, Target,
};

/// Labels of the per-call counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// `acquire`, `renew`, `release`, `get`, `revoke`, `commit` or `health`.
    pub operation: &'static str,
    /// An outcome name, `ok` for a health probe, or an error category.
    pub result: &'static str,
}

/// Labels of the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// As in [`CallLabels::operation`].
    pub operation: &'static str,
}

/// The metric families a [`MeteredStore`] writes; cheap to clone and share.
#[derive(Clone)]
pub struct StoreMetrics {
    calls: Family<CallLabels, Counter>,
    latency: Family<OperationLabels, Histogram>,
    /// Connections the backend opened, when it counts them.
    connections_opened: Option<Counter>,
}

impl Default for StoreMetrics {
    fn default() -> Self {
        Self {
            calls: Family::default(),
            latency: Family::new_with_constructor(|| {
                // 0.5ms .. ~8s
                Histogram::new(exponential_buckets(0.0005, 2.0, 15))
            }),
            connections_opened: None,
        }
    }
}

impl StoreMetrics {
    /// Also exposes `counter` (a backend's connections opened, e.g.
    /// [`crate::store::valkey::ValkeyStore::connections_counter`]) as
    /// `targetlease_store_connections_opened_total`.
    pub fn with_connections_opened(mut self, counter: Counter) -> Self {
        self.connections_opened = Some(counter);
        self
    }

    /// Registers `targetlease_store_calls_total` and
    /// `targetlease_store_call_duration_seconds` (as `<prefix>_store_…` under
    /// the registry's prefix, if any).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "store_calls",
            "Lease store calls by operation and result (outcome or error category)",
            self.calls.clone(),
        );
        registry.register_with_unit(
            "store_call_duration",
            "Lease store call latency by operation",
            prometheus_client::registry::Unit::Seconds,
            self.latency.clone(),
        );
        if let Some(opened) = &self.connections_opened {
            registry.register(
                "store_connections_opened",
                "Connections the store opened to its backend (steady under steady load)",
                opened.clone(),
            );
        }
    }

    /// How many calls of `operation` ended with `result`.
    pub fn count(&self, operation: &'static str, result: &'static str) -> u64 {
        self.calls
            .get_or_create(&CallLabels { operation, result })
            .get()
    }

    fn record(&self, operation: &'static str, result: &'static str, started: Instant) {
        self.calls
            .get_or_create(&CallLabels { operation, result })
            .inc();
        self.latency
            .get_or_create(&OperationLabels { operation })
            .observe(started.elapsed().as_secs_f64());
    }
}

/// Wraps a store and records every call in [`StoreMetrics`].
pub struct MeteredStore {
    inner: Arc<dyn LeaseStore>,
    metrics: StoreMetrics,
}

impl MeteredStore {
    /// Meters `inner` into `metrics`.
    pub fn new(inner: Arc<dyn LeaseStore>, metrics: StoreMetrics) -> Self {
        Self { inner, metrics }
    }

    /// The metric families written by this store.
    pub fn metrics(&self) -> &StoreMetrics {
        &self.metrics
    }

    async fn timed(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<Reply, StoreError>>,
    ) -> Result<Reply, StoreError> {
        let started = Instant::now();
        let result = call.await;
        let label = match &result {
            Ok(reply) => Outcome::as_str(reply.outcome),
            Err(e) => e.category(),
        };
        self.metrics.record(operation, label, started);
        result
    }
}

#[async_trait]
impl LeaseStore for MeteredStore {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Reply, StoreError> {
        self.timed("acquire", self.inner.acquire(req)).await
    }
    async fn renew(&self, req: &RenewRequest) -> Result<Reply, StoreError> {
        self.timed("renew", self.inner.renew(req)).await
    }
    async fn release(&self, req: &ReleaseRequest) -> Result<Reply, StoreError> {
        self.timed("release", self.inner.release(req)).await
    }
    async fn get(&self, target: &Target) -> Result<Reply, StoreError> {
        self.timed("get", self.inner.get(target)).await
    }
    async fn read(&self, target: &Target, key: &str) -> Result<ReadReply, StoreError> {
        self.inner.read(target, key).await
    }
    async fn list(
        &self,
        namespace: Option<&str>,
        target_prefix: &str,
    ) -> Result<Vec<super::Listed>, StoreError> {
        self.inner.list(namespace, target_prefix).await
    }
    async fn revoke(&self, req: &RevokeRequest) -> Result<Reply, StoreError> {
        self.timed("revoke", self.inner.revoke(req)).await
    }
    async fn commit(&self, req: &CommitRequest) -> Result<Reply, StoreError> {
        self.timed("commit", self.inner.commit(req)).await
    }
    async fn close(&self) {
        self.inner.close().await
    }
    async fn notices(&self, target: &Target) -> Result<super::Notices, StoreError> {
        self.inner.notices(target).await
    }

    async fn health(&self) -> Result<Health, StoreError> {
        let started = Instant::now();
        let result = self.inner.health().await;
        let label = match &result {
            Ok(_) => "ok",
            Err(e) => e.category(),
        };
        self.metrics.record("health", label, started);
        result
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::memory::{ManualClock, MemoryStore};

    #[test]
    fn a_backend_connection_counter_is_exposed_as_it_counts() {
        let opened = Counter::default();
        let metrics = StoreMetrics::default().with_connections_opened(opened.clone());
        opened.inc();
        opened.inc();
        let mut registry = Registry::with_prefix("targetlease");
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.lines()
                .any(|l| l == "targetlease_store_connections_opened_total 2"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn counts_outcomes_and_errors_with_bounded_labels() {
        let clock = ManualClock::new(1_700_000_000_000);
        let inner = Arc::new(MemoryStore::new(Arc::new(clock)));
        let metrics = StoreMetrics::default();
        let store = MeteredStore::new(inner, metrics.clone());
        let t = Target::new("ns", "t");
        let ttl = Duration::from_secs(10);
        store
            .acquire(&AcquireRequest::new(t.clone(), "a", ttl))
            .await
            .unwrap();
        store
            .acquire(&AcquireRequest::new(t.clone(), "b", ttl))
            .await
            .unwrap();
        let bad = AcquireRequest::new(t.clone(), "", ttl);
        assert!(store.acquire(&bad).await.is_err());
        store.health().await.unwrap();
        assert_eq!(metrics.count("acquire", "acquired"), 1);
        assert_eq!(metrics.count("acquire", "held"), 1);
        assert_eq!(metrics.count("acquire", "invalid"), 1);
        assert_eq!(metrics.count("health", "ok"), 1);

        let mut registry = Registry::with_prefix("targetlease");
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"targetlease_store_calls_total{operation="acquire",result="held"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("targetlease_store_call_duration_seconds_count{operation=\"acquire\"} 3"),
            "{text}"
        );
    }
}
