//! Deliberately broken components for the positive controls: each must make
//! the checker report its property, or the run fails. (The broken
//! downstreams are in `sink.rs`; the rogue publisher in `workload/operator.rs`.)

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use targetlease::store::{
    AcquireRequest, CommitRequest, Health, LeaseStore, Listed, Outcome, ReadReply, ReleaseRequest,
    RenewRequest, Reply, RevokeRequest, StoreError, Target,
};

/// Which broken component a control scenario plugs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// (a) A store that hands a target's first token out again on every
    /// other acquisition (as if it had lost its counter).
    ReissueTokens,
    /// (b) A downstream table without the guard, with a paused holder.
    Unguarded,
    /// (b) A downstream that acknowledges before its commit and then rolls back.
    LoseAckedWrites,
    /// (c) A store that runs every third acquire and reports `backend_unavailable`.
    LyingStore,
    /// (d) A second writer that marks a waiting TargetLease Held.
    RoguePublisher,
    /// (d) A store that grants every third acquire of a held target anyway
    /// (the holder's token, a lease of the caller's own).
    DoubleGrant,
}

/// Wraps a store with the broken behaviour of `control`, when it is a store control.
pub fn wrap(control: Option<Control>, inner: Arc<dyn LeaseStore>) -> Arc<dyn LeaseStore> {
    match control {
        Some(Control::ReissueTokens) => Arc::new(Broken {
            inner,
            kind: Control::ReissueTokens,
            first: Mutex::new(HashMap::new()),
            calls: AtomicU64::new(0),
        }),
        Some(kind @ (Control::LyingStore | Control::DoubleGrant)) => Arc::new(Broken {
            inner,
            kind,
            first: Mutex::new(HashMap::new()),
            calls: AtomicU64::new(0),
        }),
        _ => inner,
    }
}

struct Broken {
    inner: Arc<dyn LeaseStore>,
    kind: Control,
    /// First token seen per target (ReissueTokens).
    first: Mutex<HashMap<Target, u64>>,
    calls: AtomicU64,
}

impl Broken {
    /// Every third `held` reply becomes `acquired`: the caller gets a lease of
    /// its own (owner, request id, a lease id) with the holder's token,
    /// starting now, while the holder still holds it.
    fn double_grant(&self, req: &AcquireRequest, mut reply: Reply) -> Reply {
        if self.calls.fetch_add(1, Ordering::SeqCst) % 3 != 2 {
            return reply;
        }
        if let Some(lease) = &mut reply.lease {
            let now = reply.server_time_ms;
            lease.owner = req.owner.clone();
            lease.lease_id = Some(format!("double-{}", req.request_id));
            lease.acquired_at_ms = now;
            lease.expires_at_ms = now + req.ttl.as_millis() as u64;
            lease.metadata = req.metadata.clone();
            reply.outcome = Outcome::Acquired;
        }
        reply
    }
}

#[async_trait]
impl LeaseStore for Broken {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Reply, StoreError> {
        let mut reply = self.inner.acquire(req).await?;
        if self.kind == Control::DoubleGrant && reply.outcome == Outcome::Held {
            return Ok(self.double_grant(req, reply));
        }
        if reply.outcome != Outcome::Acquired {
            return Ok(reply);
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        match self.kind {
            Control::LyingStore if n % 3 == 2 => Err(StoreError::BackendUnavailable(
                "control: the acquire ran, the caller is told it did not".into(),
            )),
            Control::ReissueTokens => {
                if let Some(lease) = &mut reply.lease {
                    let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
                    let token = *first
                        .entry(req.target.clone())
                        .or_insert(lease.fencing_token);
                    if n % 2 == 1 {
                        lease.fencing_token = token;
                    }
                }
                Ok(reply)
            }
            _ => Ok(reply),
        }
    }

    async fn renew(&self, req: &RenewRequest) -> Result<Reply, StoreError> {
        self.inner.renew(req).await
    }

    async fn release(&self, req: &ReleaseRequest) -> Result<Reply, StoreError> {
        self.inner.release(req).await
    }

    async fn get(&self, target: &Target) -> Result<Reply, StoreError> {
        self.inner.get(target).await
    }

    async fn revoke(&self, req: &RevokeRequest) -> Result<Reply, StoreError> {
        self.inner.revoke(req).await
    }

    async fn commit(&self, req: &CommitRequest) -> Result<Reply, StoreError> {
        self.inner.commit(req).await
    }

    async fn read(&self, target: &Target, key: &str) -> Result<ReadReply, StoreError> {
        self.inner.read(target, key).await
    }

    async fn list(
        &self,
        namespace: Option<&str>,
        target_prefix: &str,
    ) -> Result<Vec<Listed>, StoreError> {
        self.inner.list(namespace, target_prefix).await
    }

    async fn health(&self) -> Result<Health, StoreError> {
        self.inner.health().await
    }
}
