//! One reconcile pass over one TargetLease: the status being built, and the
//! helpers that read caches, write status and publish Events.

use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::{Context, Error, FIELD_MANAGER, Timing, plan, pods};
use crate::conditions::{self, Status, reason};
use crate::crd::{Phase, TargetLease, TargetLeaseStatus};
use crate::store::{Holder, Lease, StoreError, Target};

/// What one pass decided to publish, plus what to do next.
pub(super) struct Pass<'a> {
    pub(super) tl: &'a TargetLease,
    pub(super) api: &'a Api<TargetLease>,
    pub(super) ctx: &'a Context,
    pub(super) status: TargetLeaseStatus,
}

impl Pass<'_> {
    pub(super) fn target(&self) -> Target {
        Target::new(
            self.tl.namespace().unwrap_or_default(),
            self.tl.spec.target.clone(),
        )
    }

    pub(super) fn key(&self) -> ObjectRef<TargetLease> {
        ObjectRef::from_obj(self.tl)
    }

    pub(super) fn condition(&mut self, type_: &str, status: Status, reason: &str, message: &str) {
        conditions::upsert(
            &mut self.status.conditions,
            type_,
            status,
            reason,
            message,
            self.tl.metadata.generation,
            &Time(Timestamp::now()),
        );
    }

    /// Sets the `Held` condition for the lease this resource holds.
    pub(super) fn held(&mut self, lease: &Lease) {
        let message = format!(
            "held by {} with fencing token {}",
            lease.owner, lease.fencing_token
        );
        self.condition(conditions::HELD, Status::True, reason::ACQUIRED, &message);
    }

    pub(super) fn backend_ok(&mut self) {
        self.ctx
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key());
        self.condition(
            conditions::BACKEND_AVAILABLE,
            Status::True,
            reason::REACHABLE,
            "the lease store answered",
        );
    }

    /// Records backend trouble (an Event only when the condition flips) and backs off.
    pub(super) async fn backend_failed(&mut self, err: &StoreError) -> Action {
        let was_down = conditions::get(&self.status.conditions, conditions::BACKEND_AVAILABLE)
            .is_some_and(|c| c.status == "False");
        self.condition(
            conditions::BACKEND_AVAILABLE,
            Status::False,
            reason::BACKEND_UNAVAILABLE,
            err.category(),
        );
        if !was_down {
            self.event(
                EventType::Warning,
                reason::BACKEND_UNAVAILABLE,
                format!("lease store unavailable: {err}"),
            )
            .await;
        }
        *self
            .ctx
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(self.key())
            .or_default() += 1;
        self.retry_action()
    }

    /// Requeue after the current backoff (with up to 20% jitter).
    pub(super) fn retry_action(&self) -> Action {
        let failures = self
            .ctx
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&self.key())
            .copied()
            .unwrap_or(1);
        let base = plan::backoff(failures.saturating_sub(1));
        let jitter = base.mul_f64(rand::random::<f64>() * 0.2);
        Action::requeue(base + jitter)
    }

    /// Writes status by server-side apply, only when it changed.
    pub(super) async fn publish(&mut self) -> Result<(), Error> {
        self.status.observed_generation = self.tl.metadata.generation;
        if self.tl.status.as_ref() == Some(&self.status) {
            return Ok(());
        }
        let patch = serde_json::json!({
            "apiVersion": "targetlease.dev/v1alpha1",
            "kind": "TargetLease",
            "status": self.status,
        });
        self.api
            .patch_status(
                &self.tl.name_any(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await?;
        Ok(())
    }

    pub(super) async fn event(&self, type_: EventType, reason: &str, note: String) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self
            .ctx
            .recorder
            .publish(&ev, &self.tl.object_ref(&()))
            .await
        {
            tracing::debug!(error = %e, "cannot publish event");
        }
    }

    /// Wakes the other TargetLeases on the same target (they may be next in line).
    pub(super) fn wake_waiters(&self) {
        let me = self.key();
        for other in self.ctx.leases.state() {
            if other.namespace() == self.tl.namespace()
                && other.spec.target == self.tl.spec.target
                && ObjectRef::from_obj(&*other) != me
            {
                let _ = self.ctx.wake.unbounded_send(ObjectRef::from_obj(&*other));
            }
        }
    }

    /// The oldest TargetLease on the same target that is ahead of this one.
    pub(super) fn queued_behind(&self) -> Option<String> {
        let mine = (self.tl.creation_timestamp(), self.tl.name_any());
        self.ctx
            .leases
            .state()
            .into_iter()
            .filter(|o| o.namespace() == self.tl.namespace())
            .filter(|o| o.spec.target == self.tl.spec.target)
            .filter(|o| o.metadata.deletion_timestamp.is_none())
            .filter(|o| (o.creation_timestamp(), o.name_any()) < mine)
            .filter(|o| match o.status.as_ref() {
                None => true,
                Some(s) => {
                    plan::is_held(s)
                        || conditions::get(&s.conditions, conditions::HELD).is_some_and(|c| {
                            matches!(
                                c.reason.as_str(),
                                reason::ACQUIRING | reason::TARGET_HELD | reason::QUEUED
                            )
                        })
                }
            })
            .map(|o| o.name_any())
            .min()
    }

    /// The token every new acquisition must exceed.
    pub(super) async fn token_floor(&self) -> Result<u64, Error> {
        let ns = self.tl.namespace();
        let published = self
            .ctx
            .leases
            .state()
            .into_iter()
            .filter(|o| o.namespace() == ns && o.spec.target == self.tl.spec.target)
            .filter_map(|o| o.status.as_ref().and_then(|s| s.fencing_token))
            .chain(self.status.fencing_token)
            .max()
            .unwrap_or(0);
        let recorded = self
            .ctx
            .floors
            .get(ns.as_deref().unwrap_or_default(), &self.tl.spec.target)
            .await?;
        Ok(published.max(recorded))
    }

    pub(super) fn renew_due(&self, t: &Timing) -> bool {
        let renewed = self.ctx.renewed.lock().unwrap_or_else(|p| p.into_inner());
        renewed
            .get(&self.key())
            .is_none_or(|at| at.elapsed() + t.renew / 10 >= t.renew)
    }

    pub(super) fn mark_renewed(&self) {
        let mut renewed = self.ctx.renewed.lock().unwrap_or_else(|p| p.into_inner());
        renewed.insert(self.key(), Instant::now());
    }

    pub(super) fn forget_renewal(&self) {
        let mut renewed = self.ctx.renewed.lock().unwrap_or_else(|p| p.into_inner());
        renewed.remove(&self.key());
    }

    pub(super) fn next_renewal(&self, t: &Timing) -> Action {
        let renewed = self.ctx.renewed.lock().unwrap_or_else(|p| p.into_inner());
        let wait = renewed
            .get(&self.key())
            .map(|at| t.renew.saturating_sub(at.elapsed()))
            .unwrap_or(Duration::ZERO);
        Action::requeue(wait.max(Duration::from_millis(10)))
    }

    pub(super) fn holder(&self) -> Option<Holder> {
        Some(Holder {
            owner: self.status.holder.clone()?,
            lease_id: self
                .ctx
                .lease_ids
                .derive(self.status.acquisition_id.as_deref()?),
            token: self.status.fencing_token?,
        })
    }

    pub(super) fn is_election(&self) -> bool {
        self.tl.spec.candidates.is_some()
    }

    pub(super) fn publish_lease(&mut self, lease: &Lease) {
        self.status.phase = Some(Phase::Held);
        self.status.holder = Some(lease.owner.clone());
        self.status.fencing_token = Some(lease.fencing_token);
        self.status.acquired_at = time_ms(lease.acquired_at_ms);
        self.status.expires_at = time_ms(lease.expires_at_ms);
    }

    /// Publishes that the lease is not held, keeping the last token visible.
    pub(super) fn not_held(&mut self, phase: Phase, why: &str, message: &str) {
        self.status.phase = Some(phase);
        self.status.expires_at = None;
        if phase == Phase::Pending {
            self.status.holder = None;
            self.status.acquired_at = None;
        }
        self.condition(conditions::HELD, Status::False, why, message);
    }

    pub(super) async fn unmark_pod(&self) -> Result<(), Error> {
        if let (true, Some(pod)) = (self.is_election(), self.status.holder.as_deref()) {
            pods::unmark(&self.ctx.client, self.tl, pod).await?;
        }
        Ok(())
    }

    pub(super) async fn mark_pod(&self) -> Result<(), Error> {
        if let (true, Some(pod), Some(token)) = (
            self.is_election(),
            self.status.holder.as_deref(),
            self.status.fencing_token,
        ) {
            let expires = self
                .status
                .expires_at
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            pods::mark(&self.ctx.client, self.tl, pod, token, &expires).await?;
        }
        Ok(())
    }
}

pub(super) fn time_ms(ms: u64) -> Option<Time> {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| Timestamp::from_millisecond(ms).ok())
        .map(Time)
}
