//! The CLI as a [`LeaseStore`]: every call runs `targetlease lease …` (the
//! real binary, a fresh process and connection each time) and turns its JSON
//! envelope back into a reply, so the same client loop drives the library
//! and the CLI.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use targetlease::store::valkey::Durability;

use crate::history::Recorder;
use targetlease::store::{
    AcquireRequest, CommitRequest, Health, Lease, LeaseStore, Listed, Outcome, ReadReply,
    ReleaseRequest, RenewRequest, Reply, RevokeRequest, StoreError, Target,
};

/// A CLI process still running this long after its start is a hang (its
/// own deadlines are 500 ms): it is killed and the hang recorded.
const CLI_HANG: Duration = Duration::from_secs(6);

/// Runs the `targetlease` binary against one Valkey URL.
pub struct CliStore {
    pub url: String,
    pub timeout: Duration,
    pub durability: Durability,
    /// Where hangs are noted.
    pub rec: Recorder,
    /// More environment for every CLI process (the scenario's fail points).
    pub env: Vec<(String, String)>,
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

fn target_args(t: &Target) -> Vec<String> {
    vec![
        "--target".into(),
        t.name.clone(),
        "--namespace".into(),
        t.namespace.clone(),
    ]
}

fn handle_args(h: &targetlease::store::LeaseHandle) -> Vec<String> {
    vec![
        "--owner".into(),
        h.owner.clone(),
        "--lease-id".into(),
        h.lease_id.clone(),
        "--token".into(),
        h.token.to_string(),
    ]
}

fn lease_of(v: &Value) -> Option<Lease> {
    let n = |k: &str| v.get(k).and_then(Value::as_u64);
    Some(Lease {
        target: v.get("target")?.as_str()?.to_string(),
        lease_id: v.get("lease_id").and_then(Value::as_str).map(String::from),
        owner: v.get("owner")?.as_str()?.to_string(),
        fencing_token: n("fencing_token")?,
        acquired_at_ms: n("acquired_at_ms")?,
        expires_at_ms: n("expires_at_ms")?,
        max_expires_at_ms: n("max_expires_at_ms"),
        metadata: v.get("metadata").and_then(Value::as_object).cloned(),
    })
}

/// The envelope as the store's result type.
fn parse(stdout: &str, write: bool) -> Result<Reply, StoreError> {
    let Ok(v) = serde_json::from_str::<Value>(stdout.trim()) else {
        // No envelope: the process died or printed nothing usable.
        let msg = format!("no envelope from the CLI: {stdout:?}");
        return Err(if write {
            StoreError::OutcomeUnknown(msg)
        } else {
            StoreError::BackendUnavailable(msg)
        });
    };
    let outcome = v.get("outcome").and_then(Value::as_str).unwrap_or("");
    let message = v
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    match outcome {
        "backend_unavailable" => Err(StoreError::BackendUnavailable(message)),
        "outcome_unknown" => Err(StoreError::OutcomeUnknown(message)),
        name => match Outcome::parse(name) {
            Some(outcome) => Ok(Reply {
                outcome,
                lease: v.get("lease").and_then(lease_of),
                server_time_ms: v.get("server_time_ms").and_then(Value::as_u64).unwrap_or(0),
                message,
            }),
            None => Err(StoreError::Invalid(format!("unknown outcome {name:?}"))),
        },
    }
}

impl CliStore {
    async fn run(&self, op: &str, args: Vec<String>, write: bool) -> Result<Reply, StoreError> {
        let child = tokio::process::Command::new(&crate::config::get().product_bin)
            .args(["lease", op])
            .args(args)
            .args(["--valkey-url", &self.url, "--timeout", &ms(self.timeout)])
            .args(["--connect-timeout", &ms(self.timeout)])
            .args(["--durability", &self.durability.to_string()])
            .env("RUST_LOG", "targetlease=debug")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| StoreError::BackendUnavailable(format!("cannot run the CLI: {e}")))?;
        let mut child = child;
        let pid = child.id().unwrap_or(0);
        let stdout = tokio::spawn(read_all(child.stdout.take()));
        let stderr = tokio::spawn(read_all(child.stderr.take()));
        let Ok(status) = tokio::time::timeout(CLI_HANG, child.wait()).await else {
            // The process outlived its own deadlines by far: say what it was doing.
            let threads = tokio::task::spawn_blocking(move || thread_states(pid))
                .await
                .unwrap_or_default();
            let _ = child.kill().await;
            let log = stderr.await.unwrap_or_default();
            let tail = &log[log.len().saturating_sub(1500)..];
            let printed = stdout.await.unwrap_or_default();
            self.rec.hang(format!(
                "CLI `lease {op}` (pid {pid}) still running after {CLI_HANG:?} with \
                 --timeout {0} --connect-timeout {0}; threads: {threads}; \
                 stdout so far: {printed:?}; its log: {tail:?}",
                ms(self.timeout)
            ));
            return Err(StoreError::OutcomeUnknown("harness: the CLI hung".into()));
        };
        let status = status
            .map_err(|e| StoreError::BackendUnavailable(format!("CLI failed to run: {e}")))?;
        let stdout = stdout.await.unwrap_or_default();
        if status.code() == Some(2) {
            return Err(StoreError::Invalid(stderr.await.unwrap_or_default()));
        }
        parse(&stdout, write)
    }
}

/// Name and kernel wait channel of every thread of `pid` (what a hang waits
/// on), and, with `FAULTS_GDB` set, the frames of ours and of the client
/// library in every thread's backtrace (gdb stops the process for seconds).
fn thread_states(pid: u32) -> String {
    let bt = if crate::config::get().gdb {
        std::process::Command::new("gdb")
            .args([
                "-p",
                &pid.to_string(),
                "-batch",
                "-ex",
                "thread apply all bt",
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    } else {
        String::new()
    };
    let frames: Vec<&str> = bt
        .lines()
        .filter(|l| l.starts_with("Thread") || l.contains("targetlease::") || l.contains("fred::"))
        .collect();
    let dir = format!("/proc/{pid}/task");
    let mut out = Vec::new();
    for t in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let p = t.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        out.push(format!("{}:{}", read("comm").trim(), read("wchan").trim()));
    }
    format!("{}\n{}", out.join(", "), frames.join("\n"))
}

/// Everything a pipe yields until it closes (lossy UTF-8).
async fn read_all(pipe: Option<impl tokio::io::AsyncRead + Unpin>) -> String {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    if let Some(mut p) = pipe {
        let _ = p.read_to_end(&mut buf).await;
    }
    String::from_utf8_lossy(&buf).into_owned()
}

#[async_trait]
impl LeaseStore for CliStore {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Reply, StoreError> {
        let mut args = target_args(&req.target);
        args.extend([
            "--owner".into(),
            req.owner.clone(),
            "--ttl".into(),
            ms(req.ttl),
            "--request-id".into(),
            req.request_id.clone(),
        ]);
        if let Some(m) = &req.metadata {
            args.extend(["--metadata".into(), Value::Object(m.clone()).to_string()]);
        }
        self.run("acquire", args, true).await
    }

    async fn renew(&self, req: &RenewRequest) -> Result<Reply, StoreError> {
        let mut args = target_args(&req.target);
        args.extend(handle_args(&req.handle));
        args.extend([
            "--ttl".into(),
            ms(req.ttl),
            "--request-id".into(),
            req.request_id.clone(),
        ]);
        self.run("renew", args, true).await
    }

    async fn release(&self, req: &ReleaseRequest) -> Result<Reply, StoreError> {
        let mut args = target_args(&req.target);
        args.extend(handle_args(&req.handle));
        args.extend(["--request-id".into(), req.request_id.clone()]);
        self.run("release", args, true).await
    }

    async fn get(&self, target: &Target) -> Result<Reply, StoreError> {
        self.run("get", target_args(target), false).await
    }

    async fn revoke(&self, _req: &RevokeRequest) -> Result<Reply, StoreError> {
        Err(StoreError::Invalid("the workload never revokes".into()))
    }

    async fn commit(&self, req: &CommitRequest) -> Result<Reply, StoreError> {
        let mut args = target_args(&req.target);
        args.extend([
            "--token".into(),
            req.token.to_string(),
            "--key".into(),
            req.key.clone(),
            "--value".into(),
            req.value.clone(),
            "--request-id".into(),
            req.request_id.clone(),
        ]);
        self.run("commit", args, true).await
    }

    async fn read(&self, _target: &Target, _key: &str) -> Result<ReadReply, StoreError> {
        Err(StoreError::Invalid(
            "the workload never reads commits back".into(),
        ))
    }

    async fn list(
        &self,
        _namespace: Option<&str>,
        _target_prefix: &str,
    ) -> Result<Vec<Listed>, StoreError> {
        Err(StoreError::Invalid("the workload never lists".into()))
    }

    async fn health(&self) -> Result<Health, StoreError> {
        Err(StoreError::Invalid("the workload never probes".into()))
    }
}
