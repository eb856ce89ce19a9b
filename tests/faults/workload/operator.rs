//! The operator workload: the real `targetlease operator` (one replica, or
//! two with leader election) on the test kube-apiserver, running
//! - three TargetLeases queued on one target, the Held one deleted and
//!   recreated every cycle (handoffs, each with a larger token), and
//! - an election among three pods whose leader is made NotReady every cycle
//!   (and Ready again the next), so leadership moves;
//!
//! while watches record every status and pod-mark version, the lease
//! clients run against the operator's Valkey, and the control plane or the
//! operator is hit by the scenario's fault.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use targetlease::operator::crd::{Phase, TargetLease};
use targetlease::store::valkey::Durability;
use targetlease::store::{LeaseStore, Target};
use tokio::task::JoinHandle;

use super::watch::{self, Holders};
use super::{Stop, revoker};
use crate::control_plane;
use crate::controls::Control;
use crate::history::Recorder;
use crate::inject::Pace;
use crate::run::{self, Primary, RunResult};
use crate::scenarios::{Backend, Fault, Scenario};
use crate::sink::PgSink;
use crate::support::operator_env::{OperatorEnv, http_get};

const HANDOFF: [&str; 3] = ["h0", "h1", "h2"];
const HANDOFF_TARGET: &str = "op-h";
const ELECTION: &str = "el";
const ELECTION_TARGET: &str = "op-el";
const PODS: [&str; 3] = ["el-0", "el-1", "el-2"];
/// A long lease the administrator revokes every few seconds: its holder
/// must withdraw Held as soon as the store says the lease ended.
const REVOKED: &str = "rv";
const REVOKED_TARGET: &str = "op-rv";
const REVOKE_EVERY: Duration = Duration::from_secs(3);
/// The only TargetLease of its target, deleted while the operator runs and
/// created again after Valkey lost everything: only the token floor keeps
/// its next token above the last one published.
const FLOORED: &str = "fl";
const FLOORED_TARGET: &str = "op-fl";
/// Leadership lease of the operator replicas (the pause outlasts it).
const LEADERSHIP: Duration = Duration::from_secs(4);

fn handoff_spec(name: &str) -> serde_json::Value {
    json!({ "target": HANDOFF_TARGET, "holder": { "identity": name },
            "leaseDuration": "3s", "renewInterval": "1s" })
}

fn floored_spec() -> serde_json::Value {
    json!({ "target": FLOORED_TARGET, "holder": { "identity": FLOORED },
            "leaseDuration": "3s", "renewInterval": "1s" })
}

fn lease(ns: &str, name: &str, spec: serde_json::Value) -> TargetLease {
    serde_json::from_value(json!({
        "apiVersion": "targetlease.dev/v1alpha1", "kind": "TargetLease",
        "metadata": { "name": name, "namespace": ns }, "spec": spec,
    }))
    .expect("a valid TargetLease")
}

async fn set_ready(pods: &Api<Pod>, name: &str, ready: bool) {
    let status = json!({ "status": { "conditions": [
        { "type": "Ready", "status": if ready { "True" } else { "False" } }] } });
    let _ = pods
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await;
}

fn phase(tl: &TargetLease) -> Option<Phase> {
    tl.status.as_ref().and_then(|s| s.phase)
}

/// Handoffs and readiness flips, every 1.5 s; API errors (an apiserver
/// restart) are ignored and the step is tried again next cycle.
async fn drive(ns: String, tls: Api<TargetLease>, pods: Api<Pod>, stop: Stop) {
    let mut deleted: Vec<String> = Vec::new();
    let mut unready: Vec<String> = Vec::new();
    while !stop.sleep(Duration::from_millis(1500)).await {
        let mut still = Vec::new();
        for name in deleted.drain(..) {
            let tl = lease(&ns, &name, handoff_spec(&name));
            if tls.create(&PostParams::default(), &tl).await.is_err() {
                still.push(name); // not gone yet
            }
        }
        deleted = still;
        if let Ok(list) = tls.list(&ListParams::default()).await {
            for tl in list.items {
                let name = tl.metadata.name.clone().unwrap_or_default();
                if HANDOFF.contains(&name.as_str())
                    && phase(&tl) == Some(Phase::Held)
                    && tls.delete(&name, &DeleteParams::default()).await.is_ok()
                {
                    deleted.push(name.clone());
                }
                if name == ELECTION
                    && let Some(pod) = tl.status.and_then(|s| s.holder_pod)
                {
                    for p in unready.drain(..) {
                        set_ready(&pods, &p, true).await;
                    }
                    set_ready(&pods, &pod, false).await;
                    unready.push(pod);
                }
            }
        }
    }
}

/// Control (d): a second writer marks a waiting TargetLease Held, as a
/// broken operator would, while another is Held.
async fn rogue(tls: Api<TargetLease>, stop: Stop) {
    let mut n = 0;
    while !stop.sleep(Duration::from_secs(2)).await {
        let Ok(list) = tls.list(&ListParams::default()).await else {
            continue;
        };
        let held = list.items.iter().any(|t| phase(t) == Some(Phase::Held));
        let Some(victim) = list.items.iter().find(|t| {
            HANDOFF.contains(&t.metadata.name.as_deref().unwrap_or_default())
                && phase(t) == Some(Phase::Pending)
        }) else {
            continue;
        };
        if !held {
            continue;
        }
        n += 1;
        let now = k8s_openapi::jiff::Timestamp::now();
        let later = now + k8s_openapi::jiff::SignedDuration::from_secs(30);
        let status = json!({ "status": {
            "phase": "Held", "fencingToken": 1_000_000 + n, "acquisitionId": format!("rogue-{n}"),
            "acquiredAt": now.to_string(), "expiresAt": later.to_string() } });
        let name = victim.metadata.name.clone().unwrap_or_default();
        let _ = tls
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await;
    }
}

fn operator_flags(ns: &str, replicas: usize) -> Vec<String> {
    if replicas < 2 {
        return Vec::new();
    }
    vec![
        "--leader-election".into(),
        "--leader-election-namespace".into(),
        ns.into(),
        "--leader-election-duration".into(),
        format!("{}s", LEADERSHIP.as_secs()),
        "--leader-election-renew-deadline".into(),
        format!("{}s", LEADERSHIP.as_secs() - 1),
        "--leader-election-retry-period".into(),
        "1s".into(),
    ]
}

/// The operator replica that reports itself leader in its metrics.
fn leader(env: &OperatorEnv, live: &[usize]) -> Option<usize> {
    live.iter().copied().find(|i| {
        http_get(env.admin_port(*i), "/metrics")
            .is_some_and(|(_, m)| m.lines().any(|l| l == "targetlease_leader 1"))
    })
}

async fn blocking<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    tokio::task::spawn_blocking(f).await.expect("fault step")
}

/// Waits up to `within` for `name` to be Held with a token; the token.
async fn held_token(tls: &Api<TargetLease>, name: &str, within: Duration) -> Option<u64> {
    let end = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < end {
        if let Ok(tl) = tls.get(name).await
            && phase(&tl) == Some(Phase::Held)
            && let Some(t) = tl.status.and_then(|s| s.fencing_token)
        {
            return Some(t);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Waits up to `within` for `name` to be gone (its finalizer done).
async fn gone(tls: &Api<TargetLease>, name: &str, within: Duration) -> bool {
    let end = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < end {
        if matches!(tls.get_opt(name).await, Ok(None)) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// Injects an operator or control-plane fault until `stop`.
/// `live` are the indexes of the running operator processes.
async fn inject(
    fault: Fault,
    mut env: OperatorEnv,
    url: String,
    mut live: Vec<usize>,
    flags: Vec<String>,
    rec: Recorder,
    mut pace: Pace,
) -> OperatorEnv {
    let dir = env.cp.dir().to_path_buf();
    let flags_ref: Vec<&str> = flags.iter().map(String::as_str).collect();
    let tls = env.api();
    loop {
        if pace.wait(Duration::from_secs(2)).await {
            break;
        }
        match fault {
            Fault::None => {}
            Fault::OperatorKill => {
                rec.fault("operator SIGKILL");
                env.kill_operator(live[0]);
                live[0] = env.start_operator_on(&url, &flags_ref);
                rec.healed();
                rec.effect("operators killed and started again", 1);
            }
            Fault::OperatorPause => {
                let Some(i) = leader(&env, &live) else {
                    continue;
                };
                rec.fault("leading operator SIGSTOP");
                env.pause_operator(i, true);
                tokio::time::sleep(LEADERSHIP + Duration::from_secs(2)).await;
                env.pause_operator(i, false);
                rec.healed();
                rec.effect("leading operators paused past their leadership", 1);
            }
            Fault::ApiserverRestart => {
                rec.fault("kube-apiserver restart");
                let d = dir.clone();
                let pid = std::fs::read_to_string(dir.join("kube-apiserver.pid")).ok();
                blocking(move || control_plane::restart_apiserver(&d)).await;
                rec.healed();
                if std::fs::read_to_string(dir.join("kube-apiserver.pid")).ok() != pid {
                    rec.effect("kube-apiserver restarted (a new process)", 1);
                }
            }
            Fault::EtcdCompaction => {
                rec.fault("etcd compaction past every watch, kube-apiserver restart");
                let d = dir.clone();
                blocking(move || control_plane::restart_apiserver_past_compaction(&d)).await;
                rec.healed();
            }
            Fault::ValkeyLossOperatorDown => {
                // The floored lease publishes a token, is deleted (the floor
                // covers the token) and is gone; then the operator dies, Valkey
                // forgets everything, and a new operator acquires it again.
                let Some(token) = held_token(&tls, FLOORED, Duration::from_secs(8)).await else {
                    continue;
                };
                let _ = tls.delete(FLOORED, &DeleteParams::default()).await;
                if !gone(&tls, FLOORED, Duration::from_secs(10)).await {
                    continue;
                }
                rec.lossy_fault(
                    "operator SIGKILL, Valkey FLUSHALL while it is down, operator started",
                );
                env.kill_operator(live[0]);
                let addr = env.valkey.addr();
                let flushed = blocking(move || {
                    crate::support::resp::Conn::connect(&addr)
                        .ok()?
                        .try_cmd(&["FLUSHALL"])
                        .ok()
                })
                .await;
                live[0] = env.start_operator_on(&url, &flags_ref);
                let tl = lease(&env.ns, FLOORED, floored_spec());
                let _ = tls.create(&PostParams::default(), &tl).await;
                rec.healed();
                if flushed == Some(crate::support::resp::Resp::Simple("OK".into())) {
                    rec.effect("Valkey flushed while the operator was down", 1);
                }
                rec.effect("highest token the floor had to keep", token);
            }
            other => panic!("fault {other:?} needs a Valkey backend"),
        }
    }
    env
}

pub async fn run(s: &Scenario, secs: u64, sink: PgSink, started: Instant) -> RunResult {
    let Some(replicas) = s.backend.operator() else {
        unreachable!("an operator scenario")
    };
    let mut env = OperatorEnv::start_without_operator("faults").await;
    // On etcd: its own cluster, the store of the operator and the clients.
    let etcd = match s.backend {
        Backend::EtcdOperator { .. } => Some(Arc::new(
            blocking(|| crate::etcd::Etcd::start(crate::etcd::Setup::Direct)).await,
        )),
        _ => None,
    };
    let url = etcd.as_ref().map_or_else(|| env.valkey.url(), |e| e.url());
    env.operator_env = run::failpoint_env(s);
    env.binary = crate::config::get().product_bin.clone();
    let flags = operator_flags(&env.ns, replicas);
    let flags_ref: Vec<&str> = flags.iter().map(String::as_str).collect();
    for _ in 0..replicas {
        env.start_operator_on(&url, &flags_ref);
    }
    let (tls, pods) = (env.api(), env.pods());
    for p in PODS {
        let opt_in = format!("{ELECTION}.targetlease.dev/candidate");
        env.create_pod(p, &[("app", "el"), (&opt_in, "true")], true)
            .await;
    }
    for name in HANDOFF {
        env.create(name, handoff_spec(name)).await;
    }
    env.create(
        REVOKED,
        json!({ "target": REVOKED_TARGET, "holder": { "identity": REVOKED },
                "leaseDuration": "20s", "renewInterval": "1s" }),
    )
    .await;
    if s.fault == Fault::ValkeyLossOperatorDown {
        env.create(FLOORED, floored_spec()).await;
    }
    env.create(
        ELECTION,
        json!({ "target": ELECTION_TARGET,
                "candidates": { "podSelector": { "matchLabels": { "app": "el" } } },
                "leaseDuration": "3s", "renewInterval": "1s" }),
    )
    .await;

    let rec = Recorder::dated(s.backend.dating());
    let stop = Stop::default();
    let holders = Holders::new(sink.writer("holders").await, rec.clone());
    let urls = run::Urls {
        clients: url.clone(),
        observer: url.clone(),
    };
    let observed: Vec<Target> = [
        HANDOFF_TARGET,
        ELECTION_TARGET,
        REVOKED_TARGET,
        FLOORED_TARGET,
    ]
    .iter()
    .map(|t| Target::new(env.ns.clone(), *t))
    .collect();
    let mut tasks: Vec<JoinHandle<()>> =
        run::clients(&urls, s, &sink, &rec, &stop, &observed, None).await;
    let admin: Arc<dyn LeaseStore> = match etcd {
        Some(_) => run::connect(&url, Durability::None).await,
        None => Arc::new(env.store().await),
    };
    tasks.push(tokio::spawn(revoker::run(
        admin,
        vec![Target::new(env.ns.clone(), REVOKED_TARGET)],
        REVOKE_EVERY,
        rec.clone(),
        stop.clone(),
    )));
    let (r, h, st) = (rec.clone(), holders.clone(), stop.clone());
    let lease_watch = tokio::spawn(watch::leases(tls.clone(), r, h, st));
    let (r, st) = (rec.clone(), stop.clone());
    let pod_watch = tokio::spawn(watch::pods(
        pods.clone(),
        r,
        holders.clone(),
        ELECTION_TARGET.into(),
        st,
    ));
    tasks.push(tokio::spawn(drive(
        env.ns.clone(),
        tls.clone(),
        pods,
        stop.clone(),
    )));
    if s.control == Some(Control::RoguePublisher) {
        tasks.push(tokio::spawn(rogue(tls, stop.clone())));
    }
    let live = (0..replicas).collect();
    let faults = Stop::default();
    let fault = tokio::spawn(inject(
        s.fault,
        env,
        url.clone(),
        live,
        flags,
        rec.clone(),
        Pace::new(faults.clone(), s.quiet()),
    ));

    tokio::time::sleep(Duration::from_secs(secs)).await;
    faults.set();
    let env = fault.await.expect("fault task");
    // Longer than the recovery bound: the last fault is always judged.
    tokio::time::sleep(s.quiet()).await;
    rec.stopped();
    stop.set();
    let relists = lease_watch.await.unwrap_or(0) + pod_watch.await.unwrap_or(0);
    rec.set_relists(relists);
    holders.settle().await;
    let valkey_addr = env.valkey.addr();
    let primary: Primary = Arc::new(move |args: &[&str]| {
        crate::support::resp::Conn::connect(&valkey_addr)
            .ok()?
            .try_cmd(args)
            .ok()
    });
    let finals = match etcd {
        Some(_) => run::Finals::Store(url),
        None => run::Finals::Valkey { primary, url },
    };
    let result = run::finish(tasks, &sink, finals, &rec, started).await;
    drop(env);
    drop(etcd);
    result
}
