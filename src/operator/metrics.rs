//! Operator metrics: reconciles, leases by phase, lost leases, backend and
//! leadership, API writes by kind, build and process information.
//!
//! Store call counters live in [`crate::store::metrics`]. Everything is
//! registered under one prefix, `targetlease_` ([`registry`]), so every name
//! the operator exposes starts with it.

pub mod api_writes;
pub mod process;

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::operator::crd::{Phase, TargetLease};
use crate::store::metrics::StoreMetrics;

/// The prefix of every metric name.
pub const PREFIX: &str = "targetlease";

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

/// Label of the release notice counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NoticeLabels {
    /// `woke`, `folded` or `unknown_target` (`operator::wakeups::Fate`).
    pub result: &'static str,
}

/// Labels of `targetlease_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate version the binary was built from.
    pub version: &'static str,
}

/// The operator's metric families.
#[derive(Clone)]
pub struct OperatorMetrics {
    reconcile_duration: Histogram,
    reconcile_queue: Histogram,
    reconcile_errors: Family<ErrorLabels, Counter>,
    leases: Family<PhaseLabels, Gauge>,
    leases_lost: Counter,
    release_notices: Family<NoticeLabels, Counter>,
    build_info: Family<BuildLabels, Gauge>,
    /// Kubernetes API writes by kind (counted in the client, see [`api_writes`]).
    pub api_writes: api_writes::ApiWrites,
    /// 1 while the lease store answers health probes.
    pub backend_up: Gauge,
    /// 1 while this replica is the elected operator leader.
    pub leader: Gauge,
}

impl Default for OperatorMetrics {
    fn default() -> Self {
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        Self {
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            reconcile_queue: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            reconcile_errors: Family::default(),
            leases: Family::default(),
            leases_lost: Counter::default(),
            release_notices: Family::default(),
            build_info,
            api_writes: api_writes::ApiWrites::default(),
            backend_up: Gauge::default(),
            leader: Gauge::default(),
        }
    }
}

/// The one registry the admin server exposes: the operator's and the store's
/// families and the process collector, all under [`PREFIX`].
pub fn registry(operator: &OperatorMetrics, store: &StoreMetrics) -> Registry {
    let mut registry = Registry::default();
    let ours = registry.sub_registry_with_prefix(PREFIX);
    store.register(ours);
    operator.register(ours);
    ours.register_collector(Box::new(process::ProcessCollector));
    registry
}

impl OperatorMetrics {
    /// Registers every family in `registry` (the caller's `targetlease`
    /// sub-registry, as for the store metrics: one prefix for every metric).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "build_info",
            "Always 1; the version label names the build",
            self.build_info.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile",
            self.reconcile_duration.clone(),
        );
        registry.register(
            "reconcile_queue_seconds",
            "Time a due reconcile waited for one of the --concurrency slots (shared fairly among namespaces)",
            self.reconcile_queue.clone(),
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
            "leases_lost",
            "Leases that ended in the store without the operator giving them back (expired, revoked, data loss)",
            self.leases_lost.clone(),
        );
        registry.register(
            "release_notices",
            "Release notices received on <prefix>:events, by what became of them: woke (a wake at once), folded (into a wake already due), unknown_target (no TargetLease names it)",
            self.release_notices.clone(),
        );
        registry.register(
            "backend_up",
            "1 when the lease store answered its last health probe (probed at most every few seconds)",
            self.backend_up.clone(),
        );
        registry.register(
            "leader",
            "1 when this replica is the elected operator leader",
            self.leader.clone(),
        );
        self.api_writes.register(registry);
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

    /// Records how long a reconcile waited for its slot.
    pub fn queued(&self, waited: Duration) {
        self.reconcile_queue.observe(waited.as_secs_f64());
    }

    /// Records what became of one release notice.
    pub fn release_notice(&self, result: &'static str) {
        self.release_notices
            .get_or_create(&NoticeLabels { result })
            .inc();
    }

    /// Records a lease that ended in the store without being given back.
    pub fn lease_lost(&self) {
        self.leases_lost.inc();
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

/// The metric names a scrape of [`registry`] shows (sample names, with the
/// `_total`, `_bucket`, `_count`, `_sum` and `_created` suffixes), sorted:
/// what dashboards and alerting rules may refer to.
pub fn exposed_names(registry: &Registry) -> Vec<String> {
    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, registry);
    let mut names: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next().map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exposed_name_carries_the_prefix_and_the_new_families_are_there() {
        let operator = OperatorMetrics::default();
        let store = StoreMetrics::default();
        operator.count_phases(std::iter::empty());
        operator.reconciled(Duration::from_millis(1), Some("kube"));
        operator.queued(Duration::from_millis(1));
        operator.lease_lost();
        operator.release_notice("woke");
        operator.api_writes.count(api_writes::WriteKind::Status);
        operator.api_writes.conflict(api_writes::WriteKind::Floor);
        let names = exposed_names(&registry(&operator, &store));
        for name in &names {
            assert!(name.starts_with("targetlease_"), "{name}");
        }
        for expected in [
            "targetlease_build_info",
            "targetlease_leases_lost_total",
            "targetlease_release_notices_total",
            "targetlease_api_writes_total",
            "targetlease_api_write_conflicts_total",
            "targetlease_process_cpu_seconds_total",
            "targetlease_process_resident_memory_bytes",
            "targetlease_process_start_time_seconds",
            "targetlease_process_open_fds",
            "targetlease_reconcile_errors_total",
            "targetlease_reconcile_duration_seconds_count",
            "targetlease_reconcile_queue_seconds_count",
            "targetlease_leases",
            "targetlease_backend_up",
            "targetlease_leader",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} in {names:?}"
            );
        }
    }

    #[test]
    fn build_info_names_the_crate_version() {
        let operator = OperatorMetrics::default();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(
            &mut text,
            &registry(&operator, &StoreMetrics::default()),
        )
        .unwrap();
        let line = format!(
            "targetlease_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
}
