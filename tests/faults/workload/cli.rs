//! The CLI as a [`LeaseStore`]: every call runs `targetlease lease …` (the
//! real binary, a fresh process and connection each time) and turns its JSON
//! envelope back into a reply, so the same client loop drives the library
//! and the CLI.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use targetlease::store::valkey::Durability;
use targetlease::store::{
    AcquireRequest, CommitRequest, Health, Lease, LeaseStore, Outcome, ReleaseRequest,
    RenewRequest, Reply, RevokeRequest, StoreError, Target,
};

/// Runs the `targetlease` binary against one Valkey URL.
pub struct CliStore {
    pub url: String,
    pub timeout: Duration,
    pub durability: Durability,
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

fn holder_args(h: &targetlease::store::Holder) -> Vec<String> {
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
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_targetlease"))
            .args(["lease", op])
            .args(args)
            .args(["--valkey-url", &self.url, "--timeout", &ms(self.timeout)])
            .args(["--connect-timeout", &ms(self.timeout)])
            .args(["--durability", &self.durability.to_string()])
            .env("RUST_LOG", "off")
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| StoreError::BackendUnavailable(format!("cannot run the CLI: {e}")))?;
        if out.status.code() == Some(2) {
            return Err(StoreError::Invalid(
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        parse(&String::from_utf8_lossy(&out.stdout), write)
    }
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
        args.extend(holder_args(&req.holder));
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
        args.extend(holder_args(&req.holder));
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

    async fn health(&self) -> Result<Health, StoreError> {
        Err(StoreError::Invalid("the workload never probes".into()))
    }
}
