//! The typed requests of the lease protocol and the bounds every backend
//! enforces before touching state (so every backend refuses the same inputs
//! the same way).

use std::time::Duration;

use super::{
    MAX_COMMIT_VALUE_BYTES, MAX_DURATION, MAX_METADATA_BYTES, MAX_METADATA_DEPTH, MAX_NAME_BYTES,
    MAX_TOKEN, StoreError, Target, depth_of_map, metadata_from_json, new_request_id,
};

/// Ask for the lease on a target.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    /// The target to lease.
    pub target: Target,
    /// Who wants it (a name, not a secret).
    pub owner: String,
    /// How long the lease lives unless renewed.
    pub ttl: Duration,
    /// Hard limit on the lease's life from acquisition; renewals cannot pass it.
    pub max_lifetime: Option<Duration>,
    /// Retrying with the same id returns the original result.
    pub request_id: String,
    /// Opaque JSON object stored with the lease (at most 4 KiB).
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// The issued token must be greater than this (a durable floor kept by the caller).
    pub token_floor: Option<u64>,
    /// The lease id to assign, for callers that derive it (it must be unguessable:
    /// it is the capability to renew and release). Default: one the backend
    /// picks, the same again for a retry of the same request id (Valkey derives
    /// it from the target, owner and request id; it never stores it).
    pub lease_id: Option<String>,
}

impl AcquireRequest {
    /// An acquire with a fresh request id and no optional settings.
    pub fn new(target: Target, owner: impl Into<String>, ttl: Duration) -> Self {
        Self {
            target,
            owner: owner.into(),
            ttl,
            max_lifetime: None,
            request_id: new_request_id(),
            metadata: None,
            token_floor: None,
            lease_id: None,
        }
    }

    /// Checks every bound; backends call this before touching state.
    pub fn validate(&self) -> Result<(), StoreError> {
        self.target.validate()?;
        check_name("owner", &self.owner)?;
        check_name("request id", &self.request_id)?;
        if let Some(id) = &self.lease_id {
            check_name("lease id", id)?;
            if id.len() < 16 {
                return Err(StoreError::Invalid(
                    "lease id must be at least 16 bytes (it is a capability)".into(),
                ));
            }
        }
        check_duration("ttl", self.ttl)?;
        if let Some(max) = self.max_lifetime {
            check_duration("max lifetime", max)?;
        }
        if let Some(meta) = &self.metadata {
            check_metadata(meta)?;
        }
        if let Some(floor) = self.token_floor
            && floor >= MAX_TOKEN
        {
            return Err(StoreError::Invalid(format!(
                "token floor must be below {MAX_TOKEN}"
            )));
        }
        Ok(())
    }

    /// The metadata as the compact JSON text that is stored (empty when absent).
    pub fn metadata_json(&self) -> String {
        self.metadata
            .as_ref()
            .map(|m| serde_json::Value::Object(m.clone()).to_string())
            .unwrap_or_default()
    }
}

/// A lease handle: the exact (owner, lease id, token) of one lease, which
/// renew and release require (see the glossary in docs/architecture.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseHandle {
    /// The owner named at acquisition.
    pub owner: String,
    /// The secret lease id returned by acquire.
    pub lease_id: String,
    /// The fencing token returned by acquire.
    pub token: u64,
}

impl LeaseHandle {
    fn validate(&self) -> Result<(), StoreError> {
        check_name("owner", &self.owner)?;
        check_name("lease id", &self.lease_id)?;
        check_token(self.token)
    }
}

/// Extend a held lease.
#[derive(Clone, Debug)]
pub struct RenewRequest {
    /// The leased target.
    pub target: Target,
    /// The exact current lease.
    pub handle: LeaseHandle,
    /// New remaining life, counted from the server's now.
    pub ttl: Duration,
    /// Never move the expiry earlier: the lease then expires at the later of
    /// its current expiry and now + `ttl` (still capped by its max lifetime).
    /// For a renewal that may race one asking for a longer life.
    pub extend_only: bool,
    /// Retrying with the same id returns the original result.
    pub request_id: String,
}

impl RenewRequest {
    /// A renew with a fresh request id.
    pub fn new(target: Target, handle: LeaseHandle, ttl: Duration) -> Self {
        Self {
            target,
            handle,
            ttl,
            extend_only: false,
            request_id: new_request_id(),
        }
    }

    /// The same renewal, never moving the expiry earlier ([`Self::extend_only`]).
    pub fn extending_only(mut self) -> Self {
        self.extend_only = true;
        self
    }

    /// Checks every bound; backends call this before touching state.
    pub fn validate(&self) -> Result<(), StoreError> {
        self.target.validate()?;
        self.handle.validate()?;
        check_name("request id", &self.request_id)?;
        check_duration("ttl", self.ttl)
    }
}

/// Give a held lease back.
#[derive(Clone, Debug)]
pub struct ReleaseRequest {
    /// The leased target.
    pub target: Target,
    /// The exact current lease.
    pub handle: LeaseHandle,
    /// Retrying with the same id returns the original result.
    pub request_id: String,
}

impl ReleaseRequest {
    /// A release with a fresh request id.
    pub fn new(target: Target, handle: LeaseHandle) -> Self {
        Self {
            target,
            handle,
            request_id: new_request_id(),
        }
    }

    /// Checks every bound; backends call this before touching state.
    pub fn validate(&self) -> Result<(), StoreError> {
        self.target.validate()?;
        self.handle.validate()?;
        check_name("request id", &self.request_id)
    }
}

/// Administratively end the lease on a target, without an owner check.
#[derive(Clone, Debug)]
pub struct RevokeRequest {
    /// The target to clear.
    pub target: Target,
    /// Only end the lease with this fencing token (`not_owner` otherwise).
    /// Without it, whatever record sits on the target is removed.
    pub token: Option<u64>,
    /// Retrying with the same id returns the original result (`not_found`
    /// included), so a retry never ends a lease acquired after the first attempt.
    pub request_id: String,
}

impl RevokeRequest {
    /// A revoke of whatever lease `target` has, with a fresh request id.
    pub fn new(target: Target) -> Self {
        Self {
            target,
            token: None,
            request_id: new_request_id(),
        }
    }

    /// Checks every bound; backends call this before touching state.
    pub fn validate(&self) -> Result<(), StoreError> {
        self.target.validate()?;
        check_name("request id", &self.request_id)?;
        if let Some(token) = self.token {
            check_token(token)?;
        }
        Ok(())
    }
}

/// Write `key = value` under a target, accepted only with the live lease's token.
#[derive(Clone, Debug)]
pub struct CommitRequest {
    /// The leased target.
    pub target: Target,
    /// The fencing token the writer holds.
    pub token: u64,
    /// Name of the value (scoped to the target).
    pub key: String,
    /// The value to store.
    pub value: String,
    /// Retrying with the same id returns the original result.
    pub request_id: String,
}

impl CommitRequest {
    /// A commit with a fresh request id.
    pub fn new(
        target: Target,
        token: u64,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Self {
        Self {
            target,
            token,
            key: key.into(),
            value: value.into(),
            request_id: new_request_id(),
        }
    }

    /// Checks every bound; backends call this before touching state.
    pub fn validate(&self) -> Result<(), StoreError> {
        self.target.validate()?;
        check_token(self.token)?;
        check_name("key", &self.key)?;
        check_name("request id", &self.request_id)?;
        if self.value.len() > MAX_COMMIT_VALUE_BYTES {
            return Err(StoreError::Invalid(format!(
                "value is longer than {MAX_COMMIT_VALUE_BYTES} bytes"
            )));
        }
        Ok(())
    }
}

/// Metadata is stored as compact JSON and must read back as exactly itself.
fn check_metadata(meta: &serde_json::Map<String, serde_json::Value>) -> Result<(), StoreError> {
    // Depth first: serializing a very deep document is itself deep recursion.
    let depth = depth_of_map(meta);
    if depth > MAX_METADATA_DEPTH {
        return Err(StoreError::Invalid(format!(
            "metadata is nested {depth} levels deep; at most {MAX_METADATA_DEPTH} are allowed"
        )));
    }
    let text = serde_json::Value::Object(meta.clone()).to_string();
    if text.len() > MAX_METADATA_BYTES {
        return Err(StoreError::Invalid(format!(
            "metadata is {} bytes; at most {MAX_METADATA_BYTES} are allowed",
            text.len()
        )));
    }
    if metadata_from_json(&text).as_ref() != Some(meta) {
        return Err(StoreError::Invalid(
            "metadata does not read back as itself from JSON".into(),
        ));
    }
    Ok(())
}

/// Checks a name the store keeps (target, owner, ids): 1 to 256 bytes, no
/// control characters. Callers validating ahead of time (the operator) use it
/// so admission, the operator and the store agree.
pub fn check_name(what: &str, value: &str) -> Result<(), StoreError> {
    if value.is_empty() {
        return Err(StoreError::Invalid(format!("{what} must not be empty")));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(StoreError::Invalid(format!(
            "{what} is {} bytes; at most {MAX_NAME_BYTES} are allowed",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(StoreError::Invalid(format!(
            "{what} must not contain control characters"
        )));
    }
    Ok(())
}

fn check_duration(what: &str, value: Duration) -> Result<(), StoreError> {
    if value.as_millis() == 0 {
        return Err(StoreError::Invalid(format!("{what} must be at least 1ms")));
    }
    if value > MAX_DURATION {
        return Err(StoreError::Invalid(format!(
            "{what} must be at most {}",
            humantime::format_duration(MAX_DURATION)
        )));
    }
    Ok(())
}

fn check_token(token: u64) -> Result<(), StoreError> {
    if token == 0 || token > MAX_TOKEN {
        return Err(StoreError::Invalid(format!(
            "token must be between 1 and {MAX_TOKEN}"
        )));
    }
    Ok(())
}
