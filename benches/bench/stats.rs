//! Latency samples and the figures the report prints from them.

use std::time::Duration;

/// One measured cell: how many operations, how long, and their latencies.
#[derive(Clone, Debug)]
pub struct Figure {
    /// Operations completed.
    pub ops: usize,
    /// Operations per second over the whole cell.
    pub ops_per_sec: f64,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
    /// Server-side time per call (valkey `INFO commandstats`), microseconds.
    pub server_us: Option<f64>,
    /// Commands the server ran per top-level call (script bodies included).
    pub server_cmds: Option<f64>,
}

impl Figure {
    /// Summarises raw per-operation latencies measured over `elapsed`.
    pub fn from_samples(mut samples: Vec<Duration>, elapsed: Duration) -> Figure {
        samples.sort_unstable();
        Figure {
            ops: samples.len(),
            ops_per_sec: samples.len() as f64 / elapsed.as_secs_f64().max(1e-9),
            p50_us: percentile(&samples, 0.50).as_secs_f64() * 1e6,
            p99_us: percentile(&samples, 0.99).as_secs_f64() * 1e6,
            server_us: None,
            server_cmds: None,
        }
    }
}

/// Nearest-rank percentile of sorted samples (zero when empty).
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// p50 and p99 of unsorted durations, as milliseconds.
pub fn p50_p99_ms(samples: &[Duration]) -> (f64, f64) {
    let mut s = samples.to_vec();
    s.sort_unstable();
    (
        percentile(&s, 0.50).as_secs_f64() * 1e3,
        percentile(&s, 0.99).as_secs_f64() * 1e3,
    )
}
