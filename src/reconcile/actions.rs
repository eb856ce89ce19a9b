//! The store calls of a pass: acquire, renew, release, and what each outcome
//! does to status, pod marks and Events.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::pass::{Pass, time_ms};
use super::{BACKEND_RETRY, CORRUPT_RETRY, Error, Timing, plan};
use crate::conditions::{self, Status, reason};
use crate::crd::Phase;
use crate::store::{AcquireRequest, Outcome, ReleaseRequest, RenewRequest, Reply};

impl Pass<'_> {
    pub(super) async fn acquire(&mut self, owner: String, t: &Timing) -> Result<Action, Error> {
        let Some(attempt) = self.status.acquisition_id.clone() else {
            return Ok(Action::requeue(Duration::ZERO));
        };
        let floor = self.token_floor().await?;
        let mut req = AcquireRequest::new(self.target(), owner, t.ttl);
        req.request_id = attempt.clone();
        req.lease_id = Some(self.ctx.lease_ids.derive(&attempt));
        req.max_lifetime = t.max_lifetime;
        req.token_floor = (floor > 0).then_some(floor);
        let mut meta = serde_json::Map::new();
        meta.insert(
            "targetlease".into(),
            format!(
                "{}/{}",
                self.tl.namespace().unwrap_or_default(),
                self.tl.name_any()
            )
            .into(),
        );
        req.metadata = Some(meta);
        let reply = match self.ctx.store.acquire(&req).await {
            Ok(r) => r,
            Err(e) => return Ok(self.backend_failed(&e).await),
        };
        self.backend_ok();
        self.on_acquire(reply, t).await
    }

    pub(super) async fn on_acquire(&mut self, reply: Reply, t: &Timing) -> Result<Action, Error> {
        match (reply.outcome, reply.lease) {
            (Outcome::Acquired, Some(lease)) => {
                self.publish_lease(&lease);
                self.mark_pod().await?;
                self.held(&lease);
                self.mark_renewed();
                self.publish().await?;
                self.event(
                    EventType::Normal,
                    reason::ACQUIRED,
                    format!(
                        "acquired by {} with fencing token {}",
                        lease.owner, lease.fencing_token
                    ),
                )
                .await;
                Ok(self.next_renewal(t))
            }
            (Outcome::Held, lease) => {
                let holder = lease
                    .as_ref()
                    .map(|l| l.owner.as_str())
                    .unwrap_or("someone else");
                self.not_held(
                    Phase::Pending,
                    reason::TARGET_HELD,
                    &format!("target is held by {holder}"),
                );
                self.publish().await?;
                let expires = lease
                    .map(|l| l.expires_at_ms)
                    .unwrap_or(reply.server_time_ms);
                Ok(Action::requeue(plan::retry_after_held(
                    expires,
                    reply.server_time_ms,
                )))
            }
            (Outcome::Expired | Outcome::IdempotencyConflict, _) => {
                // That attempt's lease is over (or its inputs changed): start a new one.
                self.status.acquisition_id = None;
                self.publish().await?;
                Ok(Action::requeue(Duration::ZERO))
            }
            (Outcome::CorruptState, _) => Ok(self.corrupt(&reply.message).await?),
            (other, _) => {
                tracing::warn!(outcome = %other, "unexpected acquire outcome");
                Ok(Action::requeue(BACKEND_RETRY))
            }
        }
    }

    pub(super) async fn corrupt(&mut self, message: &str) -> Result<Action, Error> {
        self.status.phase = Some(Phase::Error);
        self.condition(
            conditions::HELD,
            Status::Unknown,
            reason::CORRUPT_STATE,
            message,
        );
        self.publish().await?;
        self.event(
            EventType::Warning,
            reason::CORRUPT_STATE,
            format!("lease store state is corrupt ({message}); revoke the target to repair"),
        )
        .await;
        Ok(Action::requeue(CORRUPT_RETRY))
    }

    pub(super) async fn renew(&mut self, t: &Timing) -> Result<Action, Error> {
        let Some(holder) = self.holder() else {
            return Ok(Action::requeue(Duration::ZERO));
        };
        let reply = match self
            .ctx
            .store
            .renew(&RenewRequest::new(self.target(), holder, t.ttl))
            .await
        {
            Ok(r) => r,
            Err(e) => {
                let action = self.backend_failed(&e).await;
                let published = self.status.expires_at.as_ref().map(|t| t.0);
                if published.is_none_or(|p| p <= Timestamp::now()) {
                    self.condition(
                        conditions::HELD,
                        Status::Unknown,
                        reason::UNCONFIRMED,
                        "the lease could not be renewed before its published expiry",
                    );
                }
                self.publish().await?;
                return Ok(action);
            }
        };
        self.backend_ok();
        match (reply.outcome, reply.lease) {
            (Outcome::Renewed, Some(lease)) => {
                self.mark_renewed();
                let published = self
                    .status
                    .expires_at
                    .as_ref()
                    .map(|t| t.0.as_millisecond());
                if plan::needs_expiry_refresh(published, reply.server_time_ms, t.renew) {
                    self.status.expires_at = time_ms(lease.expires_at_ms);
                    self.mark_pod().await?;
                }
                self.held(&lease);
                self.publish().await?;
                Ok(self.next_renewal(t))
            }
            (Outcome::CorruptState, _) => self.corrupt(&reply.message).await,
            (outcome, _) => {
                // expired / not_owner: Valkey no longer has this lease.
                self.forget_renewal();
                self.unmark_pod().await?;
                self.status.acquisition_id = None;
                let message = format!(
                    "the lease ended in the store ({outcome}): {}",
                    reply.message
                );
                self.not_held(Phase::Lost, reason::LEASE_LOST, &message);
                self.publish().await?;
                self.event(EventType::Warning, reason::LEASE_LOST, message)
                    .await;
                self.wake_waiters();
                Ok(Action::requeue(Duration::ZERO))
            }
        }
    }

    /// Gives the held lease back. Returns false when the store could not be asked.
    pub(super) async fn release(&mut self, why: &str, message: &str) -> Result<bool, Error> {
        let Some(holder) = self.holder() else {
            return Ok(true);
        };
        self.unmark_pod().await?;
        match self
            .ctx
            .store
            .release(&ReleaseRequest::new(self.target(), holder))
            .await
        {
            Ok(reply) => {
                self.backend_ok();
                tracing::debug!(outcome = %reply.outcome, "released");
            }
            Err(e) => {
                self.backend_failed(&e).await;
                self.publish().await?;
                return Ok(false);
            }
        }
        self.forget_renewal();
        self.status.acquisition_id = None;
        let phase = if why == reason::RELEASED {
            Phase::Released
        } else {
            Phase::Pending
        };
        self.not_held(phase, why, message);
        self.publish().await?;
        self.event(
            EventType::Normal,
            reason::RELEASED,
            format!("lease released: {message}"),
        )
        .await;
        self.wake_waiters();
        Ok(true)
    }
}
