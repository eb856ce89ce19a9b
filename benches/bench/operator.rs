//! Items 2 and 3: the real `targetlease operator` binary against a real
//! kube-apiserver + etcd and a real valkey-server: scale, memory, API write
//! cost at steady state, restart re-adoption, handoff and leader failover.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use targetlease::crd::TargetLease;
use targetlease::store::valkey::{ValkeyConfig, ValkeyStore};
use targetlease::store::{LeaseStore, Target};

use crate::support::kube_env::ControlPlane;
use crate::support::operator_env::{http_get, install_crd};
use crate::support::valkey_server::{ValkeyServer, free_port};
use crate::tracker::Tracker;

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

/// One operator process with its admin port.
struct Operator {
    child: Child,
    admin_port: u16,
}

impl Operator {
    fn start(cp: &ControlPlane, valkey: &ValkeyServer, ns: &str, dir: &Path, n: usize) -> Self {
        let admin_port = free_port();
        let log = std::fs::File::create(dir.join(format!("operator-{ns}-{n}.log"))).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_targetlease"))
            .arg("operator")
            .args(["--admin-addr", &format!("127.0.0.1:{admin_port}")])
            .args(["--valkey-url", &valkey.url()])
            .arg("--lease-id-key-file")
            .arg(dir.join("lease-id-key"))
            .args(["--floor-namespace", ns, "--watch-namespace", ns])
            .env("KUBECONFIG", cp.kubeconfig_path())
            .env("POD_NAME", format!("bench-operator-{n}"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start targetlease operator");
        Operator { child, admin_port }
    }

    async fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if matches!(http_get(self.admin_port, "/readyz"), Some((200, _))) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// (VmHWM, VmRSS) in kB.
    fn rss(&self) -> (u64, u64) {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("VmHWM:"), field("VmRSS:"))
    }

    fn metrics(&self) -> Metrics {
        Metrics::parse(
            &http_get(self.admin_port, "/metrics")
                .map(|(_, b)| b)
                .unwrap_or_default(),
        )
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Prometheus text, as (name, labels) -> value.
struct Metrics(Vec<(String, String, f64)>);

impl Metrics {
    fn parse(text: &str) -> Metrics {
        Metrics(
            text.lines()
                .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
                .filter_map(|l| {
                    let (series, value) = l.rsplit_once(' ')?;
                    let value: f64 = value.parse().ok()?;
                    let (name, labels) = match series.split_once('{') {
                        Some((n, rest)) => (n, rest.trim_end_matches('}')),
                        None => (series, ""),
                    };
                    Some((name.to_string(), labels.to_string(), value))
                })
                .collect(),
        )
    }

    /// Sum of a metric over series whose labels contain every `k="v"` given.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.split(',').any(|p| p == format!("{k}=\"{v}\"")))
            })
            .map(|(_, _, v)| v)
            .sum()
    }
}

/// The apiserver's own request counters.
fn apiserver_metrics(cp: &ControlPlane) -> Metrics {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args(["get", "--raw", "/metrics"])
        .output()
        .expect("kubectl get --raw /metrics");
    Metrics::parse(&String::from_utf8_lossy(&out.stdout))
}

const WRITE_VERBS: [&str; 5] = ["APPLY", "PATCH", "UPDATE", "POST", "DELETE"];

/// TargetLease writes by the operator (status subresource, or all but creates).
fn tl_writes(m: &Metrics, status_only: bool) -> f64 {
    let mut total = 0.0;
    for verb in WRITE_VERBS {
        if verb == "POST" || verb == "DELETE" {
            continue; // the bench's creates and deletes
        }
        if status_only {
            total += m.sum(
                "apiserver_request_total",
                &[
                    ("resource", "targetleases"),
                    ("subresource", "status"),
                    ("verb", verb),
                ],
            );
        } else {
            total += m.sum(
                "apiserver_request_total",
                &[("resource", "targetleases"), ("verb", verb)],
            );
        }
    }
    total
}

fn store_call_means(m: &Metrics) -> Vec<(String, f64, f64)> {
    let mut ops: Vec<String> =
        m.0.iter()
            .filter(|(n, _, _)| n == "targetlease_store_call_duration_seconds_count")
            .filter_map(|(_, l, _)| {
                l.split(',')
                    .find_map(|p| p.strip_prefix("operation=\""))
                    .map(|v| v.trim_end_matches('"').to_string())
            })
            .collect();
    ops.sort();
    ops.dedup();
    ops.into_iter()
        .map(|op| {
            let count = m.sum(
                "targetlease_store_call_duration_seconds_count",
                &[("operation", &op)],
            );
            let sum = m.sum(
                "targetlease_store_call_duration_seconds_sum",
                &[("operation", &op)],
            );
            (op, if count > 0.0 { sum / count * 1e3 } else { 0.0 }, count)
        })
        .collect()
}

fn renews(m: &Metrics) -> f64 {
    m.sum("targetlease_store_calls_total", &[("operation", "renew")])
}

fn holder_lease(name: &str, ns: &str, identity: &str) -> TargetLease {
    serde_json::from_value(json!({
        "apiVersion": "targetlease.dev/v1alpha1",
        "kind": "TargetLease",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "target": name, "holder": { "identity": identity } },
    }))
    .expect("a valid TargetLease")
}

/// Creates `names` (target, object name) with `par` requests in flight; returns
/// the instant the last create returned.
async fn create_all(api: &Api<TargetLease>, objs: Vec<TargetLease>, par: usize) -> Instant {
    let results: Vec<_> = futures::stream::iter(objs)
        .map(|o| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &o).await }
        })
        .buffer_unordered(par)
        .collect()
        .await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    assert_eq!(
        failed,
        0,
        "some creates failed: {:?}",
        results.iter().find(|r| r.is_err())
    );
    Instant::now()
}

/// A client-go-style leader Lease renewed every 2 s (Update of renewTime),
/// the write rate the steady-state figure is compared with.
async fn renew_lease_every_2s(
    client: Client,
    ns: String,
    stop: tokio::sync::watch::Receiver<bool>,
) -> u64 {
    let api: Api<Lease> = Api::namespaced(client, &ns);
    let mut lease: Lease = serde_json::from_value(json!({
        "metadata": { "name": "client-go-style" },
        "spec": { "holderIdentity": "bench", "leaseDurationSeconds": 15 },
    }))
    .unwrap();
    lease = api
        .create(&PostParams::default(), &lease)
        .await
        .expect("create Lease");
    let mut writes = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.tick().await;
    while !*stop.borrow() {
        tick.tick().await;
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        match api
            .replace("client-go-style", &PostParams::default(), &lease)
            .await
        {
            Ok(l) => {
                lease = l;
                writes += 1;
            }
            Err(_) => lease = api.get("client-go-style").await.expect("get Lease"),
        }
    }
    writes
}

async fn candidate_pod(pods: &Api<Pod>, name: &str, app: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": { "app": app } },
        "spec": { "containers": [{ "name": "app", "image": "registry.example/app:1.0" }] },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    // No kubelet: readiness goes through the status subresource.
    let status = json!({ "status": { "conditions": [{ "type": "Ready", "status": "True" }] } });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("set pod Ready");
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
    let mut last: Option<(String, Operator, Tracker)> = None;
    for (k, &n) in p.scales.iter().enumerate() {
        if let Some((_, mut op, _)) = last.take() {
            op.stop(); // one operator at a time: the previous namespace goes quiet
        }
        let ns = cp.namespace(&format!("scale-{n}")).await;
        eprintln!("bench: {n} TargetLeases in {ns}");
        let tracker = Tracker::start(&client, &ns);
        let op = Operator::start(&cp, &valkey, &ns, dir.path(), k);
        assert!(
            op.wait_ready(Duration::from_secs(60)).await,
            "operator not ready"
        );
        let api: Api<TargetLease> = Api::namespaced(client.clone(), &ns);
        let objs: Vec<_> = (0..n)
            .map(|i| holder_lease(&format!("lease-{i:05}"), &ns, &format!("worker-{i}")))
            .collect();
        let before = apiserver_metrics(&cp);
        let first = Instant::now();
        let last_create = create_all(&api, objs, p.create_parallelism).await;
        let timeout = Duration::from_secs(120 + n as u64 / 20);
        let all_held = tracker
            .wait(timeout, |t| t.held_count() >= n)
            .await
            .unwrap_or_else(|| {
                panic!(
                    "only {} of {n} Held after {timeout:?}",
                    tracker.held_count()
                )
            });
        let after = apiserver_metrics(&cp);
        let (hwm, rss) = op.rss();
        let m = op.metrics();
        let reconciles = m.sum("targetlease_reconcile_duration_seconds_count", &[]);
        results.scales.push(Scale {
            leases: n,
            create_secs: (last_create - first).as_secs_f64(),
            last_create_to_all_held_secs: all_held
                .saturating_duration_since(last_create)
                .as_secs_f64(),
            first_create_to_all_held_secs: (all_held - first).as_secs_f64(),
            rss_hwm_kb: hwm,
            rss_kb: rss,
            writes_per_lease_to_held: (tl_writes(&after, false) - tl_writes(&before, false))
                / n as f64,
            store_calls: store_call_means(&m),
            reconcile_mean_ms: m.sum("targetlease_reconcile_duration_seconds_sum", &[]) * 1e3
                / reconciles.max(1.0),
            reconciles,
        });
        last = Some((ns, op, tracker));
    }
    let (ns, mut op, tracker) = last.expect("at least one scale");
    let n = *p.scales.last().unwrap();

    // Steady state: API writes over the window, with a client-go-style Lease beside.
    eprintln!("bench: steady state for {:?}", p.steady);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let before = apiserver_metrics(&cp);
    let renews_before = renews(&op.metrics());
    let start = Instant::now();
    let baseline = tokio::spawn(renew_lease_every_2s(client.clone(), ns.clone(), stop_rx));
    tokio::time::sleep(p.steady).await;
    let after = apiserver_metrics(&cp);
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

    // Restart: kill -9, start again, count new tokens and status writes.
    eprintln!("bench: operator restart with {n} leases");
    let store = ValkeyStore::connect(&ValkeyConfig {
        url: valkey.url(),
        ..ValkeyConfig::default()
    })
    .await
    .expect("connect to the bench valkey");
    let valkey_tokens = |names: Vec<String>| {
        let (store, ns) = (&store, &ns);
        async move {
            let mut out = HashMap::new();
            for name in names {
                let t = Target::new(ns.as_str(), name.as_str());
                let token = store
                    .get(&t)
                    .await
                    .ok()
                    .and_then(|r| r.lease)
                    .map(|l| l.fencing_token);
                out.insert(name, token);
            }
            out
        }
    };
    // Leases whose status is not due for republishing during the restart
    // (leaseDuration 1h): any write to them is re-adoption cost. The default
    // leases keep their 60 s republish schedule across the restart.
    let quiet_n = n / 10;
    let quiet: Vec<TargetLease> = (0..quiet_n)
        .map(|i| {
            serde_json::from_value(json!({
                "apiVersion": "targetlease.dev/v1alpha1",
                "kind": "TargetLease",
                "metadata": { "name": format!("quiet-{i:05}"), "namespace": ns },
                "spec": { "target": format!("quiet-{i:05}"), "holder": { "identity": "q" },
                          "leaseDuration": "1h", "renewInterval": "30s" },
            }))
            .expect("a valid TargetLease")
        })
        .collect();
    let api: Api<TargetLease> = Api::namespaced(client.clone(), &ns);
    create_all(&api, quiet, p.create_parallelism).await;
    tracker
        .wait(Duration::from_secs(120), |t| t.held_count() >= n + quiet_n)
        .await
        .expect("the 1h leases Held");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen_before = tracker.snapshot();
    let names: Vec<String> = seen_before.keys().cloned().collect();
    let tokens_before = valkey_tokens(names.clone()).await;
    op.kill();
    let changes_before = tracker.changes();
    let api_before = apiserver_metrics(&cp);
    let restarted = Instant::now();
    let op2 = Operator::start(&cp, &valkey, &ns, dir.path(), 99);
    assert!(
        op2.wait_ready(Duration::from_secs(60)).await,
        "restarted operator not ready"
    );
    let ready_secs = restarted.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut all_renewed = None;
    while Instant::now() < deadline {
        if renews(&op2.metrics()) >= (n + quiet_n) as f64 {
            all_renewed = Some(restarted.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let api_after = apiserver_metrics(&cp);
    let tokens_after = valkey_tokens(names).await;
    let seen_after = tracker.snapshot();
    results.restart = Some(Restart {
        leases: n + quiet_n,
        new_tokens: tokens_before
            .iter()
            .filter(|(k, v)| tokens_after.get(*k) != Some(v))
            .count(),
        tokens_changed_in_status: seen_before
            .iter()
            .filter(|(k, v)| seen_after.get(*k).map(|s| s.token) != Some(v.token))
            .count(),
        tl_writes: tl_writes(&api_after, false) - tl_writes(&api_before, false),
        tl_objects_changed: tracker.changes() - changes_before,
        quiet_leases: quiet_n,
        quiet_changed: seen_before
            .iter()
            .filter(|(k, v)| {
                k.starts_with("quiet-")
                    && seen_after.get(*k).map(|s| &s.resource_version) != Some(&v.resource_version)
            })
            .count(),
        ready_secs,
        all_renewed_secs: all_renewed,
        renews: renews(&op2.metrics()),
    });
    let _op2 = op2;

    // Handoff: two TargetLeases per target; delete the holder, time the next Held.
    eprintln!("bench: handoff, {} trials", p.handoff_trials);
    results.handoff_background = n;
    let api: Api<TargetLease> = Api::namespaced(client.clone(), &ns);
    let firsts: Vec<_> = (0..p.handoff_trials)
        .map(|i| {
            contended(
                &format!("handoff-{i:03}-a"),
                &ns,
                &format!("handoff-{i:03}"),
                "a",
            )
        })
        .collect();
    create_all(&api, firsts, 16).await;
    let trials = p.handoff_trials;
    tracker
        .wait(Duration::from_secs(60), |t| {
            (0..trials).all(|i| {
                t.get(&format!("handoff-{i:03}-a"))
                    .is_some_and(|s| s.held())
            })
        })
        .await
        .expect("handoff holders Held");
    let seconds: Vec<_> = (0..p.handoff_trials)
        .map(|i| {
            contended(
                &format!("handoff-{i:03}-b"),
                &ns,
                &format!("handoff-{i:03}"),
                "b",
            )
        })
        .collect();
    create_all(&api, seconds, 16).await;
    tracker
        .wait(Duration::from_secs(60), |t| {
            (0..trials).all(|i| {
                t.get(&format!("handoff-{i:03}-b"))
                    .is_some_and(|s| s.phase == Some(targetlease::crd::Phase::Pending))
            })
        })
        .await
        .expect("handoff waiters Pending");
    for i in 0..p.handoff_trials {
        let (a, b) = (format!("handoff-{i:03}-a"), format!("handoff-{i:03}-b"));
        let t0 = Instant::now();
        api.delete(&a, &DeleteParams::default())
            .await
            .expect("delete holder");
        match tracker
            .wait(Duration::from_secs(10), |t| {
                t.get(&b).is_some_and(|s| s.held())
            })
            .await
        {
            Some(t1) => results.handoff.push(t1 - t0),
            None => results.handoff_failures += 1,
        }
        if results.handoff_failures >= 3 {
            eprintln!("bench: handoff: 3 trials timed out, stopping the series");
            break;
        }
    }

    // Leader failover: delete the elected pod, time the new leader.
    eprintln!("bench: leader failover, {} trials", p.failover_trials);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for i in 0..p.failover_trials {
        let app = format!("fo-{i:03}");
        candidate_pod(&pods, &format!("{app}-0"), &app).await;
        candidate_pod(&pods, &format!("{app}-1"), &app).await;
        let tl: TargetLease = serde_json::from_value(json!({
            "apiVersion": "targetlease.dev/v1alpha1",
            "kind": "TargetLease",
            "metadata": { "name": app, "namespace": ns },
            "spec": { "target": app, "candidates": { "podSelector": { "matchLabels": { "app": app } } } },
        }))
        .unwrap();
        api.create(&PostParams::default(), &tl)
            .await
            .expect("create election lease");
    }
    let ft = p.failover_trials;
    tracker
        .wait(Duration::from_secs(60), |t| {
            (0..ft).all(|i| {
                let app = format!("fo-{i:03}");
                t.get(&app)
                    .filter(|s| s.held())
                    .and_then(|s| s.holder)
                    .is_some_and(|h| t.is_leader(&h))
            })
        })
        .await
        .expect("every election Held and its leader marked");
    for i in 0..p.failover_trials {
        let app = format!("fo-{i:03}");
        let leader = tracker.get(&app).and_then(|s| s.holder).expect("a leader");
        let other = if leader.ends_with("-0") {
            format!("{app}-1")
        } else {
            format!("{app}-0")
        };
        let t0 = Instant::now();
        pods.delete(&leader, &DeleteParams::default().grace_period(0))
            .await
            .expect("delete the leader pod");
        let moved = tracker
            .wait(Duration::from_secs(30), |t| {
                t.get(&app)
                    .is_some_and(|s| s.held() && s.holder.as_deref() == Some(other.as_str()))
            })
            .await;
        let marked = tracker
            .wait(Duration::from_secs(30), |t| t.is_leader(&other))
            .await;
        match (moved, marked) {
            (Some(a), Some(b)) => {
                results.failover_status.push(a - t0);
                results.failover_marked.push(b - t0);
            }
            _ => results.failover_failures += 1,
        }
        if results.failover_failures >= 3 {
            eprintln!("bench: failover: 3 trials timed out, stopping the series");
            break;
        }
    }
    drop(cp);
    results
}

fn contended(name: &str, ns: &str, target: &str, identity: &str) -> TargetLease {
    serde_json::from_value(json!({
        "apiVersion": "targetlease.dev/v1alpha1",
        "kind": "TargetLease",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "target": target, "holder": { "identity": identity } },
    }))
    .expect("a valid TargetLease")
}
