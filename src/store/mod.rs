//! The lease protocol, independent of any backend.
//!
//! Everything above this module (the CLI, the operator) speaks only these
//! types. Refusals such as "someone else holds it" are [`Outcome`] values;
//! [`StoreError`] is reserved for the backend failing or the caller sending
//! input that can never be valid.

pub mod etcd;
pub mod failpoints;
pub mod memory;
pub mod metrics;
mod requests;
pub mod valkey;

pub use requests::{
    AcquireRequest, CommitRequest, LeaseHandle, ReleaseRequest, RenewRequest, RevokeRequest,
    check_name,
};

use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use serde::Serialize;

/// Longest accepted target, owner, lease id, request id or commit key, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Largest accepted lease metadata document (serialized JSON), in bytes.
pub const MAX_METADATA_BYTES: usize = 4096;
/// Deepest accepted metadata nesting: objects and arrays, the top object counting 1.
/// The scripts check stored metadata against the same limit (`lua/lib.lua`).
pub const MAX_METADATA_DEPTH: usize = 64;
/// Largest accepted fenced-commit value, in bytes.
pub const MAX_COMMIT_VALUE_BYTES: usize = 64 * 1024;
/// Longest accepted lease duration or maximum lifetime.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);
/// Highest fencing token a store will ever issue (the counter fails closed here).
pub const MAX_TOKEN: u64 = i64::MAX as u64;
/// How long a request id is remembered after its operation (acquire adds its ttl).
pub const IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(120);

/// Which lease: a tenant (the Kubernetes namespace) and a target name in it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// Tenant the target belongs to; leases never cross tenants.
    pub namespace: String,
    /// Name of the thing only one owner may act on.
    pub name: String,
}

impl Target {
    /// A target `name` in tenant `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Checks the name bounds; backends call this before touching state.
    pub fn validate(&self) -> Result<(), StoreError> {
        requests::check_name("namespace", &self.namespace)?;
        requests::check_name("target", &self.name)
    }
}

/// A lease as a store reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Lease {
    /// The target name.
    pub target: String,
    /// The capability to renew or release; only ever shown to the holder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    /// Who holds it.
    pub owner: String,
    /// Strictly greater than every token issued before for this target.
    pub fencing_token: u64,
    /// Server time of acquisition, in Unix milliseconds (on a store
    /// without a clock, etcd: the client's, sampled before the request).
    pub acquired_at_ms: u64,
    /// Server time at which the lease ends unless renewed, in Unix
    /// milliseconds. On a store without a clock (etcd) it is the holder's
    /// deadline: the client's clock sampled before the request, plus the
    /// ttl; the store may keep the record a little longer, never less.
    pub expires_at_ms: u64,
    /// Server time past which no renewal can extend the lease (the
    /// holder's clock on etcd, as for `expires_at_ms`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_expires_at_ms: Option<u64>,
    /// The metadata given at acquisition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

impl Lease {
    /// The same lease with the capability removed, as shown to anyone but the holder.
    pub fn without_lease_id(mut self) -> Self {
        self.lease_id = None;
        self
    }

    /// The exact handle (owner, lease id, token) needed to renew or
    /// release, when this copy carries the lease id.
    pub fn handle(&self) -> Option<LeaseHandle> {
        self.lease_id.as_ref().map(|id| LeaseHandle {
            owner: self.owner.clone(),
            lease_id: id.clone(),
            token: self.fencing_token,
        })
    }
}

/// What a store operation decided. Refusals are values, not errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A new lease was granted.
    Acquired,
    /// The lease was extended.
    Renewed,
    /// The lease was given back.
    Released,
    /// The lease was ended by an administrator.
    Revoked,
    /// The target has a live lease (shown without its lease id).
    Found,
    /// The fenced write was stored.
    Committed,
    /// Someone else holds a live lease on the target.
    Held,
    /// The target has no live lease.
    NotFound,
    /// A live lease exists but it is not the one named in the request.
    NotOwner,
    /// The lease named in the request has ended.
    Expired,
    /// The token is not the current lease's, or is lower than one already committed.
    StaleToken,
    /// The request id was used before with different inputs.
    IdempotencyConflict,
    /// The stored state is not something this version understands; nothing was changed.
    CorruptState,
}

impl Outcome {
    /// Every outcome, for metrics and tests.
    pub const ALL: [Outcome; 13] = [
        Outcome::Acquired,
        Outcome::Renewed,
        Outcome::Released,
        Outcome::Revoked,
        Outcome::Found,
        Outcome::Committed,
        Outcome::Held,
        Outcome::NotFound,
        Outcome::NotOwner,
        Outcome::Expired,
        Outcome::StaleToken,
        Outcome::IdempotencyConflict,
        Outcome::CorruptState,
    ];

    /// The stable snake_case name used in JSON, scripts and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Acquired => "acquired",
            Outcome::Renewed => "renewed",
            Outcome::Released => "released",
            Outcome::Revoked => "revoked",
            Outcome::Found => "found",
            Outcome::Committed => "committed",
            Outcome::Held => "held",
            Outcome::NotFound => "not_found",
            Outcome::NotOwner => "not_owner",
            Outcome::Expired => "expired",
            Outcome::StaleToken => "stale_token",
            Outcome::IdempotencyConflict => "idempotency_conflict",
            Outcome::CorruptState => "corrupt_state",
        }
    }

    /// Parses a name produced by [`Outcome::as_str`].
    pub fn parse(name: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == name)
    }

    /// True when the operation did what was asked.
    pub fn is_success(self) -> bool {
        matches!(
            self,
            Outcome::Acquired
                | Outcome::Renewed
                | Outcome::Released
                | Outcome::Revoked
                | Outcome::Found
                | Outcome::Committed
        )
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The answer to every store operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// What happened.
    pub outcome: Outcome,
    /// The lease the outcome is about, when there is one to show.
    pub lease: Option<Lease>,
    /// The store's clock when it decided, in Unix milliseconds (etcd has
    /// none: the client's clock sampled before the request was sent).
    pub server_time_ms: u64,
    /// One human sentence; never contains secrets.
    pub message: String,
}

/// A value stored by a fenced commit, as read back.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Committed {
    /// The value's name under its target.
    pub key: String,
    /// The value.
    pub value: String,
    /// The fencing token it was committed with.
    pub fencing_token: u64,
    /// The store's clock when it was committed, in Unix milliseconds.
    pub committed_at_ms: u64,
}

/// What a read of a committed value found: `found` with the value,
/// `not_found`, or `corrupt_state`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadReply {
    /// `Found`, `NotFound` or `CorruptState`.
    pub outcome: Outcome,
    /// The value when found.
    pub committed: Option<Committed>,
    /// The store's clock when it read, in Unix milliseconds.
    pub server_time_ms: u64,
    /// One human sentence.
    pub message: String,
}

/// One lease record found by [`LeaseStore::list`], read through the same
/// atomic get as [`LeaseStore::get`]: `found` (never with its lease id),
/// `expired` (the record was there, its lease is not live) or `corrupt_state`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The target of the record.
    pub target: Target,
    /// What a get of that target answered (`not_found` becomes `expired`).
    pub reply: Reply,
}

impl Listed {
    /// A listed record from what a get of its target answered: a record
    /// that was there but whose lease is not live is `expired`.
    pub fn from_get(target: Target, mut reply: Reply) -> Self {
        if reply.outcome == Outcome::NotFound {
            reply.outcome = Outcome::Expired;
            reply.message = "the lease has ended".into();
        }
        Self { target, reply }
    }
}

/// What a health probe learned about the backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    /// The store's clock, in Unix milliseconds (on etcd: the client's,
    /// sampled before the probe was sent).
    pub server_time_ms: u64,
    /// Round trip of the probe.
    pub latency: Duration,
}

/// The backend failed, or the request can never be valid.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The request breaks a bound; nothing was sent.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The backend could not be asked; nothing happened.
    #[error("backend unavailable: {0}")]
    BackendUnavailable(String),
    /// The request may or may not have taken effect; retry with the same request id.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
}

impl StoreError {
    /// A bounded name for metrics labels and Event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            StoreError::Invalid(_) => "invalid",
            StoreError::BackendUnavailable(_) => "backend_unavailable",
            StoreError::OutcomeUnknown(_) => "outcome_unknown",
        }
    }
}

/// Why a waiter should ask again for the target it waits on (see [`LeaseStore::notices`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    /// The store announced that the target's lease ended: a release, a
    /// revoke, or an expiry where the store sees expiry happen (etcd).
    Freed,
    /// The subscription broke and was made again: an announcement may have
    /// been missed in between.
    Resubscribed,
}

/// Release notices for one target, as [`LeaseStore::notices`] returns them.
/// The stream ends only when the store can no longer announce anything.
pub type Notices = BoxStream<'static, Notice>;

/// The lease protocol every backend implements; one contract suite checks them all.
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Grants the lease if the target is free.
    async fn acquire(&self, req: &AcquireRequest) -> Result<Reply, StoreError>;
    /// Extends the exact current lease.
    async fn renew(&self, req: &RenewRequest) -> Result<Reply, StoreError>;
    /// Ends the exact current lease.
    async fn release(&self, req: &ReleaseRequest) -> Result<Reply, StoreError>;
    /// Reads the live lease, without its lease id.
    async fn get(&self, target: &Target) -> Result<Reply, StoreError>;
    /// Ends any lease on the target, without an owner check. The token counter is kept.
    async fn revoke(&self, req: &RevokeRequest) -> Result<Reply, StoreError>;
    /// Stores a value only if the token is the live lease's and not lower than the last commit.
    async fn commit(&self, req: &CommitRequest) -> Result<Reply, StoreError>;
    /// Reads back the value last committed under `key` of the target, with
    /// its token (no lease needed; never writes).
    async fn read(&self, target: &Target, key: &str) -> Result<ReadReply, StoreError>;
    /// The lease records of `namespace` (every namespace when `None`) whose
    /// target names start with `target_prefix`, sorted by namespace and
    /// target, each read like [`LeaseStore::get`]. Never writes.
    async fn list(
        &self,
        namespace: Option<&str>,
        target_prefix: &str,
    ) -> Result<Vec<Listed>, StoreError>;
    /// Probes the backend.
    async fn health(&self) -> Result<Health, StoreError>;
    /// Release notices for `target`, so a waiter asks again when the target
    /// may have become free instead of polling. The subscription is in place
    /// when this returns: a lease that ends later is announced, one that
    /// ended before is not (ask once more after subscribing). `Err` when the
    /// store cannot announce (the waiter polls then). Default: no notices.
    async fn notices(&self, target: &Target) -> Result<Notices, StoreError> {
        let _ = target;
        Err(StoreError::BackendUnavailable(
            "this store sends no release notices".into(),
        ))
    }
    /// Closes connections (sends nothing that could change state). Default: nothing to close.
    async fn close(&self) {}
}

/// A fresh random request id (the idempotency key of one store call).
pub fn new_request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Reads stored metadata text back: a JSON object, at most
/// [`MAX_METADATA_DEPTH`] deep. Every backend decodes metadata with this, and
/// [`AcquireRequest::validate`] accepts only metadata that survives it.
pub fn metadata_from_json(text: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_str::<serde_json::Value>(text).ok()? {
        serde_json::Value::Object(m) if depth_of_map(&m) <= MAX_METADATA_DEPTH => Some(m),
        _ => None,
    }
}

fn depth_of_map(m: &serde_json::Map<String, serde_json::Value>) -> usize {
    1 + m.values().map(depth_of).max().unwrap_or(0)
}

fn depth_of(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Object(m) => depth_of_map(m),
        serde_json::Value::Array(a) => 1 + a.iter().map(depth_of).max().unwrap_or(0),
        _ => 0,
    }
}
