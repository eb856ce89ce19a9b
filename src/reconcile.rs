//! The reconciler: finalizer -> plan -> store call -> status -> Action.
//!
//! Level-triggered: each pass reads the resource, the pod cache and the store,
//! decides with [`plan::plan`] and makes it so. Every step is safe to repeat
//! and to interrupt: acquisitions carry an id recorded in status *before* the
//! store is called, so a crash between the store call and the status write is
//! resolved by replaying that id, never by a second token.

pub mod plan;
pub mod pods;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use crate::conditions::{self, Status, reason};
use crate::crd::{Phase, TargetLease, TargetLeaseStatus};
use crate::floor::FloorStore;
use crate::lease_id::LeaseIdKey;
use crate::store::{
    AcquireRequest, Holder, Lease, LeaseStore, Outcome, ReleaseRequest, RenewRequest, Reply,
    StoreError, Target,
};
use plan::{Observed, Step};

/// Finalizer that guarantees the lease is released before the resource goes.
pub const FINALIZER: &str = "targetlease.dev/release";
/// The one field manager for status.
pub const FIELD_MANAGER: &str = "targetlease-operator";

/// Shared state of the reconciler.
pub struct Context {
    /// Kubernetes client.
    pub client: kube::Client,
    /// The lease store.
    pub store: Arc<dyn LeaseStore>,
    /// Cache of every TargetLease (for queues and token floors).
    pub leases: Store<TargetLease>,
    /// Cache of pods (for holders tied to pods and for candidates).
    pub pods: Store<Pod>,
    /// Tokens of deleted leases.
    pub floors: FloorStore,
    /// Publishes Events.
    pub recorder: Recorder,
    /// Derives lease ids from acquisition ids.
    pub lease_ids: LeaseIdKey,
    /// Wakes other TargetLeases (same target) when a lease is given back.
    pub wake: UnboundedSender<ObjectRef<TargetLease>>,
    /// When this process last renewed each lease.
    pub renewed: Mutex<HashMap<ObjectRef<TargetLease>, Instant>>,
    /// Reconcile metrics.
    pub metrics: crate::metrics::OperatorMetrics,
}

/// Why a reconcile failed; each is retried with backoff by the controller.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API failed.
    #[error("kubernetes api: {0}")]
    Kube(#[from] kube::Error),
    /// The finalizer machinery failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// The resource has no namespace (cannot happen for a namespaced kind).
    #[error("resource has no namespace")]
    NoNamespace,
}

impl Error {
    /// A bounded name for metrics and Event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kubernetes",
            Error::Finalizer(_) => "finalizer",
            Error::NoNamespace => "no_namespace",
        }
    }
}

/// How long to wait before retrying after the store failed.
const BACKEND_RETRY: Duration = Duration::from_secs(2);
/// How long to wait before looking again at corrupt state.
const CORRUPT_RETRY: Duration = Duration::from_secs(60);

/// Entry point for the controller.
pub async fn reconcile(tl: Arc<TargetLease>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_inner(tl, &ctx).await;
    ctx.metrics.reconciled(
        started.elapsed(),
        result.as_ref().err().map(Error::category),
    );
    result
}

async fn reconcile_inner(tl: Arc<TargetLease>, ctx: &Context) -> Result<Action, Error> {
    let ns = tl.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<TargetLease> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, FINALIZER, tl, |event| async {
        match event {
            Finalizer::Apply(tl) => apply(&tl, &api, ctx).await,
            Finalizer::Cleanup(tl) => cleanup(&tl, &api, ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(other.to_string()),
    })
}

/// Backoff for failed reconciles.
pub fn error_policy(_tl: Arc<TargetLease>, err: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %err, category = err.category(), "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Timing from the spec (the schema guarantees these parse; we still check).
struct Timing {
    ttl: Duration,
    renew: Duration,
    max_lifetime: Option<Duration>,
}

fn timing(tl: &TargetLease) -> Result<Timing, String> {
    Ok(Timing {
        ttl: tl.spec.lease_duration()?,
        renew: tl.spec.renew_interval()?,
        max_lifetime: tl.spec.max_lifetime()?,
    })
}

/// What one pass decided to publish, plus what to do next.
struct Pass<'a> {
    tl: &'a TargetLease,
    api: &'a Api<TargetLease>,
    ctx: &'a Context,
    status: TargetLeaseStatus,
}

impl Pass<'_> {
    fn target(&self) -> Target {
        Target::new(
            self.tl.namespace().unwrap_or_default(),
            self.tl.spec.target.clone(),
        )
    }

    fn key(&self) -> ObjectRef<TargetLease> {
        ObjectRef::from_obj(self.tl)
    }

    fn condition(&mut self, type_: &str, status: Status, reason: &str, message: &str) {
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

    fn backend_ok(&mut self) {
        self.condition(
            conditions::BACKEND_AVAILABLE,
            Status::True,
            reason::REACHABLE,
            "the lease store answered",
        );
    }

    /// Records backend trouble (an Event only when the condition flips) and backs off.
    async fn backend_failed(&mut self, err: &StoreError) -> Action {
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
        Action::requeue(BACKEND_RETRY)
    }

    /// Writes status by server-side apply, only when it changed.
    async fn publish(&mut self) -> Result<(), Error> {
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

    async fn event(&self, type_: EventType, reason: &str, note: String) {
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
    fn wake_waiters(&self) {
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
    fn queued_behind(&self) -> Option<String> {
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
    async fn token_floor(&self) -> Result<u64, Error> {
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

    fn renew_due(&self, t: &Timing) -> bool {
        let renewed = self.ctx.renewed.lock().unwrap_or_else(|p| p.into_inner());
        renewed
            .get(&self.key())
            .is_none_or(|at| at.elapsed() + t.renew / 10 >= t.renew)
    }

    fn mark_renewed(&self) {
        let mut renewed = self.ctx.renewed.lock().unwrap_or_else(|p| p.into_inner());
        renewed.insert(self.key(), Instant::now());
    }

    fn forget_renewal(&self) {
        let mut renewed = self.ctx.renewed.lock().unwrap_or_else(|p| p.into_inner());
        renewed.remove(&self.key());
    }

    fn next_renewal(&self, t: &Timing) -> Action {
        let renewed = self.ctx.renewed.lock().unwrap_or_else(|p| p.into_inner());
        let wait = renewed
            .get(&self.key())
            .map(|at| t.renew.saturating_sub(at.elapsed()))
            .unwrap_or(Duration::ZERO);
        Action::requeue(wait.max(Duration::from_millis(10)))
    }

    fn holder(&self) -> Option<Holder> {
        Some(Holder {
            owner: self.status.holder.clone()?,
            lease_id: self
                .ctx
                .lease_ids
                .derive(self.status.acquisition_id.as_deref()?),
            token: self.status.fencing_token?,
        })
    }

    fn is_election(&self) -> bool {
        self.tl.spec.candidates.is_some()
    }

    fn publish_lease(&mut self, lease: &Lease) {
        self.status.phase = Some(Phase::Held);
        self.status.holder = Some(lease.owner.clone());
        self.status.fencing_token = Some(lease.fencing_token);
        self.status.acquired_at = time_ms(lease.acquired_at_ms);
        self.status.expires_at = time_ms(lease.expires_at_ms);
    }

    /// Publishes that the lease is not held, keeping the last token visible.
    fn not_held(&mut self, phase: Phase, why: &str, message: &str) {
        self.status.phase = Some(phase);
        self.status.expires_at = None;
        if phase == Phase::Pending {
            self.status.holder = None;
            self.status.acquired_at = None;
        }
        self.condition(conditions::HELD, Status::False, why, message);
    }

    async fn unmark_pod(&self) -> Result<(), Error> {
        if let (true, Some(pod)) = (self.is_election(), self.status.holder.as_deref()) {
            pods::unmark(&self.ctx.client, self.tl, pod).await?;
        }
        Ok(())
    }

    async fn mark_pod(&self) -> Result<(), Error> {
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

    async fn acquire(&mut self, owner: String, t: &Timing) -> Result<Action, Error> {
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

    async fn on_acquire(&mut self, reply: Reply, t: &Timing) -> Result<Action, Error> {
        match (reply.outcome, reply.lease) {
            (Outcome::Acquired, Some(lease)) => {
                self.publish_lease(&lease);
                self.mark_pod().await?;
                self.condition(
                    conditions::HELD,
                    Status::True,
                    reason::ACQUIRED,
                    &format!(
                        "held by {} with fencing token {}",
                        lease.owner, lease.fencing_token
                    ),
                );
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

    async fn corrupt(&mut self, message: &str) -> Result<Action, Error> {
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

    async fn renew(&mut self, t: &Timing) -> Result<Action, Error> {
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
                self.condition(
                    conditions::HELD,
                    Status::True,
                    reason::ACQUIRED,
                    &format!(
                        "held by {} with fencing token {}",
                        lease.owner, lease.fencing_token
                    ),
                );
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
    async fn release(&mut self, why: &str, message: &str) -> Result<bool, Error> {
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

fn time_ms(ms: u64) -> Option<Time> {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| Timestamp::from_millisecond(ms).ok())
        .map(Time)
}

async fn apply(tl: &TargetLease, api: &Api<TargetLease>, ctx: &Context) -> Result<Action, Error> {
    let mut pass = Pass {
        tl,
        api,
        ctx,
        status: tl.status.clone().unwrap_or_default(),
    };
    // (no client required) parse the spec.
    let t = match timing(tl) {
        Ok(t) => t,
        Err(message) => {
            pass.status.phase = Some(Phase::Error);
            pass.condition(
                conditions::SPEC_VALID,
                Status::False,
                reason::INVALID_SPEC,
                &message,
            );
            pass.publish().await?;
            return Ok(Action::await_change());
        }
    };
    pass.condition(
        conditions::SPEC_VALID,
        Status::True,
        reason::VALID,
        "spec is valid",
    );

    // Plan and act; a release or a new attempt is followed by a fresh plan.
    for _ in 0..3 {
        let observed = Observed {
            status: &pass.status,
            desired: pods::desired_holder(tl, &ctx.pods),
            queued_behind: pass.queued_behind(),
            renew_due: pass.renew_due(&t),
        };
        match plan::plan(&observed) {
            Step::NewAttempt => {
                pass.status.acquisition_id = Some(crate::store::new_request_id());
                pass.not_held(
                    if pass.status.phase == Some(Phase::Lost) {
                        Phase::Lost
                    } else {
                        Phase::Pending
                    },
                    reason::ACQUIRING,
                    "acquiring the lease",
                );
                pass.publish().await?;
            }
            Step::Acquire { owner } => return pass.acquire(owner, &t).await,
            Step::Renew => return pass.renew(&t).await,
            Step::Idle => {
                pass.publish().await?;
                return Ok(pass.next_renewal(&t));
            }
            Step::Release { reason, message } => {
                if !pass.release(reason, &message).await? {
                    return Ok(Action::requeue(BACKEND_RETRY));
                }
            }
            Step::Wait { reason, message } => {
                pass.not_held(Phase::Pending, reason, &message);
                pass.publish().await?;
                return Ok(Action::await_change());
            }
        }
    }
    Ok(Action::requeue(Duration::ZERO))
}

async fn cleanup(tl: &TargetLease, api: &Api<TargetLease>, ctx: &Context) -> Result<Action, Error> {
    let mut pass = Pass {
        tl,
        api,
        ctx,
        status: tl.status.clone().unwrap_or_default(),
    };
    if plan::is_held(&pass.status)
        && !pass
            .release(reason::RELEASED, "the TargetLease is being deleted")
            .await?
    {
        return Ok(Action::requeue(BACKEND_RETRY));
    }
    // The last published token outlives the resource (see `floor`).
    if let Some(token) = pass.status.fencing_token {
        ctx.floors
            .raise(&tl.namespace().unwrap_or_default(), &tl.spec.target, token)
            .await?;
    }
    pass.forget_renewal();
    pass.wake_waiters();
    Ok(Action::await_change())
}
