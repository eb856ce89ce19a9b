//! `targetlease lease …`: one store operation per invocation, one JSON envelope out.
//!
//! Every request is built and validated before anything connects, so bad
//! arguments exit 2 having sent nothing.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

mod parse;

pub use parse::{
    DEFAULT_TTL, DEFAULT_WAIT, SERVICE_ACCOUNT_NAMESPACE, default_namespace, default_owner,
    parse_metadata, parse_token,
};

use super::connection::ConnectionArgs;
use super::logging::{self, LogArgs};
use super::output::{self, Envelope, Format, OutputArgs, Report};
use crate::store::{
    AcquireRequest, CommitRequest, LeaseHandle, LeaseStore, ReleaseRequest, RenewRequest,
    RevokeRequest, StoreError, Target,
};

/// Acquire, renew, release, inspect, revoke or fence-write a lease.
#[derive(Args, Debug)]
pub struct LeaseArgs {
    /// The operation.
    #[command(subcommand)]
    pub command: LeaseCommand,
}

/// The lease operations.
#[derive(Subcommand, Debug)]
pub enum LeaseCommand {
    /// Take the lease if the target is free; prints the lease id and fencing token.
    #[command(
        after_help = "Examples:\n  targetlease lease acquire --target db-migration --ttl 60s\n  targetlease lease acquire --target db --owner job-7 --request-id job-7-try-1 --metadata '{\"run\":7}'"
    )]
    Acquire(AcquireArgs),
    /// Extend the lease you hold (exact lease id, owner and token).
    #[command(
        after_help = "Example:\n  targetlease lease renew --target db --owner job-7 --lease-id \"$ID\" --token 42 --ttl 60s"
    )]
    Renew(RenewArgs),
    /// Give back the lease you hold (exact lease id, owner and token).
    Release(ReleaseArgs),
    /// List the lease records of a namespace (or all), each read like get:
    /// found, expired or corrupt_state; never a lease id. One JSON line each.
    #[command(
        after_help = "Examples:\n  targetlease lease list --namespace team-a --target-prefix db-\n  targetlease lease list --all-namespaces -o text"
    )]
    List(ListArgs),
    /// Show the live lease of a target, without its lease id.
    #[command(
        after_help = "Examples:\n  targetlease lease get --target db\n  targetlease lease get --target db --namespace team-a -o text"
    )]
    Get(GetArgs),
    /// End whatever lease a target has, without an owner check (administrative).
    Revoke(RevokeArgs),
    /// Read back the value last committed under KEY, with its fencing token (no lease needed).
    #[command(
        after_help = "Example:\n  targetlease lease read --target db --key schema-version -o text"
    )]
    Read(ReadArgs),
    /// Store KEY=VALUE under the target, only with the live lease's fencing token.
    #[command(
        after_help = "Example:\n  targetlease lease commit --target db --token 42 --key schema-version --value 17"
    )]
    Commit(CommitArgs),
}

/// Which target, in which tenant.
#[derive(Args, Clone, Debug)]
pub struct TargetArgs {
    /// The target name (1 to 256 bytes).
    #[arg(long, env = "TARGETLEASE_TARGET")]
    pub target: String,
    /// The tenant (Kubernetes namespace) the target belongs to. Default: in
    /// a pod, its namespace ($POD_NAMESPACE or its service account's); else
    /// the kubeconfig's; else `default`.
    #[arg(long, env = "TARGETLEASE_NAMESPACE", default_value_t = default_namespace(), hide_default_value = true)]
    pub namespace: String,
}

impl TargetArgs {
    /// The typed target.
    pub fn target(&self) -> Target {
        Target::new(&self.namespace, &self.target)
    }
}

/// Flags of `lease acquire`.
#[derive(Args, Debug)]
pub struct AcquireArgs {
    #[command(flatten)]
    acquire: AcquireFlags,
    /// Idempotency key: a retry with the same id returns the original result (default: fresh).
    #[arg(long, env = "TARGETLEASE_REQUEST_ID")]
    request_id: Option<String>,
    #[command(flatten)]
    client: ClientArgs,
}

/// What an acquire asks for, the same for `lease acquire` and `run`.
#[derive(Args, Debug)]
pub struct AcquireFlags {
    #[command(flatten)]
    target: TargetArgs,
    /// Who wants the lease (1 to 256 bytes; a name, not a secret).
    /// Default: in a pod, its name ($POD_NAME); else `user@host:pid`.
    #[arg(long, env = "TARGETLEASE_OWNER", default_value_t = default_owner(), hide_default_value = true)]
    owner: String,
    /// How long the lease lives unless renewed, e.g. 10s (`run` renews it
    /// every third of it while CMD runs).
    #[arg(long, env = "TARGETLEASE_TTL", default_value = DEFAULT_TTL, value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Hard limit on the lease's life; renewals cannot extend past it (`run`
    /// stops CMD when it is reached).
    #[arg(long, env = "TARGETLEASE_MAX_LIFETIME", value_parser = humantime::parse_duration)]
    max_lifetime: Option<Duration>,
    /// A JSON object (at most 4 KiB) stored with the lease and shown by get.
    #[arg(long, env = "TARGETLEASE_METADATA", hide_env_values = true)]
    metadata: Option<String>,
}

impl AcquireFlags {
    /// The checked acquire request, with a fresh request id (no client
    /// required); the message of a usage error otherwise.
    pub fn request(&self) -> Result<AcquireRequest, String> {
        let mut req = AcquireRequest::new(self.target.target(), &self.owner, self.ttl);
        req.max_lifetime = self.max_lifetime;
        req.metadata = parse_metadata(self.metadata.as_deref())?;
        req.validate().map_err(usage_message)?;
        Ok(req)
    }
}

/// How a `lease` or `run` invocation reaches the store, prints, and logs.
#[derive(Args, Debug)]
pub struct ClientArgs {
    /// How to reach the store (Valkey or etcd).
    #[command(flatten)]
    pub conn: ConnectionArgs,
    /// How the result is printed.
    #[command(flatten)]
    pub out: OutputArgs,
    /// Diagnostics on stderr.
    #[command(flatten)]
    pub log: LogArgs,
}

/// The lease handle renew and release act on: owner, lease id, token.
#[derive(Args, Debug)]
pub struct HandleArgs {
    /// The owner named at acquisition.
    #[arg(long, env = "TARGETLEASE_OWNER")]
    owner: String,
    /// The lease id printed by acquire.
    #[arg(long, env = "TARGETLEASE_LEASE_ID", hide_env_values = true)]
    lease_id: String,
    /// The fencing token printed by acquire.
    #[arg(long, env = "TARGETLEASE_FENCING_TOKEN", value_parser = parse_token, allow_negative_numbers = true)]
    token: u64,
}

impl HandleArgs {
    fn handle(&self) -> LeaseHandle {
        LeaseHandle {
            owner: self.owner.clone(),
            lease_id: self.lease_id.clone(),
            token: self.token,
        }
    }
}

/// Flags of `lease renew`.
#[derive(Args, Debug)]
pub struct RenewArgs {
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    handle: HandleArgs,
    /// New remaining life, counted from the server's now, e.g. 10s.
    #[arg(long, env = "TARGETLEASE_TTL", default_value = DEFAULT_TTL, value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Idempotency key: a retry with the same id returns the original result (default: fresh).
    #[arg(long, env = "TARGETLEASE_REQUEST_ID")]
    request_id: Option<String>,
    #[command(flatten)]
    client: ClientArgs,
}

/// Flags of `lease release`.
#[derive(Args, Debug)]
pub struct ReleaseArgs {
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    handle: HandleArgs,
    /// Idempotency key: a retry with the same id returns the original result (default: fresh).
    #[arg(long, env = "TARGETLEASE_REQUEST_ID")]
    request_id: Option<String>,
    #[command(flatten)]
    client: ClientArgs,
}

/// Flags of `lease get`.
#[derive(Args, Debug)]
pub struct GetArgs {
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    client: ClientArgs,
}

/// Flags of `lease revoke`.
#[derive(Args, Debug)]
pub struct RevokeArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Only end the lease with this fencing token (refused as not_owner otherwise).
    #[arg(long, env = "TARGETLEASE_FENCING_TOKEN", value_parser = parse_token, allow_negative_numbers = true)]
    token: Option<u64>,
    /// Idempotency key: a retry with the same id returns the original result,
    /// and never ends a lease acquired after the first attempt (default: fresh).
    #[arg(long, env = "TARGETLEASE_REQUEST_ID")]
    request_id: Option<String>,
    #[command(flatten)]
    client: ClientArgs,
}

/// Flags of `lease commit`.
#[derive(Args, Debug)]
pub struct CommitArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// The fencing token of the live lease.
    #[arg(long, env = "TARGETLEASE_FENCING_TOKEN", value_parser = parse_token, allow_negative_numbers = true)]
    token: u64,
    /// Name of the value, scoped to the target (1 to 256 bytes).
    #[arg(long, env = "TARGETLEASE_COMMIT_KEY")]
    key: String,
    /// The value to store (at most 64 KiB).
    #[arg(long, env = "TARGETLEASE_COMMIT_VALUE")]
    value: String,
    /// Idempotency key: a retry with the same id returns the original result (default: fresh).
    #[arg(long, env = "TARGETLEASE_REQUEST_ID")]
    request_id: Option<String>,
    #[command(flatten)]
    client: ClientArgs,
}

/// Flags of `lease list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// The tenant (Kubernetes namespace) to list (default as for `--namespace` of get).
    #[arg(long, env = "TARGETLEASE_NAMESPACE", default_value_t = default_namespace(), hide_default_value = true)]
    pub namespace: String,
    /// List every namespace (cluster-wide: every primary of a Valkey Cluster is scanned).
    #[arg(short = 'A', long, env = "TARGETLEASE_ALL_NAMESPACES")]
    pub all_namespaces: bool,
    /// Only targets whose names start with this.
    #[arg(long, env = "TARGETLEASE_TARGET_PREFIX", default_value = "")]
    pub target_prefix: String,
    /// How to reach the store (Valkey or etcd), and diagnostics.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Flags of `lease read`.
#[derive(Args, Debug)]
pub struct ReadArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Name of the value, as given to commit.
    #[arg(long, env = "TARGETLEASE_COMMIT_KEY")]
    key: String,
    #[command(flatten)]
    client: ClientArgs,
}

/// One validated store call, ready to send.
enum Op {
    Acquire(AcquireRequest),
    Renew(RenewRequest),
    Release(ReleaseRequest),
    Get(Target),
    Revoke(RevokeRequest),
    Commit(CommitRequest),
    Read(Target, String),
}

impl Op {
    async fn send(&self, store: &dyn LeaseStore) -> Result<Envelope, StoreError> {
        let reply = match self {
            Op::Acquire(r) => store.acquire(r).await,
            Op::Renew(r) => store.renew(r).await,
            Op::Release(r) => store.release(r).await,
            Op::Get(t) => store.get(t).await,
            Op::Revoke(r) => store.revoke(r).await,
            Op::Commit(r) => store.commit(r).await,
            Op::Read(t, key) => return store.read(t, key).await.map(Envelope::from_read),
        };
        reply.map(Envelope::from_reply)
    }

    fn validate(&self) -> Result<(), StoreError> {
        match self {
            Op::Acquire(r) => r.validate(),
            Op::Renew(r) => r.validate(),
            Op::Release(r) => r.validate(),
            Op::Get(t) => t.validate(),
            Op::Revoke(r) => r.validate(),
            Op::Commit(r) => r.validate(),
            Op::Read(t, key) => {
                t.validate()?;
                crate::store::check_name("key", key)
            }
        }
    }

    fn is_write(&self) -> bool {
        !matches!(self, Op::Get(_) | Op::Read(..))
    }

    fn request_id(&self) -> Option<&str> {
        match self {
            Op::Acquire(r) => Some(&r.request_id),
            Op::Renew(r) => Some(&r.request_id),
            Op::Release(r) => Some(&r.request_id),
            Op::Commit(r) => Some(&r.request_id),
            Op::Revoke(r) => Some(&r.request_id),
            Op::Get(_) | Op::Read(..) => None,
        }
    }
}

fn request_id(given: &Option<String>) -> String {
    given.clone().unwrap_or_else(crate::store::new_request_id)
}

fn build(cmd: &LeaseCommand) -> Result<Op, String> {
    let op = match cmd {
        LeaseCommand::Acquire(a) => {
            let mut req = a.acquire.request()?;
            req.request_id = request_id(&a.request_id);
            Op::Acquire(req)
        }
        LeaseCommand::Renew(a) => {
            let mut req = RenewRequest::new(a.target.target(), a.handle.handle(), a.ttl);
            req.request_id = request_id(&a.request_id);
            Op::Renew(req)
        }
        LeaseCommand::Release(a) => {
            let mut req = ReleaseRequest::new(a.target.target(), a.handle.handle());
            req.request_id = request_id(&a.request_id);
            Op::Release(req)
        }
        LeaseCommand::Get(a) => Op::Get(a.target.target()),
        LeaseCommand::Revoke(a) => {
            let mut req = RevokeRequest::new(a.target.target());
            req.token = a.token;
            req.request_id = request_id(&a.request_id);
            Op::Revoke(req)
        }
        LeaseCommand::Commit(a) => {
            let mut req = CommitRequest::new(a.target.target(), a.token, &a.key, &a.value);
            req.request_id = request_id(&a.request_id);
            Op::Commit(req)
        }
        LeaseCommand::Read(a) => Op::Read(a.target.target(), a.key.clone()),
        LeaseCommand::List(_) => unreachable!("lease list is not one store call"),
    };
    op.validate().map_err(usage_message)?;
    Ok(op)
}

/// What a request refused before sending says: the message alone when it is invalid.
fn usage_message(e: StoreError) -> String {
    match e {
        StoreError::Invalid(msg) => msg,
        other => other.to_string(),
    }
}

impl LeaseCommand {
    fn client(&self) -> &ClientArgs {
        match self {
            LeaseCommand::Acquire(a) => &a.client,
            LeaseCommand::Renew(a) => &a.client,
            LeaseCommand::Release(a) => &a.client,
            LeaseCommand::Get(a) => &a.client,
            LeaseCommand::Revoke(a) => &a.client,
            LeaseCommand::Commit(a) => &a.client,
            LeaseCommand::Read(a) => &a.client,
            LeaseCommand::List(a) => &a.client,
        }
    }
}

/// Runs one `lease` subcommand and returns the contract exit code.
pub async fn main(LeaseArgs { command: cmd }: LeaseArgs) -> ExitCode {
    logging::init(&cmd.client().log);
    if let LeaseCommand::List(a) = &cmd {
        return super::list::main(a).await;
    }
    // (no client required) everything that can be refused locally is refused here.
    let op = match build(&cmd) {
        Ok(op) => op,
        Err(msg) => return output::usage_error(&msg),
    };
    let config = match cmd.client().conn.to_store_config() {
        Ok(c) => c,
        Err(msg) => return output::usage_error(&msg),
    };
    let format = cmd.client().out.or(Format::Json);
    // (client required)
    let store = match config.connect().await {
        Ok(s) => s,
        Err(e) => return output::emit_as(Report::from(e), format),
    };
    // The store enforces `--timeout`; this is a backstop should a reply never come.
    let backstop = config.timeout() + Duration::from_secs(1);
    let backend = config.backend();
    let result = match tokio::time::timeout(backstop, op.send(&*store)).await {
        Ok(r) => r,
        Err(_) if op.is_write() => Err(StoreError::OutcomeUnknown(format!(
            "no reply from {backend} in time; retry with the same request id"
        ))),
        Err(_) => Err(StoreError::BackendUnavailable(format!(
            "no reply from {backend} in time"
        ))),
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), store.close()).await;
    // The caller needs the id to resolve an unknown outcome, even when it was generated.
    let result = match (result, op.request_id()) {
        (Err(StoreError::OutcomeUnknown(msg)), Some(id)) => Err(StoreError::OutcomeUnknown(
            format!("{msg} (--request-id {id})"),
        )),
        (other, _) => other,
    };
    output::emit_as(Report::from(result), format)
}

#[cfg(test)]
mod tests {
    use super::parse_metadata;

    #[test]
    fn metadata_must_be_a_small_json_object() {
        assert!(parse_metadata(None).unwrap().is_none());
        assert_eq!(
            parse_metadata(Some(r#"{"a":1}"#)).unwrap().unwrap().len(),
            1
        );
        assert!(parse_metadata(Some("[1]")).is_err());
        assert!(parse_metadata(Some("\"x\"")).is_err());
        assert!(parse_metadata(Some("{")).is_err());
        let big = format!(r#"{{"a":"{}"}}"#, "x".repeat(4096));
        assert!(parse_metadata(Some(&big)).is_err());
    }
}
