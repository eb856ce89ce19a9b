//! Operator metrics: reconciles, leases by phase, backend and leadership.
//!
//! Store call counters live in [`crate::store::metrics`]; both register into
//! the one registry the admin server exposes.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::crd::{Phase, TargetLease};

/// Label of the reconcile error counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// A bounded error category (`reconcile::Error::category`).
    pub category: &'static str,
}

/// Label of the leases-by-phase gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// `Pending`, `Held`, `Released`, `Lost`, `Error` or `Unknown`.
    pub phase: &'static str,
}

/// The operator's metric families.
#[derive(Clone)]
pub struct OperatorMetrics {
    reconcile_duration: Histogram,
    reconcile_errors: Family<ErrorLabels, Counter>,
    leases: Family<PhaseLabels, Gauge>,
    /// 1 while the lease store answers health probes.
    pub backend_up: Gauge,
    /// 1 while this replica is the elected operator leader.
    pub leader: Gauge,
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        Self {
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            reconcile_errors: Family::default(),
            leases: Family::default(),
            backend_up: Gauge::default(),
            leader: Gauge::default(),
        }
    }
}

impl OperatorMetrics {
    /// Registers every family in `registry` (the caller's `targetlease`
    /// sub-registry, as for the store metrics: one prefix for every metric).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile",
            self.reconcile_duration.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by error category",
            self.reconcile_errors.clone(),
        );
        registry.register(
            "leases",
            "TargetLeases by status phase, as the leader sees them (0 on replicas that do not lead)",
            self.leases.clone(),
        );
        registry.register(
            "backend_up",
            "1 when the lease store answers health probes",
            self.backend_up.clone(),
        );
        registry.register(
            "leader",
            "1 when this replica is the elected operator leader",
            self.leader.clone(),
        );
    }

    /// Records one reconcile.
    pub fn reconciled(&self, took: Duration, error: Option<&'static str>) {
        self.reconcile_duration.observe(took.as_secs_f64());
        if let Some(category) = error {
            self.reconcile_errors
                .get_or_create(&ErrorLabels { category })
                .inc();
        }
    }

    /// Recounts leases by phase from the cache.
    pub fn count_phases<'a>(&self, leases: impl Iterator<Item = &'a TargetLease>) {
        let phases = ["Pending", "Held", "Released", "Lost", "Error", "Unknown"];
        let mut counts = [0i64; 6];
        for tl in leases {
            let phase = tl.status.as_ref().and_then(|s| s.phase);
            let i = match phase {
                Some(Phase::Pending) => 0,
                Some(Phase::Held) => 1,
                Some(Phase::Released) => 2,
                Some(Phase::Lost) => 3,
                Some(Phase::Error) => 4,
                Some(Phase::Unknown) | None => 5,
            };
            counts[i] += 1;
        }
        for (phase, n) in phases.into_iter().zip(counts) {
            self.leases.get_or_create(&PhaseLabels { phase }).set(n);
        }
    }
}
