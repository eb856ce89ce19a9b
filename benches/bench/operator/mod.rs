//! The real `targetlease operator` binary against a real kube-apiserver +
//! etcd and a real valkey-server: scale, memory, API write cost at steady
//! state, restart re-adoption, handoff and leader failover; and the store's
//! peer, etcd's own lock on the control plane's etcd. Each step is its own
//! file; `run` calls them in order on one control plane.

mod etcd_peer;
mod etcd_store;
mod failover;
mod handoff;
mod heap_profile;
mod objects;
mod process;
mod restart;
mod scale;
mod steady;
mod unrelated_pods;
pub use unrelated_pods::GLIBC;

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
    /// Concurrencies of the etcd-lock peer (empty: not run).
    pub peer_concurrencies: Vec<usize>,
    /// Acquire+release cycles per peer cell at concurrency > 1, and at 1.
    pub peer_cycles: usize,
    pub peer_cycles_single: usize,
    /// Our client's pool size in the peer cells.
    pub peer_pool_size: usize,
    /// Pods no TargetLease selects, for the memory row (0: not run).
    pub unrelated_pods: usize,
    /// The steps to run, in their fixed order (steady, restart, failover,
    /// heap and handoff's second series need scale).
    pub steps: Vec<String>,
    /// The concurrency curve: TargetLeases per run, and the `--concurrency`
    /// of each run.
    pub curve_leases: usize,
    pub curve_concurrencies: Vec<usize>,
}

/// Every step, in the order `run` takes them.
pub const STEPS: [&str; 9] = [
    "peer", "pods", "curve", "scale", "steady", "restart", "handoff", "failover", "heap",
];

/// A heaptrack profile of an operator holding the run's leases.
pub struct HeapProfile {
    pub leases: usize,
    /// How long it ran after renewing every lease, and in all (s).
    pub settle_secs: u64,
    pub secs: f64,
    /// Bytes live at the heap's peak, all stacks.
    pub peak_heap_bytes: f64,
    /// (site, bytes live at the peak), largest first.
    pub sites: Vec<(String, f64)>,
    pub allocations: u64,
    pub temporary: u64,
}

/// Operator memory at start in a cluster with pods no TargetLease selects.
pub struct UnrelatedPods {
    pub pods: usize,
    /// (VmHWM, VmRSS) kB of the same operator started before the pods existed.
    pub idle_hwm_kb: u64,
    pub idle_rss_kb: u64,
    pub hwm_kb: u64,
    pub rss_kb: u64,
    /// VmHWM kB of the same start with the allocator tuned otherwise.
    pub allocators: Vec<(String, u64)>,
}

/// One concurrency of the peer: etcd's lock and ours, acquire+release cycles.
pub struct PeerCell {
    pub concurrency: usize,
    pub etcd: crate::stats::Figure,
    pub etcd_errors: u64,
    /// etcd's Lock on its own, then its Unlock: (p50, p99) µs, from the
    /// same cycles.
    pub etcd_lock_us: (f64, f64),
    pub etcd_unlock_us: (f64, f64),
    /// Our Valkey store.
    pub ours: crate::stats::Figure,
    /// Our etcd store, on the same etcd as etcd's lock.
    pub ours_etcd: crate::stats::Figure,
}

/// One operation at one concurrency, through our etcd store and our Valkey store.
pub struct PeerOp {
    pub concurrency: usize,
    pub op: String,
    pub etcd: crate::stats::Figure,
    pub valkey: crate::stats::Figure,
}

pub struct Scale {
    pub leases: usize,
    pub create_secs: f64,
    pub last_create_to_all_held_secs: f64,
    pub first_create_to_all_held_secs: f64,
    /// From the first create until the operator was stopped to count its
    /// writes (a little after all were Held).
    pub counted_secs: f64,
    pub rss_hwm_kb: u64,
    pub rss_kb: u64,
    /// TargetLease API writes (all verbs, main resource and status) per lease
    /// from the first create until all were Held, the creates and the
    /// republishes excluded.
    pub writes_per_lease_to_held: f64,
    /// Republishes in the same window: a lease already Held rewriting its
    /// published expiry later, after Valkey renewed it (seen by the bench's
    /// watch), by how far they moved it; all but the doubled ones are taken
    /// off `writes_per_lease_to_held`.
    pub republished: crate::tracker::Republishes,
    /// The same writes (republishes included) by verb, subresource and
    /// response code, the most first.
    pub write_kinds: Vec<(String, f64)>,
    /// The API server's mean time over those writes (ms).
    pub api_write_ms: Option<f64>,
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

/// One handoff series: delete the holder, time until the waiter is Held.
pub struct Handoffs {
    pub trials: Vec<Duration>,
    pub failures: usize,
    /// Other leases the operator held meanwhile.
    pub background: usize,
}

pub struct Results {
    pub apiserver_version: String,
    pub peer: Vec<PeerCell>,
    /// Our client's pool size in the peer cells.
    pub peer_pool_size: usize,
    /// Operations of the peer step, one at a time, etcd store and Valkey store.
    pub peer_ops: Vec<PeerOp>,
    /// Our Valkey store's calls in the peer step that did not do their work.
    pub peer_failures: usize,
    /// The same for our etcd store.
    pub peer_etcd_failures: usize,
    pub unrelated_pods: Option<UnrelatedPods>,
    pub heap: Option<HeapProfile>,
    pub scales: Vec<Scale>,
    /// The concurrency curve: each run's `--concurrency` and its figures.
    pub curve: Vec<(usize, Scale)>,
    pub steady: Option<Steady>,
    pub restart: Option<Restart>,
    /// Handoff on an operator holding no other lease.
    pub handoff_quiet: Option<Handoffs>,
    /// Handoff on the operator still holding the last scale's leases.
    pub handoff: Option<Handoffs>,
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
    // The steps that run the glibc build need it before the first minute of
    // the run, not at their turn.
    if p.steps.iter().any(|s| s == "pods" || s == "heap") {
        glibc_exe();
    }
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
        peer: Vec::new(),
        peer_pool_size: p.peer_pool_size,
        peer_ops: Vec::new(),
        peer_failures: 0,
        peer_etcd_failures: 0,
        unrelated_pods: None,
        heap: None,
        scales: Vec::new(),
        curve: Vec::new(),
        steady: None,
        restart: None,
        handoff_quiet: None,
        handoff: None,
        failover_status: Vec::new(),
        failover_marked: Vec::new(),
        failover_failures: 0,
    };
    let wants = |step: &str| p.steps.iter().any(|s| s == step);
    // The peer first, while the control plane is idle; the unrelated pods
    // before any TargetLease exists (that operator watches every namespace).
    if wants("peer") && !p.peer_concurrencies.is_empty() {
        etcd_peer::etcd_peer(&b, &mut results).await;
    }
    if wants("pods") && p.unrelated_pods > 0 {
        unrelated_pods::unrelated_pods(&b, p.unrelated_pods, &mut results).await;
    }
    // The curve before the scale step, which leaves its leases held.
    if wants("curve") && !p.curve_concurrencies.is_empty() && p.curve_leases > 0 {
        scale::curve(&b, &mut results).await;
    }
    // The quiet handoff before any scale: the operator holds nothing else.
    if wants("handoff") {
        results.handoff_quiet = Some(handoff::quiet(&b).await);
    }
    if !wants("scale") || p.scales.is_empty() {
        return results;
    }
    let (ns, op, tracker) = scale::scale(&b, &mut results).await;
    let n = *p.scales.last().unwrap();
    if wants("steady") {
        steady::steady(&b, &ns, &op, n, &mut results).await;
    }
    // The operator holding the leases stays up until the last step is done.
    let op = if wants("restart") {
        restart::restart(&b, &ns, op, &tracker, n, &mut results).await
    } else {
        op
    };
    if wants("handoff") {
        results.handoff = Some(handoff::series(&b, &ns, &tracker, n).await);
    }
    if wants("failover") {
        failover::failover(&b, &ns, &tracker, &mut results).await;
    }
    if wants("heap") {
        let leases = tracker.held_count();
        heap_profile::heap_profile(&b, &ns, op, leases, &mut results).await;
    }
    drop(b);
    results
}

/// The operator built from the same source with the C library's malloc
/// (scripts/bench.sh builds it for the operator part).
fn glibc_exe() -> std::path::PathBuf {
    std::env::var_os("BENCH_GLIBC_EXE")
        .map(std::path::PathBuf::from)
        .expect(
            "BENCH_GLIBC_EXE: the operator built with --no-default-features (run scripts/bench.sh)",
        )
}
