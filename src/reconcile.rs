//! The reconciler: finalizer -> plan -> store call -> status -> Action.
//!
//! Level-triggered: each pass reads the resource, the pod cache and the store,
//! decides with [`plan::plan`] and makes it so. Every step is safe to repeat
//! and to interrupt: acquisitions carry an id recorded in status *before* the
//! store is called, so a crash between the store call and the status write is
//! resolved by replaying that id, never by a second token.

mod actions;
mod pass;
pub mod plan;
pub mod pods;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::Recorder;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::conditions::{self, Status, reason};
use crate::crd::{Phase, TargetLease};
use crate::floor::FloorStore;
use crate::lease_id::LeaseIdKey;
use crate::store::LeaseStore;
use pass::Pass;
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
    /// Consecutive store failures per lease, for backoff.
    pub failures: Mutex<HashMap<ObjectRef<TargetLease>, u32>>,
    /// Open while this replica may write.
    pub leadership: crate::leadership::Leadership,
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

/// How long to wait after an outcome the operator does not expect.
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
pub(crate) struct Timing {
    pub(crate) ttl: Duration,
    pub(crate) renew: Duration,
    pub(crate) max_lifetime: Option<Duration>,
}

fn timing(tl: &TargetLease) -> Result<Timing, String> {
    Ok(Timing {
        ttl: tl.spec.lease_duration()?,
        renew: tl.spec.renew_interval()?,
        max_lifetime: tl.spec.max_lifetime()?,
    })
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
                    return Ok(pass.retry_action());
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
        return Ok(pass.retry_action());
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
