//! The real `targetlease operator` binary against a real kube-apiserver +
//! etcd and a real valkey-server: scale, memory, API write cost at steady
//! state, restart re-adoption, handoff and leader failover. Each step is its
//! own file; `run` calls them in order on one control plane.

mod failover;
mod handoff;
mod objects;
mod process;
mod restart;
mod scale;
mod steady;

use std::time::Duration;

use kube::Client;

use crate::support::kube_env::ControlPlane;
use crate::support::operator_env::install_crd;
use crate::support::valkey_server::ValkeyServer;

/// What to run.
pub struct Params {
    /// Lease counts to scale to, each in its own namespace with its own operator.
    pub scales: Vec<usize>,
    /// Steady-state window for API write counting.
    pub steady: Duration,
    pub handoff_trials: usize,
    pub failover_trials: usize,
    /// Parallel creates (kube-rs has no client-side rate limit).
    pub create_parallelism: usize,
}

pub struct Scale {
    pub leases: usize,
    pub create_secs: f64,
    pub last_create_to_all_held_secs: f64,
    pub first_create_to_all_held_secs: f64,
    pub rss_hwm_kb: u64,
    pub rss_kb: u64,
    /// TargetLease API writes (all verbs, main resource and status) per lease
    /// from the first create until all were Held, the creates excluded.
    pub writes_per_lease_to_held: f64,
    /// Mean store call latency inside the operator, by operation (ms, count).
    pub store_calls: Vec<(String, f64, f64)>,
    /// Mean reconcile duration (ms) and reconciles.
    pub reconcile_mean_ms: f64,
    pub reconciles: f64,
}

pub struct Steady {
    pub leases: usize,
    pub window_secs: f64,
    pub status_writes: f64,
    pub all_tl_writes: f64,
    pub per_lease_per_min: f64,
    pub baseline_writes: f64,
    pub baseline_per_min: f64,
    pub renews: f64,
    pub rss_hwm_kb: u64,
    pub rss_kb: u64,
}

pub struct Restart {
    pub leases: usize,
    pub new_tokens: usize,
    pub tokens_changed_in_status: usize,
    pub tl_writes: f64,
    pub tl_objects_changed: u64,
    /// Leases with leaseDuration 1h (no republish due) and how many changed.
    pub quiet_leases: usize,
    pub quiet_changed: usize,
    pub ready_secs: f64,
    pub all_renewed_secs: Option<f64>,
    pub renews: f64,
}

pub struct Results {
    pub apiserver_version: String,
    pub scales: Vec<Scale>,
    pub steady: Option<Steady>,
    pub restart: Option<Restart>,
    pub handoff: Vec<Duration>,
    pub handoff_failures: usize,
    pub handoff_background: usize,
    pub failover_status: Vec<Duration>,
    pub failover_marked: Vec<Duration>,
    pub failover_failures: usize,
}

/// What every step shares: the control plane, Valkey, the lease-id key file.
pub(super) struct Bench<'a> {
    p: &'a Params,
    cp: ControlPlane,
    client: Client,
    valkey: ValkeyServer,
    dir: tempfile::TempDir,
}

pub async fn run(p: &Params) -> Results {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("lease-id-key"),
        "bench-lease-id-key-0123456789abcdef\n",
    )
    .unwrap();
    eprintln!("bench: starting the control plane");
    let cp = ControlPlane::start().await;
    let client = cp.client();
    install_crd(&client).await;
    let valkey = ValkeyServer::start();
    let apiserver_version = client
        .apiserver_version()
        .await
        .map(|v| v.git_version)
        .unwrap_or_default();
    let b = Bench {
        p,
        cp,
        client,
        valkey,
        dir,
    };
    let mut results = Results {
        apiserver_version,
        scales: Vec::new(),
        steady: None,
        restart: None,
        handoff: Vec::new(),
        handoff_failures: 0,
        handoff_background: 0,
        failover_status: Vec::new(),
        failover_marked: Vec::new(),
        failover_failures: 0,
    };
    let (ns, op, tracker) = scale::scale(&b, &mut results).await;
    let n = *p.scales.last().unwrap();
    steady::steady(&b, &ns, &op, n, &mut results).await;
    let _op2 = restart::restart(&b, &ns, op, &tracker, n, &mut results).await;
    handoff::handoff(&b, &ns, &tracker, n, &mut results).await;
    failover::failover(&b, &ns, &tracker, &mut results).await;
    drop(b);
    results
}
