//! The invariants of what the operator publishes (docs/operator.md), each
//! tried against what would break it — lost replies, partitions, refused
//! connections, clock skew, floods, pauses, other tenants — on a real
//! kube-apiserver and a real Valkey. Each test is named after the promise it
//! tries to break; a failing test is a broken promise.
//!
//! Faults between the operator and Valkey go through `support::tcp_proxy`
//! (lost replies, partitions, refused connections) while outside holders talk
//! to Valkey directly, as they would in production. Publish-order checks
//! replay pods and TargetLeases in the API server's revision order
//! (`support::timeline`).

mod clock;
mod expiry;
mod flood;
mod lifetime;
mod order;
mod pauses;
mod tenants;
mod wakeups;

pub(crate) use crate::support;
pub(crate) use crate::support::spec::lease_for;

pub(crate) use std::path::PathBuf;
pub(crate) use std::process::{Child, Command, Stdio};
pub(crate) use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) use kube::ResourceExt;
pub(crate) use kube::api::{ListParams, Patch, PatchParams};
pub(crate) use serde_json::json;
pub(crate) use support::kube_env::eventually;
pub(crate) use support::operator_env::{OperatorEnv, summary};
pub(crate) use support::tcp_proxy::{Mode, TcpProxy};
pub(crate) use support::timeline::Timeline;
pub(crate) use targetlease::operator::crd::{Phase, TargetLease};
pub(crate) use targetlease::store::{
    AcquireRequest, LeaseStore, Outcome, ReleaseRequest, Reply, Target,
};

pub(crate) const SOON: Duration = Duration::from_secs(20);

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

pub(crate) fn ms(t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Option<i64> {
    t.as_ref().map(|t| t.0.as_millisecond())
}

pub(crate) fn status_line(tl: &TargetLease) -> String {
    let s = tl.status.clone().unwrap_or_default();
    let held = s
        .conditions
        .iter()
        .find(|c| c.type_ == "Held")
        .map(|c| c.reason.clone());
    format!(
        "phase={:?} holder={:?} token={:?} expiresAt={:?} observedGeneration={:?} reason={held:?}",
        s.phase,
        s.holder,
        s.fencing_token,
        ms(&s.expires_at),
        s.observed_generation
    )
}

/// Sleeps until the wall clock reaches `at_ms` (Unix ms).
pub(crate) async fn sleep_until_ms(at_ms: i64) {
    let left = at_ms - now_ms();
    if left > 0 {
        tokio::time::sleep(Duration::from_millis(left as u64)).await;
    }
}

/// The last `n` lines of a log, for failure messages.
pub(crate) fn tail(log: &str, n: usize) -> String {
    let lines: Vec<_> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// An operator process talking to Valkey through `valkey_url` (e.g. a proxy),
/// otherwise configured exactly like `OperatorEnv::start_operator`.
pub(crate) struct Op {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Op {
    fn start(env: &OperatorEnv, valkey_url: &str, tag: &str) -> Op {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join(format!("{tag}.log"));
        let admin_port = support::valkey_server::free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_targetlease"))
            .arg("operator")
            .args(["--admin-addr", &format!("127.0.0.1:{admin_port}")])
            .env("POD_NAME", tag)
            .args(["--valkey-url", valkey_url])
            .arg("--lease-id-key-file")
            .arg(env.key_file())
            .args(["--floor-namespace", &env.ns, "--watch-namespace", &env.ns])
            .env("KUBECONFIG", env.cp.kubeconfig_path())
            .env("RUST_LOG", "targetlease=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start targetlease operator");
        Op {
            child,
            log,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Ready pod `w` and TargetLease `name` holding target `t` for it (identity
/// `w`) with these lease and renew durations: the TargetLease once Held.
pub(crate) async fn held_for_pod_w(
    env: &OperatorEnv,
    name: &str,
    lease: &str,
    renew: &str,
) -> TargetLease {
    let opt_in = format!("{name}.targetlease.dev/candidate");
    env.create_pod("w", &[("app", "w"), (&opt_in, "true")], true)
        .await;
    let spec = lease_for("t")
        .identity("w")
        .pod("w")
        .durations(lease, renew);
    env.create(name, spec).await;
    env.wait_phase(name, Phase::Held, SOON).await
}

/// Waits until pod `w` carries TargetLease `name`'s leader mark.
pub(crate) async fn wait_w_marked(env: &OperatorEnv, name: &str) {
    eventually("w marked", SOON, || async {
        env.marks("w", name).await.0.map(|_| ())
    })
    .await;
}

/// Acquires `target` for an outside holder as soon as Valkey lets it go.
pub(crate) async fn outside_acquire(
    store: &impl LeaseStore,
    target: &Target,
    owner: &str,
    within: Duration,
) -> Option<Reply> {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        let req = AcquireRequest::new(target.clone(), owner, Duration::from_secs(30));
        if let Ok(r) = store.acquire(&req).await
            && r.outcome == Outcome::Acquired
        {
            return Some(r);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
