//! Deliberately broken components of the harness for the positive controls
//! that break no product code (the product's own are its fail points,
//! `src/store/failpoints.rs`, named by each scenario): each must make the checker
//! report its property, or the run fails. (The broken downstreams are in
//! `sink.rs`; the rogue publisher in `workload/operator.rs`.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use targetlease::store::{
    AcquireRequest, CommitRequest, Health, LeaseStore, Listed, Outcome, ReadReply, ReleaseRequest,
    RenewRequest, Reply, RevokeRequest, StoreError, Target,
};

/// Which broken component a control scenario plugs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// (b) A downstream table without the guard, with a paused holder.
    Unguarded,
    /// (b) The PostgreSQL recipe with its guard's comparison removed, with a
    /// paused holder.
    BrokenRecipe,
    /// (b) A downstream that acknowledges before its commit and then rolls back.
    LoseAckedWrites,
    /// (d) A second writer that marks a waiting TargetLease Held.
    RoguePublisher,
    /// (d) A store that grants every third acquire of a held target anyway
    /// (the holder's token, a lease of the caller's own).
    DoubleGrant,
    /// (a) A disk that loses the last second of what was fsynced when the
    /// power goes (the deployment's `powerloss::Disk::CacheLosesFsyncs`).
    DiskLosesFsyncs,
}

/// Wraps a store with the broken behaviour of `control`, when it is a store control.
pub fn wrap(control: Option<Control>, inner: Arc<dyn LeaseStore>) -> Arc<dyn LeaseStore> {
    match control {
        Some(Control::DoubleGrant) => Arc::new(Broken {
            inner,
            calls: AtomicU64::new(0),
        }),
        _ => inner,
    }
}

struct Broken {
    inner: Arc<dyn LeaseStore>,
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
        let reply = self.inner.acquire(req).await?;
        if reply.outcome == Outcome::Held {
            return Ok(self.double_grant(req, reply));
        }
        Ok(reply)
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
